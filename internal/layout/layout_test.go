// Package layout holds no code: its test checks the package tree itself —
// which top-level folders may hold Go packages, and that every import of
// shipped (non-test) code points down the layers of the design, and that
// broker/'s WebSockets are opened through msgconn (dial_test.go).
package layout

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/hermes-securelink/securelink/"

// topLevel are the only top-level folders that may hold Go packages: the
// design's packages, internal/, and the bench tool.
var topLevel = map[string]bool{
	"cmd": true, "proxy": true, "broker": true, "pinning": true, "relay": true,
	"internal": true, "bench": true,
}

// layers: a package may import only packages of a lower layer. A package
// not named here fails the test until it is given its place.
var layers = map[string]int{
	// Leaves: no import of another package of the project, or only of
	// these.
	"internal/atomicfile": 0, "internal/loopback": 0, "internal/sdnotify": 0,
	"internal/surface":    0,
	"internal/strictjson": 0, "internal/tlsconf": 0, "internal/policy": 0, "internal/probe": 0,
	"internal/acme/acmetest": 0, "internal/deadline": 0, "internal/memprofile": 0,
	"internal/rawsock": 0, "internal/rawsock/rawsocktest": 0, "internal/otheruid": 0,

	// Bounded reads of regular files through atomicfile.
	"internal/strictyaml": 1, "internal/trust": 1,

	"internal/metrics": 1, "broker/wire": 1, "pinning": 1, "pinning/pinningtest": 1,

	"broker/msgconn": 2, "broker/store": 2, "internal/pairing": 2,
	"internal/acme": 2,
	// config validates tls.acme with internal/acme's rules.
	"internal/config": 3,

	// The roles: the Reach broker, connector and client, and the /relay
	// bridge. Equal layers cannot import each other, so none of the broker
	// packages imports relay.
	"broker/server": 3, "broker/connector": 3, "broker/client": 3, "relay": 3,

	// The front serves the bridge and the connector's streams.
	"proxy": 4, "internal/admin": 4, "broker/internal/testenv": 4, "broker/reachtest": 4,
	// Cluster mode: the broker's shared state in JetStream (docs/cluster.md).
	"broker/cluster": 4,

	"internal/doctor": 5, "internal/testfake": 5,

	"internal/daemon": 6,

	"cmd/securelink": 7, "bench/loadgen": 7, "internal/layout": 7,
}

type pkg struct {
	imports map[string]bool // project packages imported by non-test files
}

// scan reads the import clauses of every Go file below root.
func scan(t *testing.T, root string) map[string]*pkg {
	t.Helper()
	pkgs := map[string]*pkg{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			if path != root {
				// A folder with its own go.mod is another module (a
				// measuring tool's dependencies kept out of the product's).
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		rel = filepath.ToSlash(rel)
		p := pkgs[rel]
		if p == nil {
			p = &pkg{imports: map[string]bool{}}
			pkgs[rel] = p
		}
		if strings.HasSuffix(name, "_test.go") {
			return nil // tests may import anything
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, is := range f.Imports {
			ip, _ := strconv.Unquote(is.Path.Value)
			if strings.HasPrefix(ip, module) {
				p.imports[strings.TrimPrefix(ip, module)] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", r, err)
	}
	return r
}

func TestTopLevelHoldsOnlyTheDesignsPackages(t *testing.T) {
	for rel := range scan(t, root(t)) {
		top, _, _ := strings.Cut(rel, "/")
		if rel == "." || !topLevel[top] {
			t.Errorf("Go package %s outside the design's top-level folders (cmd, proxy, broker, pinning, relay, internal, bench)", rel)
		}
	}
}

func TestImportsPointDown(t *testing.T) {
	pkgs := scan(t, root(t))
	var names []string
	for rel := range pkgs {
		names = append(names, rel)
	}
	sort.Strings(names)
	for _, rel := range names {
		from, ok := layers[rel]
		if !ok {
			t.Errorf("package %s has no layer: add it to layers in %s", rel, "internal/layout/layout_test.go")
			continue
		}
		for imp := range pkgs[rel].imports {
			to, ok := layers[imp]
			if !ok {
				continue // reported above as its own package
			}
			if to >= from {
				t.Errorf("%s (layer %d) imports %s (layer %d): imports must point down", rel, from, imp, to)
			}
		}
	}
}

// The check itself catches what it is for.
func TestImportsPointDownCatchesAnUpwardImport(t *testing.T) {
	for _, c := range []struct{ from, to string }{
		{"relay", "proxy"}, {"broker/connector", "relay"}, {"broker/client", "proxy"},
		{"internal/policy", "proxy"}, {"proxy", "internal/daemon"},
	} {
		if layers[c.to] < layers[c.from] {
			t.Errorf("layers allow %s to import %s", c.from, c.to)
		}
	}
}

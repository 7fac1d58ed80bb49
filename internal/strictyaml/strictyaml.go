// Package strictyaml loads configuration files strictly: unknown keys, wrong
// types and bad values are errors that name file:line. A typo in a security
// setting that is silently ignored is worse than a daemon that refuses to
// start, so both the front's and the broker's configuration go through here.
package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// MaxFileBytes bounds a configuration file: a larger one is not something
// anyone wrote by hand.
const MaxFileBytes = 1 << 20

// ReadFile reads a configuration file of at most MaxFileBytes. It must be a
// regular file: a FIFO or a device named as the configuration would hang
// the start or be read without end.
func ReadFile(path string) ([]byte, error) {
	data, _, err := atomicfile.ReadPrivate(path, MaxFileBytes, 0)
	return data, err
}

// Source is where a decoded configuration came from: its name and the line
// of every key, so validation errors can point at the line to fix.
type Source struct {
	Name  string
	lines map[string]int
}

// Decode decodes data into v (a pointer to a struct with yaml tags, already
// holding the defaults), refusing unknown keys. The document must be a
// mapping; an empty document leaves v unchanged.
func Decode(name string, data []byte, v any) (*Source, error) {
	src := &Source{Name: name, lines: map[string]int{}}
	docs := yaml.NewDecoder(bytes.NewReader(data))
	var root, next yaml.Node
	if err := docs.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	// yaml.v3 decodes the first document and stops: keys in a second one
	// (after a "---") would be dropped without a word, which is the silent
	// typo this package exists to refuse.
	switch err := docs.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, fmt.Errorf("%s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	default:
		return nil, fmt.Errorf("%s:%d: a second YAML document (after \"---\"): the configuration is one document", name, next.Line)
	}
	if len(root.Content) == 0 {
		return src, nil
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: the configuration must be a mapping of keys", name, doc.Line)
	}
	indexLines(doc, "", src.lines)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return nil, errors.New(formatError(name, err))
	}
	return src, nil
}

// Errorf formats an error about a dotted key, naming file:line of the key
// (or of its closest parent that was written). A nil Source names no file.
func (s *Source) Errorf(key, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if s == nil || s.Name == "" {
		return fmt.Errorf("config: %s: %s", key, msg)
	}
	for k := key; k != ""; {
		if l, ok := s.lines[k]; ok {
			return fmt.Errorf("%s:%d: %s: %s", s.Name, l, key, msg)
		}
		i := strings.LastIndexByte(k, '.')
		if i < 0 {
			break
		}
		k = k[:i]
	}
	return fmt.Errorf("%s: %s: %s", s.Name, key, msg)
}

// indexLines records the line of every mapping key by dotted path.
func indexLines(n *yaml.Node, prefix string, out map[string]int) {
	if n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		path := k.Value
		if prefix != "" {
			path = prefix + "." + k.Value
		}
		out[path] = k.Line
		indexLines(n.Content[i+1], path, out)
	}
}

var unknownField = regexp.MustCompile(`field (\S+) not found in type \S+`)

// formatError turns yaml.v3's "line N: ..." messages into "file:N: ...",
// without Go type names an operator cannot act on.
func formatError(name string, err error) string {
	var te *yaml.TypeError
	msgs := []string{err.Error()}
	if errors.As(err, &te) {
		msgs = te.Errors
	}
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		m = strings.TrimPrefix(m, "yaml: ")
		m = unknownField.ReplaceAllString(m, "unknown key $1")
		if rest, ok := strings.CutPrefix(m, "line "); ok {
			if i := strings.Index(rest, ": "); i > 0 {
				if _, err := strconv.Atoi(rest[:i]); err == nil {
					out = append(out, fmt.Sprintf("%s:%s: %s", name, rest[:i], rest[i+2:]))
					continue
				}
			}
		}
		out = append(out, name+": "+m)
	}
	return strings.Join(out, "; ")
}

package strictyaml

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

type conf struct {
	Listen string `yaml:"listen"`
	Reach  struct {
		Enabled bool `yaml:"enabled"`
	} `yaml:"reach"`
}

// Keys after a "---" belong to a second document that yaml.v3 would drop
// unread; they must be an error, not a setting silently not applied.
func TestASecondDocumentIsRefused(t *testing.T) {
	for doc, line := range map[string]string{
		"listen: \":9443\"\n---\nreach: {enabled: true}\n": "c.yaml:2:",
		"listen: \":9443\"\n---\n":                         "c.yaml:2:",
		"listen: \":9443\"\n---\nbogus_key: [\n":           "c.yaml:",
	} {
		var c conf
		_, err := Decode("c.yaml", []byte(doc), &c)
		if err == nil || !strings.HasPrefix(err.Error(), line) {
			t.Errorf("%q: got %v, want an error at %s", doc, err, line)
		}
		if c.Reach.Enabled {
			t.Errorf("%q: the second document was applied", doc)
		}
	}
	for _, doc := range []string{"---\nlisten: \":1\"\n", "listen: \":1\"\n...\n", "listen: \":1\"\n", ""} {
		var c conf
		if _, err := Decode("c.yaml", []byte(doc), &c); err != nil {
			t.Errorf("%q: one document refused: %v", doc, err)
		}
	}
}

// A FIFO named as the configuration must fail at once, not hang the start
// waiting for a writer.
func TestReadFileRefusesWhatIsNotARegularFile(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "conf.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	// Without the regular-file check the open waits for a writer and the
	// test ends at go test's -timeout.
	if _, err := ReadFile(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("FIFO read as a configuration: %v", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized configuration: %v", err)
	}
}

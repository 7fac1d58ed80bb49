package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestReadPrivate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	data, fi, err := ReadPrivate(p, 10, 0o077)
	if err != nil || string(data) != "0123456789" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("got %q, %v, %v", data, fi, err)
	}
	if _, _, err := ReadPrivate(p, 9, 0o077); err == nil || !strings.Contains(err.Error(), "larger than 9 bytes") {
		t.Fatalf("oversized file: %v", err)
	}
	if _, _, err := ReadPrivate(filepath.Join(dir, "missing"), 10, 0); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v, want os.ErrNotExist", err)
	}
	if _, _, err := ReadPrivate(dir, 10, 0); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("directory: %v", err)
	}
}

func TestReadPrivateModes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(p, []byte("x"), 0o600)
	for _, c := range []struct {
		mode, deny os.FileMode
		refused    bool
		fix        string
	}{
		{0o640, 0o077, true, "chmod 600 " + p},
		{0o640, 0o007, false, ""},
		{0o604, 0o007, true, "chmod o-rwx " + p},
		{0o644, 0o022, false, ""},
		{0o620, 0o022, true, "chmod 600 " + p},
		{0o777, 0, false, ""},
	} {
		if err := os.Chmod(p, c.mode); err != nil {
			t.Fatal(err)
		}
		_, _, err := ReadPrivate(p, 10, c.deny)
		var me *ModeError
		if c.refused != errors.As(err, &me) || (c.refused && !strings.Contains(err.Error(), c.fix)) {
			t.Fatalf("mode %04o deny %04o: %v", c.mode, c.deny, err)
		}
		if !c.refused && err != nil {
			t.Fatalf("mode %04o deny %04o: %v", c.mode, c.deny, err)
		}
	}
}

// A FIFO planted where a secret is expected must not hang the reader.
func TestReadPrivateFIFODoesNotBlock(t *testing.T) {
	p := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Skip("mkfifo:", err)
	}
	if _, _, err := ReadPrivate(p, 10, 0); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("fifo: %v", err)
	}
}

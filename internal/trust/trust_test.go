package trust

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The CA file is read bounded and only if it is a regular file: a FIFO at
// reach.ca_file must fail the start at once, an oversized file must be
// refused, and a file with no certificate named as such.
func TestBrokerRootsReadsTheCAFileBounded(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "ca.pem")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	// Without the regular-file check the open waits for a writer and the
	// test ends at go test's -timeout.
	if _, err := BrokerRoots(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("FIFO as CA file: %v", err)
	}
	big := filepath.Join(dir, "big.pem")
	if err := os.WriteFile(big, make([]byte, maxCAFile+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := BrokerRoots(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized CA file: %v", err)
	}
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := BrokerRoots(empty); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("CA file without a certificate: %v", err)
	}
}

//go:build pgoprofile

package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The profile appears only on SIGUSR1, whole, and is a gzipped pprof
// profile with samples of the work done before the signal.
func TestPGOProfileWrittenOnSIGUSR1(t *testing.T) {
	dir := t.TempDir()
	const pid = 4242 // the name only; the process is this test's
	if err := startPGOProfile(dir, pid); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "securelink-"+strconv.Itoa(pid)+".pprof")
	x := 1.0
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		for i := 0; i < 1e5; i++ {
			x = x*1.0000001 + 1e-9
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("profile written before SIGUSR1 (stat: %v)", err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	var data []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil {
			data = b
			break
		}
	}
	if data == nil {
		t.Fatalf("no profile at %s after SIGUSR1", path)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("profile is not gzipped pprof: %v", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil || len(raw) == 0 {
		t.Fatalf("profile body: %d bytes, %v", len(raw), err)
	}
	if !bytes.Contains(raw, []byte("TestPGOProfileWrittenOnSIGUSR1")) {
		t.Fatalf("profile has no sample of the test's own loop (x=%v)", x)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("profile mode: %v, %v", fi, err)
	}
}

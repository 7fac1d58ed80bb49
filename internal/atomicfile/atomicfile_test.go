package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestWriteFileReplacesAtomicallyWithMode(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "secret")
	if err := WriteFile(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if string(b) != "two" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("content %q mode %o", b, fi.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("temporary files left behind: %v", ents)
	}
}

// Readers never see a partial file: every read is one of the written values.
func TestConcurrentReadersSeeWholeFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	a, b := strings.Repeat("a", 64<<10), strings.Repeat("b", 64<<10)
	WriteFile(p, []byte(a), 0o600)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 50; i++ {
			v := a
			if i%2 == 1 {
				v = b
			}
			if err := WriteFile(p, []byte(v), 0o600); err != nil {
				t.Error(err)
			}
		}
		close(stop)
	}()
	for {
		select {
		case <-stop:
			wg.Wait()
			return
		default:
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if s := string(got); s != a && s != b {
			t.Fatalf("reader saw a partial file of %d bytes", len(got))
		}
	}
}

// Run as root (as CI does), a file written into a directory owned by another
// user takes that user as owner, so `sudo securelink ...` leaves files the
// service can read.
func TestRootWritesKeepDirectoryOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to hand files to another owner")
	}
	dir := t.TempDir()
	if err := os.Chown(dir, 4242, 4343); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "token")
	if err := WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := OwnerOf(p)
	if err != nil || o.UID != 4242 || o.GID != 4343 {
		t.Fatalf("owner %+v, %v", o, err)
	}
	sub := filepath.Join(dir, "state")
	if err := MkdirPrivate(sub); err != nil {
		t.Fatal(err)
	}
	if o, _ := OwnerOf(sub); o.UID != 4242 {
		t.Fatalf("MkdirPrivate owner %+v", o)
	}
}

// An output file root writes into a shared directory (/tmp) is never handed
// to whoever owns a file already at that path: anyone may plant one there.
// In a directory only its owner may write to, the owner gets it.
func TestRootOutputInASharedDirectoryStaysRoots(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to plant a file of another owner")
	}
	shared := t.TempDir()
	if err := os.Chmod(shared, 0o1777); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(shared, "qr.png")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 4242, 4343); err != nil { // the planted file
		t.Fatal(err)
	}
	if err := WriteOutput(p, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if o, err := OwnerOf(p); err != nil || o.UID != 0 {
		t.Fatalf("the output went to %+v (%v), not root", o, err)
	}
	private := t.TempDir()
	if err := os.Chown(private, 4242, 4343); err != nil {
		t.Fatal(err)
	}
	q := filepath.Join(private, "qr.png")
	if err := WriteOutput(q, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if o, err := OwnerOf(q); err != nil || o.UID != 4242 {
		t.Fatalf("in its owner's own directory the output went to %+v (%v)", o, err)
	}
}

func TestMkdirPrivate(t *testing.T) {
	base := t.TempDir()
	d := filepath.Join(base, "a", "state")
	if err := MkdirPrivate(d); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(d)
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("mode %o", fi.Mode().Perm())
	}
	os.Chmod(d, 0o755)
	if err := MkdirPrivate(d); err == nil || !strings.Contains(err.Error(), "chmod 700") {
		t.Fatalf("shared directory accepted: %v", err)
	}
	f := filepath.Join(base, "file")
	os.WriteFile(f, nil, 0o600)
	if err := MkdirPrivate(f); err == nil {
		t.Fatal("a file accepted as a directory")
	}
}

func TestCheckWriterRule(t *testing.T) {
	dir := t.TempDir()
	if err := CheckWriter(dir); err != nil {
		t.Fatalf("owner refused: %v", err)
	}
	if os.Geteuid() == 0 {
		os.Chown(dir, 4242, 4242)
		if err := CheckWriter(dir); err != nil {
			t.Fatalf("root refused: %v", err)
		}
	}
}

func TestLockDirSerializes(t *testing.T) {
	dir := t.TempDir()
	unlock, err := LockDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{})
	go func() {
		u, err := LockDir(dir)
		if err == nil {
			u()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("second lock acquired while the first is held")
	case <-time.After(100 * time.Millisecond):
	}
	unlock()
	<-got
}

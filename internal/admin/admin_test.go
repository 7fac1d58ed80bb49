package admin

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

func TestPeerRule(t *testing.T) {
	cases := []struct {
		uid   int
		known bool
		self  int
		want  bool
	}{
		{1000, true, 1000, true},
		{0, true, 1000, true},
		{1001, true, 1000, false},
		{1000, false, 1000, false}, // unknown credentials are refused
		{0, false, 0, false},
	}
	for _, c := range cases {
		if got := PeerAllowed(c.uid, c.known, c.self); got != c.want {
			t.Errorf("PeerAllowed(%d,%v,%d)=%v want %v", c.uid, c.known, c.self, got, c.want)
		}
	}
}

func TestSocketServesOwnerAndIsPrivate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "admin.sock")
	s, err := Listen(path, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	s.HandleJSON("GET /status", func(r *http.Request) (any, int, error) {
		return map[string]string{"state": "up"}, 0, nil
	})
	go s.Serve()
	defer s.Close()

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %o, want 0600", fi.Mode().Perm())
	}
	var out map[string]string
	if _, err := NewClient(path).Do(context.Background(), "GET", "/status", nil, &out); err != nil {
		t.Fatal(err)
	}
	if out["state"] != "up" {
		t.Fatalf("got %v", out)
	}
	// A second daemon on the same socket is refused while the first lives.
	if _, err := Listen(path, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "already") {
		t.Fatalf("second listener: %v", err)
	}
}

func TestStaleSocketReplacedAndNoDaemonError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "admin.sock")
	s, err := Listen(path, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	// Simulate a crash: close the listener but leave the file behind.
	s.ln.(*net.UnixListener).SetUnlinkOnClose(false)
	s.ln.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("socket file should remain: %v", err)
	}
	_, err = NewClient(path).Do(context.Background(), "GET", "/status", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "no securelink daemon") {
		t.Fatalf("want no-daemon error, got %v", err)
	}
	s2, err := Listen(path, zerolog.Nop())
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	s2.Close()
}

func TestNoDaemon(t *testing.T) {
	_, err := NewClient(filepath.Join(t.TempDir(), "none.sock")).Do(context.Background(), "GET", "/status", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "no securelink daemon") {
		t.Fatalf("want no-daemon error, got %v", err)
	}
}

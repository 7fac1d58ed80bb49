package store

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hermes-securelink/securelink/broker/wire"
)

func TestAddAndRemoveHost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts.json")
	id, tok, err := AddHost(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wire.ParseID(id); err != nil {
		t.Fatalf("host id %q: %v", id, err)
	}
	if len(tok) != wire.TokenLen || !wire.ValidWireToken(string(tok)) {
		t.Fatalf("token of %d chars", len(tok))
	}
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), string(tok)) {
		t.Fatal("the raw token is in the hosts file")
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	h, err := LoadHosts(path)
	if err != nil {
		t.Fatal(err)
	}
	hid, _ := wire.ParseID(id)
	if !h[hid].Equal(wire.TokenDigest(string(tok))) {
		t.Fatal("stored digest does not match the token")
	}
	id2, _, err := AddHost(path)
	if err != nil || id2 == id {
		t.Fatalf("second host %q %v", id2, err)
	}
	if err := RemoveHost(path, id); err != nil {
		t.Fatal(err)
	}
	h, _ = LoadHosts(path)
	if _, ok := h[hid]; ok || len(h) != 1 {
		t.Fatalf("after remove: %v", h)
	}
	if err := RemoveHost(path, id); err == nil {
		t.Fatal("removing an absent host succeeded")
	}
	if err := RemoveHost(path, "not-an-id"); err == nil {
		t.Fatal("removing a malformed id succeeded")
	}
	if err := RemoveHost(filepath.Join(t.TempDir(), "none.json"), id2); err == nil {
		t.Fatal("removing from a missing file succeeded")
	}
}

func TestConcurrentAddHostLosesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts.json")
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := AddHost(path); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	h, err := LoadHosts(path)
	if err != nil || len(h) != 8 {
		t.Fatalf("%d hosts, %v", len(h), err)
	}
}

func TestParseHosts(t *testing.T) {
	id := wire.NewID().String()
	d := wire.TokenDigest("t").String()
	good := `{"hosts": {"` + id + `": {"host_token_sha256": "` + d + `"}}}`
	if h, err := ParseHosts([]byte(good)); err != nil || len(h) != 1 {
		t.Fatalf("%v %v", h, err)
	}
	if h, err := ParseHosts([]byte(`{"hosts": {}}`)); err != nil || len(h) != 0 {
		t.Fatalf("empty: %v %v", h, err)
	}
	bad := map[string]string{
		"unknown key":       `{"hosts": {}, "x": 1}`,
		"unknown host key":  `{"hosts": {"` + id + `": {"host_token_sha256": "` + d + `", "token": "x"}}}`,
		"raw token":         `{"hosts": {"` + id + `": {"host_token": "secret"}}}`,
		"short id":          `{"hosts": {"abc": {"host_token_sha256": "` + d + `"}}}`,
		"padded digest":     `{"hosts": {"` + id + `": {"host_token_sha256": "` + d + `="}}}`,
		"duplicate host":    `{"hosts": {"` + id + `": {"host_token_sha256": "` + d + `"}, "` + id + `": {"host_token_sha256": "` + d + `"}}}`,
		"no hosts":          `{}`,
		"null hosts":        `{"hosts": null}`,
		"null entry":        `{"hosts": {"` + id + `": null}}`,
		"trailing":          good + ` {}`,
		"not json":          `hosts`,
		"duplicate top key": `{"hosts": {}, "hosts": {}}`,
	}
	for name, s := range bad {
		if _, err := ParseHosts([]byte(s)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestLoadHostsRefusesWritableByOthers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts.json")
	if _, _, err := AddHost(path); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o620)
	if _, err := LoadHosts(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-writable hosts file: %v", err)
	}
}

func TestHostsMarshalRoundTrip(t *testing.T) {
	h := Hosts{wire.NewID(): wire.TokenDigest("a"), wire.NewID(): wire.TokenDigest("b")}
	back, err := ParseHosts(h.Marshal())
	if err != nil || len(back) != 2 {
		t.Fatal(err)
	}
	for id, d := range h {
		if back[id] != d {
			t.Fatal("round trip differs")
		}
	}
}

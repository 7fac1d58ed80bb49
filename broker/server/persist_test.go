package server

import (
	"os"
	"strings"
	"testing"

	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

func TestRestartKeepsCredentialsAndReplays(t *testing.T) {
	e := newEnv(t, nil)
	host := e.host(0)
	route, boot, revoked := wire.NewToken(), wire.NewToken(), wire.NewToken()
	e.publishRoute(host, "durable", route)
	e.publishRoute(host, "gone", revoked)
	e.publishBootstrap(host, "pair", boot)
	c, _ := e.client(host, 0, wire.KindBootstrap, boot)
	c.Close(1000, "")
	readBinary(t, host)
	sendText(t, host, `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"gone"}`)
	readMsg(t, host)

	// Only digests reach the disk.
	data, err := os.ReadFile(e.cfg.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []wire.Secret{route, boot, revoked} {
		if strings.Contains(string(data), string(tok)) {
			t.Fatal("a raw token is in the state file")
		}
	}
	if fi, _ := os.Stat(e.cfg.StateFile); fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v", fi.Mode())
	}

	e.restart()
	host = e.host(0)
	c2, _ := e.client(host, 0, wire.KindRoute, route)
	c2.Close(1000, "")
	if code := e.refused(0, wire.KindBootstrap, boot, wire.NewID()); code != wire.CodeReplayed {
		t.Fatalf("consumed bootstrap after restart: %s", code)
	}
	if code := e.refused(0, wire.KindRoute, revoked, wire.NewID()); code != wire.CodeRevoked {
		t.Fatalf("revoked route after restart: %s", code)
	}
}

func TestReloadHostsRevokesRemovedHost(t *testing.T) {
	e := newEnv(t, nil)
	h0, h1 := e.host(0), e.host(1)
	tok := wire.NewToken()
	e.publishRoute(h0, "r", tok)
	c, _ := e.client(h0, 0, wire.KindRoute, tok)

	if err := store.RemoveHost(e.cfg.HostsFile, e.hosts[0].id.String()); err != nil {
		t.Fatal(err)
	}
	if err := e.b.ReloadHosts(); err != nil {
		t.Fatal(err)
	}
	if m := readMsg(t, h0); m != (wire.ErrorMsg{Code: wire.CodeRevoked}) {
		t.Fatalf("removed host got %#v", m)
	}
	if code, reason := expectClose(t, h0); code != wire.ClosePolicy || reason != wire.CloseReasonRevoked {
		t.Fatalf("removed host closed %d %q", code, reason)
	}
	if code, _ := expectClose(t, c); code != wire.CloseGoingAway {
		t.Fatalf("its client closed %d", code)
	}
	e.alive(h1)
	// It cannot come back, and its credentials are gone.
	p := e.dial()
	e.register(p, wire.RoleHost, e.hosts[0].id, wire.KindHost, e.hosts[0].token, wire.NewID())
	if code := expectError(t, p); code != wire.CodeUnauthorized {
		t.Fatal(code)
	}
	if code := e.refused(0, wire.KindRoute, tok, wire.NewID()); code != wire.CodeUnauthorized {
		t.Fatal(code)
	}

	// A broken hosts file keeps the old list.
	os.WriteFile(e.cfg.HostsFile, []byte("{"), 0o600)
	if err := e.b.ReloadHosts(); err == nil {
		t.Fatal("a broken hosts file was accepted")
	}
	e.alive(h1)
}

func TestNewRefusesMissingOrBadFiles(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.cfg
	cfg.HostsFile = e.dir + "/missing.json"
	if _, err := New(cfg, nopLog()); err == nil || !strings.Contains(err.Error(), "add-host") {
		t.Fatalf("missing hosts file: %v", err)
	}
	cfg = e.cfg
	cfg.StateFile = e.dir + "/bad-state.json"
	os.WriteFile(cfg.StateFile, []byte(`{"version":2}`), 0o600)
	if _, err := New(cfg, nopLog()); err == nil {
		t.Fatal("a bad state file was accepted")
	}
	cfg = e.cfg
	cfg.StateFile = e.dir + "/no/such/dir/state.json"
	if _, err := New(cfg, nopLog()); err == nil {
		t.Fatal("a state file in a missing directory was accepted")
	}
}

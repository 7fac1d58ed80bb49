package server

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
	for _, path := range []string{e.cfg.StateFile, store.JournalPath(e.cfg.StateFile)} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range []wire.Secret{route, boot, revoked} {
			if strings.Contains(string(data), string(tok)) {
				t.Fatalf("a raw token is in %s", path)
			}
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v", path, fi.Mode())
		}
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

// A publish or a consumed bootstrap appends its records to the journal; the
// state file (the snapshot) is not rewritten, so a change costs O(change).
func TestStateChangeAppendsToTheJournal(t *testing.T) {
	e := newEnv(t, nil)
	host := e.host(0)
	e.publishRoute(host, "first", wire.NewToken()) // the start's compaction is done
	jpath := store.JournalPath(e.cfg.StateFile)
	snapBefore, err := os.ReadFile(e.cfg.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	fiBefore, _ := os.Stat(e.cfg.StateFile)
	j0, _ := os.Stat(jpath)
	boot := wire.NewToken()
	e.publishBootstrap(host, "pair", boot)
	c, _ := e.client(host, 0, wire.KindBootstrap, boot)
	c.Close(1000, "")
	readBinary(t, host)
	snapAfter, _ := os.ReadFile(e.cfg.StateFile)
	fiAfter, _ := os.Stat(e.cfg.StateFile)
	if !bytes.Equal(snapBefore, snapAfter) || !os.SameFile(fiBefore, fiAfter) {
		t.Fatal("a publish and a consume rewrote the state file")
	}
	data, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	j, err := store.ParseJournal(data)
	if err != nil || j.Torn != 0 {
		t.Fatalf("journal: %v, torn %d", err, j.Torn)
	}
	// publish: put; consume: consumed + delete.
	if grown := int64(len(data)) - j0.Size(); grown <= 0 || grown > 600 {
		t.Fatalf("journal grew by %d bytes for three records", grown)
	}
	last := j.Ops[len(j.Ops)-3:]
	if last[0].Kind != store.OpPutBootstrap || last[1].Kind != store.OpConsumed || last[2].Kind != store.OpDelete ||
		last[1].Digest != wire.TokenDigest(string(boot)) {
		t.Fatalf("journal ends with %+v", last)
	}
	e.restart()
	if code := e.refused(0, wire.KindBootstrap, boot, wire.NewID()); code != wire.CodeReplayed {
		t.Fatalf("consumed bootstrap after restart: %s", code)
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

// mountTmpfs mounts a small tmpfs on a fresh directory, so tests can fill
// the state file's file system or make it read-only for real. It must be
// called before the broker is started, so the broker is closed before the
// file system is unmounted.
func mountTmpfs(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting a tmpfs to fill it or remount it read-only needs root (CI runs these as root)")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount: %v %s", err, out)
		}
	})
	return dir
}

// fillFS writes to dir until its file system is full.
func fillFS(t *testing.T, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling: %v", err)
			}
			break
		}
	}
	f.Close()
	return func() { os.Remove(path) }
}

func remount(t *testing.T, dir, mode string) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,"+mode, dir).CombinedOutput(); err != nil {
		t.Fatalf("remount %s: %v %s", mode, err, out)
	}
}

// A change the state file cannot hold is answered `unavailable` and leaves
// no trace in memory; the host stays connected, what the broker already had
// keeps working, and once the disk recovers the same requests succeed and
// survive a restart.
func TestStateWriteFailureAnswersUnavailable(t *testing.T) {
	faults := []struct {
		name    string
		breakFS func(t *testing.T, dir string, e *env, host *pipeConn) (heal func())
	}{
		{"disk full", func(t *testing.T, dir string, e *env, host *pipeConn) func() {
			free := fillFS(t, dir)
			// A journal record may still fit in the journal's last
			// allocated page: that change is on disk, and acknowledged.
			// Publish until the file system has no room for the next one.
			for i := 0; ; i++ {
				if i == 100 {
					t.Fatal("100 publishes fit on a full file system")
				}
				e.publishRouteExp(host, fmt.Sprintf("pad-%d", i), wire.NewToken(), e.clock.Now().Add(time.Hour).Unix())
				if m := readMsg(t, host); m == (wire.ErrorMsg{Code: wire.CodeUnavailable}) {
					return free
				}
			}
		}},
		{"read-only", func(t *testing.T, dir string, _ *env, _ *pipeConn) func() {
			remount(t, dir, "ro")
			return func() { remount(t, dir, "rw") }
		}},
	}
	for _, fault := range faults {
		t.Run(fault.name, func(t *testing.T) {
			dir := mountTmpfs(t)
			e := newEnv(t, func(c *Config) { c.StateFile = filepath.Join(dir, "state.json") })
			host := e.host(0)
			keep, boot, fresh := wire.NewToken(), wire.NewToken(), wire.NewToken()
			e.publishRoute(host, "keep", keep)
			e.publishBootstrap(host, "pair", boot)

			heal := fault.breakFS(t, dir, e, host)
			unavailable := wire.ErrorMsg{Code: wire.CodeUnavailable}
			e.publishRouteExp(host, "fresh", fresh, e.clock.Now().Add(time.Hour).Unix())
			expectMsg(t, host, unavailable)
			msg, _ := wire.Marshal(wire.PublishBootstrap{PairingID: "pair-2", TokenSHA256: wire.TokenDigest("other"), ExpiresAt: e.clock.Now().Unix() + 60})
			sendText(t, host, string(msg))
			expectMsg(t, host, unavailable)
			sendText(t, host, `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"keep"}`)
			expectMsg(t, host, unavailable)
			// A bootstrap match would consume: refused, and the host is
			// not told `open` (its next message answers the next frame).
			if code := e.refused(0, wire.KindBootstrap, boot, wire.NewID()); code != wire.CodeUnavailable {
				t.Fatalf("bootstrap match with a broken state file: %s", code)
			}
			e.alive(host)
			// Nothing of the refused changes stayed in memory; what was
			// there keeps working.
			if code := e.refused(0, wire.KindRoute, fresh, wire.NewID()); code != wire.CodeUnauthorized {
				t.Fatalf("route whose publish failed: %s", code)
			}
			c, _ := e.client(host, 0, wire.KindRoute, keep)
			c.Close(1000, "")
			readBinary(t, host)
			if n := e.b.Stats().Counts["state:write_failed"]; n < 4 {
				t.Fatalf("counted %d failed state writes", n)
			}
			if !strings.Contains(e.logs.String(), "cannot write the broker state file") {
				t.Fatal("the failed write was not logged")
			}

			heal()
			e.publishRouteExp(host, "fresh", fresh, e.clock.Now().Add(time.Hour).Unix())
			expectMsg(t, host, wire.Published{CredentialKind: wire.KindRoute, Label: "fresh"})
			c, _ = e.client(host, 0, wire.KindBootstrap, boot)
			c.Close(1000, "")
			readBinary(t, host)
			sendText(t, host, `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"keep"}`)
			expectMsg(t, host, wire.Revoked{CredentialID: "keep"})

			e.restart()
			host = e.host(0)
			if code := e.refused(0, wire.KindBootstrap, boot, wire.NewID()); code != wire.CodeReplayed {
				t.Fatalf("consumed bootstrap after restart: %s", code)
			}
			if code := e.refused(0, wire.KindRoute, keep, wire.NewID()); code != wire.CodeRevoked {
				t.Fatalf("revoked route after restart: %s", code)
			}
			c, _ = e.client(host, 0, wire.KindRoute, fresh)
			c.Close(1000, "")
		})
	}
}

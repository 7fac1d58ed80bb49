package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/wire"
)

func TestBrokerCLI(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	port := freePort(t)
	cfg := writeBrokerConfig(t, dir, fmt.Sprintf("listen: \"127.0.0.1:%d\"\ninsecure_plaintext: true\nlog: {level: debug, format: json}\n", port))

	hostID, token := addHost(t, cfg)
	if len(hostID) != 22 || len(token) != 43 {
		t.Fatalf("add-host printed host_id %q and a %d-character token", hostID, len(token))
	}
	hosts, _ := os.ReadFile(filepath.Join(dir, "hosts.json"))
	if strings.Contains(string(hosts), token) || !strings.Contains(string(hosts), hostID) {
		t.Fatal("hosts file must hold the host id and only the token's digest")
	}
	if fi, _ := os.Stat(filepath.Join(dir, "hosts.json")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("hosts file mode %o", fi.Mode().Perm())
	}

	cmd, _, stderr := startLineProc(t, "broker listening ", "broker", "serve", "--config", cfg)
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
	if err != nil {
		t.Fatal(err)
	}
	var health map[string]any
	json.NewDecoder(resp.Body).Decode(&health)
	resp.Body.Close()
	if health["ok"] != true || health["service"] != "hermes_reach" || health["protocol_version"] != float64(1) {
		t.Fatalf("health: %v", health)
	}

	if _, se, err := runCLI(t, "broker", "remove-host", "--config", cfg, "--", hostID); err != nil {
		t.Fatalf("remove-host: %v %s", err, se)
	}
	hosts, _ = os.ReadFile(filepath.Join(dir, "hosts.json"))
	if strings.Contains(string(hosts), hostID) {
		t.Fatal("remove-host left the host in the hosts file")
	}
	// Ids are base64url and may start with '-': the flag form always works.
	hostID, _ = addHost(t, cfg)
	if _, se, err := runCLI(t, "broker", "remove-host", "--config", cfg, "--host-id", hostID); err != nil {
		t.Fatalf("remove-host --host-id: %v %s", err, se)
	}
	if _, _, err := runCLI(t, "broker", "remove-host", "--config", cfg); err == nil {
		t.Fatal("remove-host without an id succeeded")
	}
	cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, 10*time.Second, func() string { return "no reload after SIGHUP: " + stderr.String() }, func() bool {
		return strings.Contains(stderr.String(), "hosts file reloaded")
	})
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("broker exit: %v\n%s", err, stderr.String())
	}
}

func TestBrokerServeRefusesPlaintextOffLoopback(t *testing.T) {
	dir := t.TempDir()
	cfg := writeBrokerConfig(t, dir, "listen: \":9444\"\ninsecure_plaintext: true\n")
	_, se, err := runCLI(t, "broker", "serve", "--config", cfg)
	if err == nil || !strings.Contains(se, "insecure_plaintext") {
		t.Fatalf("plaintext on a public address must be refused: %v %s", err, se)
	}
}

// The broker acknowledges a consumed bootstrap and a revoke only once they
// are on disk: `kill -9` right after them loses neither. With the state
// file's file system full (root only: a real tmpfs), the same requests are
// answered `unavailable` instead, and nothing of them survives.
func TestBrokerKill9KeepsConsumedBootstrapAndRevoke(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	stateDir := filepath.Join(dir, "state")
	os.Mkdir(stateDir, 0o700)
	var fill func() (free func())
	if os.Geteuid() == 0 {
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", stateDir).CombinedOutput(); err != nil {
			t.Fatalf("mount tmpfs: %v %s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", "-l", stateDir).Run() })
		fill = func() func() {
			f, _ := os.Create(filepath.Join(stateDir, "filler"))
			for _, err := f.Write(make([]byte, 4096)); err == nil; _, err = f.Write(make([]byte, 4096)) {
			}
			f.Close()
			return func() { os.Remove(filepath.Join(stateDir, "filler")) }
		}
	} else {
		t.Log("not root: the disk-full part is skipped (mounting a tmpfs needs root)")
	}
	port := freePort(t)
	cfg := filepath.Join(dir, "broker.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("listen: \"127.0.0.1:%d\"\ninsecure_plaintext: true\nhosts_file: %s\nstate_file: %s\n",
		port, filepath.Join(dir, "hosts.json"), filepath.Join(stateDir, "state.json"))), 0o600)
	hostID, hostToken := addHost(t, cfg)
	url := fmt.Sprintf("ws://127.0.0.1:%d/v1/connect", port)
	hid, _ := wire.ParseID(hostID)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func(reg wire.Register) (*websocket.Conn, wire.Message) {
		t.Helper()
		c, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.CloseNow() })
		reg.HostID, reg.ConnectionID = hid, wire.NewID()
		msg, _ := wire.Marshal(reg)
		if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
			t.Fatal(err)
		}
		return c, readBrokerMsg(t, ctx, c)
	}
	control := func(c *websocket.Conn, m wire.Message) wire.Message {
		t.Helper()
		msg, _ := wire.Marshal(m)
		if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
			t.Fatal(err)
		}
		return readBrokerMsg(t, ctx, c)
	}
	host := func() *websocket.Conn {
		t.Helper()
		c, m := dial(wire.Register{Role: wire.RoleHost, CredentialKind: wire.KindHost, Token: wire.Secret(hostToken)})
		if m.Type() != wire.TypeRegistered {
			t.Fatalf("host registration: %#v", m)
		}
		return c
	}
	client := func(kind wire.Kind, tok wire.Secret) wire.Message {
		t.Helper()
		_, m := dial(wire.Register{Role: wire.RoleClient, CredentialKind: kind, Token: tok})
		return m
	}

	cmd, _, stderr := startLineProc(t, "broker listening ", "broker", "serve", "--config", cfg)
	h := host()
	boot, route := wire.NewToken(), wire.NewToken()
	exp := time.Now().Add(9 * time.Minute).Unix()
	if m := control(h, wire.PublishBootstrap{PairingID: "pair", TokenSHA256: wire.TokenDigest(string(boot)), ExpiresAt: exp}); m.Type() != wire.TypePublished {
		t.Fatalf("publish bootstrap: %#v", m)
	}
	if m := control(h, wire.PublishRoute{CredentialID: "route", TokenSHA256: wire.TokenDigest(string(route)), ExpiresAt: exp, DeviceIDHash: wire.TokenDigest("d")}); m.Type() != wire.TypePublished {
		t.Fatalf("publish route: %#v", m)
	}
	if fill != nil {
		free := fill()
		// A journal record may still fit in the journal's last allocated
		// page (such a change is on disk and acknowledged): publish until
		// the file system has no room for the next one.
		for i := 0; ; i++ {
			if i == 100 {
				t.Fatal("100 publishes fit on a full file system")
			}
			m := control(h, wire.PublishRoute{CredentialID: fmt.Sprintf("pad-%d", i), TokenSHA256: wire.TokenDigest(string(wire.NewToken())), ExpiresAt: exp, DeviceIDHash: wire.TokenDigest("d")})
			if m == (wire.ErrorMsg{Code: wire.CodeUnavailable}) {
				break
			}
		}
		if m := client(wire.KindBootstrap, boot); m != (wire.ErrorMsg{Code: wire.CodeUnavailable}) {
			t.Fatalf("bootstrap with the state disk full: %#v", m)
		}
		if m := control(h, wire.Revoke{CredentialID: "route"}); m != (wire.ErrorMsg{Code: wire.CodeUnavailable}) {
			t.Fatalf("revoke with the state disk full: %#v", m)
		}
		if m := client(wire.KindRoute, route); m.Type() != wire.TypeMatched {
			t.Fatalf("route after a refused revoke: %#v", m)
		}
		readBrokerMsg(t, ctx, h) // its open
		free()
	}
	if m := client(wire.KindBootstrap, boot); m.Type() != wire.TypeMatched {
		t.Fatalf("bootstrap: %#v", m)
	}
	if m := control(h, wire.Revoke{CredentialID: "route"}); m.Type() != wire.TypeOpen {
		t.Fatalf("the bootstrap's open: %#v", m)
	}
	// The revoke closes the route's live stream (from the disk-full part):
	// its close frame (binary) may reach the host before the reply.
	if m := readBrokerTextMsg(t, ctx, h); m != (wire.Revoked{CredentialID: "route"}) {
		t.Fatalf("revoke: %#v", m)
	}
	cmd.Process.Kill() // SIGKILL: no shutdown write
	cmd.Wait()

	startLineProc(t, "broker listening ", "broker", "serve", "--config", cfg)
	host()
	if m := client(wire.KindBootstrap, boot); m != (wire.ErrorMsg{Code: wire.CodeReplayed}) {
		t.Fatalf("consumed bootstrap after kill -9: %#v\n%s", m, stderr.String())
	}
	if m := client(wire.KindRoute, route); m != (wire.ErrorMsg{Code: wire.CodeRevoked}) {
		t.Fatalf("revoked route after kill -9: %#v", m)
	}
}

// readBrokerTextMsg is readBrokerMsg past any stream frames (binary) that
// come first.
func readBrokerTextMsg(t *testing.T, ctx context.Context, c *websocket.Conn) wire.Message {
	t.Helper()
	for i := 0; i < 16; i++ {
		typ, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if typ == websocket.MessageBinary {
			continue
		}
		m, err := wire.ParseBrokerMessage(data)
		if err != nil {
			t.Fatalf("broker sent %q: %v", data, err)
		}
		return m
	}
	t.Fatal("16 stream frames and no control message")
	return nil
}

func readBrokerMsg(t *testing.T, ctx context.Context, c *websocket.Conn) wire.Message {
	t.Helper()
	typ, data, err := c.Read(ctx)
	if err != nil || typ != websocket.MessageText {
		t.Fatalf("read: %v (%v)", err, typ)
	}
	m, err := wire.ParseBrokerMessage(data)
	if err != nil {
		t.Fatalf("broker sent %q: %v", data, err)
	}
	return m
}

// `broker doctor` judges the running broker's own descriptors: fine as
// started, FAIL once its soft limit is lowered (prlimit(2) on the running
// process) to what it holds.
// The broker's collector runs at server.GCPercent unless GOGC says
// otherwise (issue 15: most of an idle socket's RSS was GC headroom).
// go_gc_gogc_percent on its /metrics is the runtime's own setting.
func TestBrokerServeSetsItsGCPercent(t *testing.T) {
	for _, tc := range []struct{ gogc, want string }{{"", strconv.Itoa(server.GCPercent)}, {"80", "80"}} {
		t.Setenv("GOGC", tc.gogc)
		dir := t.TempDir()
		os.Chmod(dir, 0o700)
		maddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		cfg := writeBrokerConfig(t, dir, fmt.Sprintf("listen: \"127.0.0.1:%d\"\ninsecure_plaintext: true\nmetrics: {listen: %q}\n", freePort(t), maddr))
		addHost(t, cfg)
		cmd, _, _ := startLineProc(t, "broker listening ", "broker", "serve", "--config", cfg)
		var got string
		eventually(t, 10*time.Second, func() string { return "go_gc_gogc_percent " + got }, func() bool {
			for _, l := range strings.Split(scrapeText(t, maddr), "\n") {
				if v, ok := strings.CutPrefix(l, "go_gc_gogc_percent "); ok {
					got = v
				}
			}
			return got != ""
		})
		if got != tc.want {
			t.Errorf("GOGC=%q: the broker runs at go_gc_gogc_percent %s, want %s", tc.gogc, got, tc.want)
		}
		cmd.Process.Kill()
		cmd.Wait()
	}
}

func TestBrokerDoctorReadsTheRunningBroker(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	port := freePort(t)
	cfg := writeBrokerConfig(t, dir, fmt.Sprintf("listen: \"127.0.0.1:%d\"\ninsecure_plaintext: true\nmax_hosts: 10\nmax_streams_per_host: 1\n", port))
	addHost(t, cfg)
	// No broker yet: a warning (exit 0), not a failure.
	if so, _, err := runCLI(t, "broker", "doctor", "--config", cfg); err != nil || !strings.Contains(so, "warn  broker process") || !strings.Contains(so, "not running") {
		t.Fatalf("doctor without a broker: %v\n%s", err, so)
	}
	cmd, _, _ := startLineProc(t, "broker listening ", "broker", "serve", "--config", cfg)
	so, se, err := runCLI(t, "broker", "doctor", "--config", cfg)
	if err != nil || !strings.Contains(so, fmt.Sprintf("pid %d listens", cmd.Process.Pid)) || !strings.Contains(so, "ok    broker fds") {
		t.Fatalf("doctor of a healthy broker: %v\n%s%s", err, so, se)
	}
	open, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var old, lim syscall.Rlimit
	if err := prlimit(cmd.Process.Pid, nil, &old); err != nil {
		t.Fatal(err)
	}
	lim = syscall.Rlimit{Cur: uint64(len(open)), Max: old.Max}
	if err := prlimit(cmd.Process.Pid, &lim, nil); err != nil {
		t.Fatal(err)
	}
	so, _, err = runCLI(t, "broker", "doctor", "--config", cfg)
	if err == nil || !strings.Contains(so, "FAIL  broker fds") || !strings.Contains(so, "LimitNOFILE") {
		t.Fatalf("doctor of a broker at its limit: %v\n%s", err, so)
	}
}

// prlimit sets (new) or reads (old) another process's RLIMIT_NOFILE.
func prlimit(pid int, new, old *syscall.Rlimit) error {
	_, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_NOFILE,
		uintptr(unsafe.Pointer(new)), uintptr(unsafe.Pointer(old)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/testfake"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/pinning"
)

// syncBuffer collects the daemon's log lines for assertions.
type syncBuffer = testfake.LogBuffer

// running is one in-process daemon on 127.0.0.1:0.
type running struct {
	cfgPath string
	ready   Ready
	reload  chan os.Signal
	logs    *syncBuffer
	admin   *admin.Client
	done    chan error
	stop    context.CancelFunc
}

func writeConfig(t *testing.T, dir, extra string) string {
	t.Helper()
	cfg := fmt.Sprintf(`listen: "127.0.0.1:0"
advertise: "127.0.0.1"
state_dir: %q
upstreams:
  relay: "http://127.0.0.1:1"
  api: "http://127.0.0.1:1"
  dashboard: "http://127.0.0.1:1"
log:
  level: debug
  format: json
%s`, filepath.Join(dir, "state"), extra)
	p := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func start(t *testing.T, cfgPath string) *running {
	t.Helper()
	return startOpts(t, cfgPath, Options{})
}

// startOpts starts a daemon with o's test knobs.
func startOpts(t *testing.T, cfgPath string, o Options) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cfgPath: cfgPath, reload: make(chan os.Signal, 1), logs: &syncBuffer{}, done: make(chan error, 1), stop: cancel}
	readyc := make(chan Ready, 1)
	go func() {
		o.ConfigFlag, o.Version, o.Stderr, o.Reload = cfgPath, "test-version", io.Discard, r.reload
		o.NewLogger = func(c *config.Config) zerolog.Logger { // at log.level, as cmd/securelink's
			lvl, err := zerolog.ParseLevel(c.Log.Level)
			if err != nil {
				t.Errorf("log.level %q: %v", c.Log.Level, err)
			}
			return zerolog.New(r.logs).Level(lvl)
		}
		o.Ready = func(rd Ready) { readyc <- rd }
		r.done <- Run(ctx, o)
	}()
	select {
	case r.ready = <-readyc:
	case err := <-r.done:
		cancel()
		t.Fatalf("daemon did not start: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatalf("daemon not ready: %s", r.logs.String())
	}
	r.admin = admin.NewClient(r.ready.AdminSocket)
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(ShutdownGrace + 5*time.Second):
			t.Error("daemon did not stop")
		}
	})
	return r
}

func eventually(t *testing.T, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func handshake(addr, pin string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pinning.DialPinned(ctx, addr, "127.0.0.1", pin)
	if err != nil {
		return err
	}
	return c.Close()
}

func TestStatusAndIdentityThroughTheAdminAPI(t *testing.T) {
	r := start(t, writeConfig(t, t.TempDir(), ""))
	ctx := context.Background()
	if err := handshake(r.ready.Addr.String(), r.ready.Pin); err != nil {
		t.Fatalf("pinned handshake with the announced pin: %v", err)
	}
	st, err := r.admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != "test-version" || st.PinSHA256 != r.ready.Pin || st.Authority != r.ready.Authority.String() {
		t.Fatalf("status %+v does not describe the daemon that announced %+v", st, r.ready)
	}
	if st.ConfigFile != r.cfgPath || st.Reach.Enabled || st.Reach.State != "stopped" {
		t.Fatalf("status: config %q reach %+v", st.ConfigFile, st.Reach)
	}
	for _, ns := range []string{"relay", "api", "dashboard"} {
		if a, ok := st.Upstreams[ns]; !ok || a.Available {
			t.Fatalf("upstream %s: %+v present=%v, want present and unavailable (nothing listens)", ns, a, ok)
		}
	}
	id, err := r.admin.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if id.PinSHA256 != r.ready.Pin || id.URL != r.ready.Authority.URL() {
		t.Fatalf("identity %+v, want pin %s at %s", id, r.ready.Pin, r.ready.Authority.URL())
	}
	if err := id.Candidate.Validate(); err != nil {
		t.Fatalf("the served candidate is not one clients accept: %v", err)
	}
}

// Without Reach the Reach routes answer 404 and say why.
func TestReachRoutesWithoutReach(t *testing.T) {
	r := start(t, writeConfig(t, t.TempDir(), ""))
	ctx := context.Background()
	if _, code, err := r.admin.Bootstrap(ctx, admin.BootstrapRequest{}); code != 404 || err == nil || !strings.Contains(err.Error(), "not enabled") {
		t.Fatalf("bootstrap without Reach: %d %v", code, err)
	}
	if _, err := r.admin.Revoke(ctx, "AAAAAAAAAAAAAAAAAAAAAA"); err == nil || !strings.Contains(err.Error(), "not enabled") {
		t.Fatalf("revoke without Reach: %v", err)
	}
}

// A reload serves a rotated identity; established trust never changes
// before it.
func TestReloadServesTheRotatedIdentity(t *testing.T) {
	r := start(t, writeConfig(t, t.TempDir(), ""))
	e, err := config.LoadEnv(r.cfgPath, false)
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := pinning.Rotate(e.IdentityConfig(r.ready.Authority))
	if err != nil {
		t.Fatal(err)
	}
	if rotated.Pin == r.ready.Pin {
		t.Fatal("rotation kept the pin")
	}
	if id, _ := r.admin.Identity(context.Background()); id.PinSHA256 != r.ready.Pin {
		t.Fatalf("identity changed before the reload: %s", id.PinSHA256)
	}
	r.reload <- syscall.SIGHUP
	eventually(t, func() string { return "rotated pin not served after reload: " + r.logs.String() }, func() bool {
		id, err := r.admin.Identity(context.Background())
		return err == nil && id.PinSHA256 == rotated.Pin && handshake(r.ready.Addr.String(), rotated.Pin) == nil
	})
	if handshake(r.ready.Addr.String(), r.ready.Pin) == nil {
		t.Fatal("the old pin is still accepted after rotation and reload")
	}
}

// A configuration that no longer loads is reported; the running one stays.
func TestReloadKeepsTheRunningConfigurationOnError(t *testing.T) {
	r := start(t, writeConfig(t, t.TempDir(), ""))
	if err := os.WriteFile(r.cfgPath, []byte("listen: \"127.0.0.1:0\"\nnot_a_key: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.reload <- syscall.SIGHUP
	eventually(t, func() string { return "no reload_failed: " + r.logs.String() }, func() bool {
		return strings.Contains(r.logs.String(), `"event":"reload_failed"`)
	})
	st, err := r.admin.Status(context.Background())
	if err != nil || st.PinSHA256 != r.ready.Pin {
		t.Fatalf("status after a failed reload: %+v %v", st, err)
	}
	if err := handshake(r.ready.Addr.String(), r.ready.Pin); err != nil {
		t.Fatalf("front after a failed reload: %v", err)
	}
}

// Cancelling the context stops the daemon cleanly and frees its socket.
func TestRunReturnsOnCancel(t *testing.T) {
	r := start(t, writeConfig(t, t.TempDir(), ""))
	r.stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
		r.done <- nil // for the cleanup
	case <-time.After(ShutdownGrace + 5*time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := net.Dial("unix", r.ready.AdminSocket); err == nil {
		t.Fatal("admin socket still answers after stop")
	}
	if _, err := r.admin.Status(context.Background()); err == nil {
		t.Fatal("status answered after stop")
	}
}

// Admin request bodies are read strictly: an unknown or repeated key is a
// 400 naming the key, before anything reaches the broker.
func TestAdminRequestsAreStrict(t *testing.T) {
	r := start(t, writeConfig(t, t.TempDir(), ""))
	ctx := context.Background()
	// Reach is off, so a body that passes decoding answers 404; one that
	// does not answers 400.
	for _, c := range []struct {
		body any
		want int
	}{
		{map[string]any{"ttl_seconds": 60}, 404},
		{map[string]any{"ttl_seconds": 60, "ttl": 1}, 400},
		{json.RawMessage(`{"ttl_seconds":60,"ttl_seconds":3600}`), 400},
	} {
		code, err := r.admin.Do(ctx, "POST", admin.PathBootstrap, c.body, nil)
		if code != c.want || err == nil {
			t.Fatalf("%v: %d %v, want %d", c.body, code, err, c.want)
		}
	}
}

// reachConfig enables Reach against a broker address where nothing
// listens: the connector runs (and retries), and the admin routes are
// served; tokenMode is the host token file's mode.
func reachConfig(t *testing.T, dir string, tokenMode os.FileMode) string {
	t.Helper()
	tok := filepath.Join(dir, "host.token")
	if err := os.WriteFile(tok, []byte("host-token-for-tests-0123456789abcdef\n"), tokenMode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tok, tokenMode); err != nil {
		t.Fatal(err)
	}
	return writeConfig(t, dir, fmt.Sprintf("reach:\n  enabled: true\n  broker_url: \"wss://127.0.0.1:1/v1/connect\"\n  host_id: %q\n  host_token_file: %q\n",
		"AAAAAAAAAAAAAAAAAAAAAA", tok))
}

// ttl_seconds is bounded in seconds: a value whose nanoseconds overflow
// (18446744074 s wraps to ~290 ms, which the connector's own check caught
// as a 502; 18446744084 s wraps to ~10.3 s, which went on to the broker)
// and a negative one are refused before anything is published; in range,
// the request goes on to the broker (here: not connected).
func TestBootstrapTTLIsBoundedBeforeConversion(t *testing.T) {
	r := start(t, reachConfig(t, t.TempDir(), 0o600))
	ctx := context.Background()
	for _, c := range []struct {
		ttl  int64
		want int
	}{
		{18446744074, 400},
		{18446744084, 400},
		{-1, 400},
		{3601, 400},
		{3600, 409},
		{0, 409},
	} {
		_, code, err := r.admin.Bootstrap(ctx, admin.BootstrapRequest{TTLSeconds: c.ttl})
		if code != c.want || err == nil {
			t.Errorf("ttl_seconds %d: %d %v, want %d", c.ttl, code, err, c.want)
		}
		if c.want == 400 && !strings.Contains(err.Error(), "ttl_seconds must be") {
			t.Errorf("ttl_seconds %d: %v does not say the bound", c.ttl, err)
		}
	}
}

// A reload applies a new log.level to the running daemon; a new log.format
// or admin.socket needs a restart, and every reload says so while the
// socket stays where it is.
func TestReloadAppliesLogLevelAndReportsRestartOnlyKeys(t *testing.T) {
	dir := t.TempDir()
	cfg := writeConfig(t, dir, "")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(b), "level: debug", "level: warn", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	r := start(t, cfg)
	if strings.Contains(r.logs.String(), `"level":"info"`) {
		t.Fatalf("info lines at log.level warn: %s", r.logs.String())
	}
	other := filepath.Join(dir, "other.sock")
	changed := strings.NewReplacer("level: debug", "level: info", "format: json", "format: console").Replace(string(b)) +
		fmt.Sprintf("admin:\n  socket: %q\n", other)
	if err := os.WriteFile(cfg, []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 2; n++ {
		r.reload <- syscall.SIGHUP
		eventually(t, func() string { return fmt.Sprintf("reload %d not logged at info: %s", n, r.logs.String()) }, func() bool {
			return strings.Count(r.logs.String(), `"event":"reloaded"`) == n
		})
		for _, key := range []string{"log.format", "admin.socket"} {
			if got := strings.Count(r.logs.String(), `"key":"`+key+`"`); got != n {
				t.Fatalf("reload %d: %s reported %d times: %s", n, key, got, r.logs.String())
			}
		}
	}
	if !strings.Contains(r.logs.String(), `"log_level":"info"`) {
		t.Fatalf("the reload does not say the level it applied: %s", r.logs.String())
	}
	if strings.Contains(r.logs.String(), `"level":"debug"`) {
		t.Fatalf("debug lines at log.level info: %s", r.logs.String())
	}
	if _, err := r.admin.Status(context.Background()); err != nil {
		t.Fatalf("the admin socket moved on reload: %v", err)
	}
	if _, err := os.Stat(other); err == nil {
		t.Fatal("a socket appeared at the new admin.socket without a restart")
	}
}

// A host token its group may read is served with a warning (a dedicated
// group is a setup files-mode keys allow too); 0600 is not warned about.
func TestGroupReadableHostTokenIsWarnedAbout(t *testing.T) {
	const warning = "members of its group can read the host token"
	r := start(t, reachConfig(t, t.TempDir(), 0o640))
	if !strings.Contains(r.logs.String(), warning) || !strings.Contains(r.logs.String(), "chmod 600") {
		t.Fatalf("a 0640 host token was not warned about: %s", r.logs.String())
	}
	r = start(t, reachConfig(t, t.TempDir(), 0o600))
	if strings.Contains(r.logs.String(), warning) {
		t.Fatalf("a 0600 host token was warned about: %s", r.logs.String())
	}
}

package doctor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/pinning"
)

// fixture is a healthy installation: upstreams up with the gate on, an
// identity for 127.0.0.1, and a daemon-like admin socket serving its pin.
type fixture struct {
	cfg      *config.Config
	stateDir string
	gate     string
	date     time.Time
	// reach is what the daemon-like socket reports for its connector.
	reach connector.Status
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureFor(t, "127.0.0.1", nil)
}

// newFixtureFor is newFixture with another advertised host, and with the
// identity file legacy (when not nil) in place before the fixture loads it.
func newFixtureFor(t *testing.T, host string, legacy []byte) *fixture {
	t.Helper()
	f := &fixture{gate: `{"auth_required": true}`}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !f.date.IsZero() {
			w.Header()["Date"] = []string{f.date.UTC().Format(http.TimeFormat)}
		}
		if r.URL.Path == "/api/health" {
			w.Write([]byte(f.gate))
			return
		}
		w.Write([]byte(`{"status":"ok"}`))
	}))
	t.Cleanup(up.Close)
	f.stateDir = filepath.Join(t.TempDir(), "state")
	c, err := config.Parse("test.yaml", []byte(fmt.Sprintf(
		"listen: 127.0.0.1:9443\nadvertise: %q\nstate_dir: %s\nupstreams:\n  relay: %s\n  api: %s\n  dashboard: %s\n",
		host, f.stateDir, up.URL, up.URL, up.URL)))
	if err != nil {
		t.Fatal(err)
	}
	f.cfg = c
	if legacy != nil {
		if err := os.MkdirAll(f.stateDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(pinning.IdentityPath(f.stateDir), legacy, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	id, err := pinning.LoadOrCreate(pinning.IdentityConfig{StateDir: f.stateDir, Authority: pinning.Authority{Host: host, Port: 9443}})
	if err != nil {
		t.Fatal(err)
	}
	f.serveAdmin(t, id.Pin)
	return f
}

func (f *fixture) serveAdmin(t *testing.T, pin string) {
	s, err := admin.Listen(f.cfg.AdminSocket(f.stateDir), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	s.HandleJSON("GET /status", func(*http.Request) (any, int, error) {
		return map[string]any{"pin_sha256": pin, "authority": "127.0.0.1:9443", "reach": f.reach}, 0, nil
	})
	go s.Serve()
	t.Cleanup(func() { s.Close() })
}

func (f *fixture) run(t *testing.T) []Result {
	t.Helper()
	return Run(context.Background(), f.cfg, nil, f.stateDir, Options{Timeout: 2 * time.Second})
}

// find returns the result of check, failing when absent.
func find(t *testing.T, rs []Result, check string) Result {
	t.Helper()
	for _, r := range rs {
		if r.Check == check {
			return r
		}
	}
	t.Fatalf("no %q check in:\n%s", check, Format(rs))
	return Result{}
}

func TestHealthyInstallationPasses(t *testing.T) {
	f := newFixture(t)
	rs := f.run(t)
	if Failed(rs) {
		t.Fatalf("healthy installation reported failures:\n%s", Format(rs))
	}
	for _, c := range []string{"config", "state_dir", "authority", "identity", "upstream relay", "upstream api", "upstream dashboard", "daemon", "reach"} {
		if r := find(t, rs, c); r.Status != OK {
			t.Errorf("%s: %v", c, r)
		}
	}
}

func TestDeadUpstream(t *testing.T) {
	f := newFixture(t)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + l.Addr().String()
	l.Close()
	f.cfg.Upstreams.API = dead
	rs := f.run(t)
	r := find(t, rs, "upstream api")
	if r.Status != Fail || !strings.Contains(r.Fix, "start the Hermes API server") || !Failed(rs) {
		t.Fatalf("dead upstream: %+v", r)
	}
}

func TestDashboardGateOff(t *testing.T) {
	for _, body := range []string{`{"auth_required": false}`, `[]`, `not json`, `{"auth_required": "true"}`} {
		f := newFixture(t)
		f.gate = body
		r := find(t, f.run(t), "upstream dashboard")
		if r.Status != Fail || !strings.Contains(r.Detail, "login gate is off") || !strings.Contains(r.Fix, "login") {
			t.Fatalf("gate body %q: %+v", body, r)
		}
	}
}

func TestClockSkew(t *testing.T) {
	f := newFixture(t)
	f.date = time.Now().Add(-2 * time.Minute)
	r := find(t, f.run(t), "clock relay")
	if r.Status != Fail || !strings.Contains(r.Fix, "synchronise clocks") {
		t.Fatalf("skew: %+v", r)
	}
}

func TestSANMismatch(t *testing.T) {
	f := newFixture(t)
	f.cfg.Advertise = "127.0.0.2"
	r := find(t, f.run(t), "identity")
	if r.Status != Fail || !strings.Contains(r.Fix, "securelink pin --rotate --yes") {
		t.Fatalf("SAN mismatch: %+v", r)
	}
}

func TestWrongKeyMode(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	certFile, keyFile := writeCertFiles(t, dir, "127.0.0.1")
	os.Chmod(keyFile, 0o644)
	f.cfg.TLS.Mode = "files"
	f.cfg.TLS.CertFile, f.cfg.TLS.KeyFile = certFile, keyFile
	r := find(t, f.run(t), "identity")
	if r.Status != Fail || !strings.Contains(r.Detail, keyFile) {
		t.Fatalf("world-readable key: %+v", r)
	}
	os.Chmod(keyFile, 0o600)
	if r := find(t, f.run(t), "identity"); r.Status != OK {
		t.Fatalf("0600 key: %+v", r)
	}
}

func TestStateDirMode(t *testing.T) {
	f := newFixture(t)
	os.Chmod(f.stateDir, 0o755)
	defer os.Chmod(f.stateDir, 0o700)
	r := find(t, f.run(t), "state_dir")
	if r.Status != Fail || !strings.Contains(r.Fix, "chmod 700") {
		t.Fatalf("state dir mode: %+v", r)
	}
}

func TestDaemonServesOtherPin(t *testing.T) {
	f := newFixture(t)
	// Rotate on disk without reloading the daemon.
	if _, err := pinning.Rotate(pinning.IdentityConfig{StateDir: f.stateDir, Authority: pinning.Authority{Host: "127.0.0.1", Port: 9443}}); err != nil {
		t.Fatal(err)
	}
	r := find(t, f.run(t), "daemon")
	if r.Status != Fail || !strings.Contains(r.Fix, "reload") {
		t.Fatalf("stale daemon: %+v", r)
	}
}

func TestNoDaemonAndBadConfig(t *testing.T) {
	dir := t.TempDir()
	c, _ := config.Parse("c.yaml", []byte("state_dir: "+dir+"\nupstreams:\n  relay: http://127.0.0.1:1\n  api: http://127.0.0.1:1\n  dashboard: http://127.0.0.1:1\n"))
	r := find(t, Run(context.Background(), c, nil, dir, Options{Timeout: time.Second}), "daemon")
	if r.Status != Fail || !strings.Contains(r.Fix, "systemctl start securelink") {
		t.Fatalf("no daemon: %+v", r)
	}
	_, err := config.Parse("c.yaml", []byte("bogus: 1\n"))
	rs := Run(context.Background(), nil, err, "", Options{})
	if !Failed(rs) || !strings.Contains(find(t, rs, "config").Detail, "c.yaml:1") {
		t.Fatalf("bad config: %s", Format(rs))
	}
}

func writeCertFiles(t *testing.T, dir, ip string) (string, string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: ip},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP(ip)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	cf, kf := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(cf, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(kf, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	return cf, kf
}

func brokerFixture(t *testing.T, f *fixture, health string) {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			w.Write([]byte(health))
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	f.cfg.Reach.Enabled = true
	f.cfg.Reach.BrokerURL = "wss://" + srv.Listener.Addr().String() + "/v1/connect"
	f.cfg.Reach.CAFile = ca
	f.cfg.Reach.HostTokenFile = filepath.Join(t.TempDir(), "host-token")
	if err := os.WriteFile(f.cfg.Reach.HostTokenFile, []byte(strings.Repeat("t", 43)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.reach = connector.Status{Enabled: true, State: "connected", Ready: true, Live: true}
}

func TestBrokerHealthy(t *testing.T) {
	f := newFixture(t)
	brokerFixture(t, f, `{"ok":true,"service":"hermes_reach","protocol_version":1,"hosts_online":0,"active_streams":0}`)
	rs := f.run(t)
	for _, c := range []string{"config", "reach connector", "reach dns", "reach tls", "reach broker"} {
		if r := find(t, rs, c); r.Status != OK {
			t.Errorf("%s: %+v", c, r)
		}
	}
}

func TestBrokerUnreachable(t *testing.T) {
	f := newFixture(t)
	brokerFixture(t, f, "")
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := l.Addr().String()
	l.Close()
	f.cfg.Reach.BrokerURL = "wss://" + dead + "/v1/connect"
	r := find(t, f.run(t), "reach broker")
	if r.Status != Fail || !strings.Contains(r.Fix, "broker runs") {
		t.Fatalf("unreachable broker: %+v", r)
	}
}

func TestBrokerUntrustedOrNotReach(t *testing.T) {
	f := newFixture(t)
	brokerFixture(t, f, `{"ok":true}`)
	r := find(t, f.run(t), "reach broker")
	if r.Status != Fail || !strings.Contains(r.Detail, "not a Reach v1 broker") {
		t.Fatalf("non-Reach health: %+v", r)
	}
	f.cfg.Reach.CAFile = ""
	r = find(t, f.run(t), "reach tls")
	if r.Status != Fail || !strings.Contains(r.Fix, "reach.ca_file") {
		t.Fatalf("untrusted broker: %+v", r)
	}
}

// doctor reads the secrets serve refuses to start without, with serve's
// rules: a setup doctor passes must not be one serve refuses.
func TestDoctorReadsTheSecretsServeNeeds(t *testing.T) {
	f := newFixture(t)
	brokerFixture(t, f, `{"ok":true,"service":"hermes_reach","protocol_version":1}`)
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := strings.Repeat("s", 43)
	for name, c := range map[string]struct {
		token, proxySecret, want string
	}{
		"missing token":         {filepath.Join(dir, "nosuch"), "", "reach.host_token_file"},
		"token others can read": {write("loose", good, 0o604), "", "reach.host_token_file"},
		"short token":           {write("short", "abc", 0o600), "", "the token must be 32..512 characters"},
		"empty token":           {write("empty", "\n", 0o600), "", "reach.host_token_file"},
		"proxy secret loose":    {write("tok", good, 0o600), write("proxy", good, 0o644), "relay.proxy_secret_file"},
	} {
		f.cfg.Reach.HostTokenFile, f.cfg.Relay.ProxySecretFile = c.token, c.proxySecret
		r := find(t, f.run(t), "config")
		if r.Status != Fail || !strings.Contains(r.Detail, c.want) || strings.Contains(r.Detail, good) {
			t.Errorf("%s: %+v", name, r)
		}
	}
	f.cfg.Reach.HostTokenFile, f.cfg.Relay.ProxySecretFile = write("tok2", good+"\n", 0o600), write("proxy2", good, 0o600)
	if r := find(t, f.run(t), "config"); r.Status != OK {
		t.Fatalf("good secrets: %+v", r)
	}
	// A token its group may read: serve runs with it and warns; so does doctor.
	f.cfg.Reach.HostTokenFile = write("tok3", good, 0o640)
	var warned bool
	for _, r := range f.run(t) {
		warned = warned || r.Check == "config" && r.Status == Warn && strings.Contains(r.Detail, "members of its group")
	}
	if !warned {
		t.Fatal("doctor did not warn about a group-readable host token")
	}
}

// The broker answering is not the host being registered: a host the broker
// refuses waits ten minutes per attempt while every broker check passes.
func TestDoctorReportsTheConnectorState(t *testing.T) {
	f := newFixture(t)
	brokerFixture(t, f, `{"ok":true,"service":"hermes_reach","protocol_version":1}`)
	for _, c := range []struct {
		st   connector.Status
		want Status
		text string
	}{
		{connector.Status{Enabled: true, State: "backoff", Live: true, LastError: "unauthorized", PermanentError: "unauthorized"}, Fail, "refuses this host: unauthorized"},
		{connector.Status{Enabled: true, State: "backoff", Live: true, LastError: "tls"}, Warn, "last error tls"},
		{connector.Status{}, Warn, "does not run Reach"},
		{connector.Status{Enabled: true, State: "connected", Ready: true, Live: true}, OK, "registered"},
	} {
		f.reach = c.st
		rs := f.run(t)
		r := find(t, rs, "reach connector")
		if r.Status != c.want || !strings.Contains(r.Detail, c.text) {
			t.Errorf("%+v: got %+v", c.st, r)
		}
		if c.want == Fail && !Failed(rs) {
			t.Errorf("%+v: doctor did not fail", c.st)
		}
	}
}

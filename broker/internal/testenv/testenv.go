// Package testenv is the test assembly the broker packages share: a test CA,
// a real broker serving wss:// on 127.0.0.1, a fake Relay, and log capture.
// It is imported only by tests (client, connector, reachtest); it lives in
// a normal package so those packages need not each keep a copy.
package testenv

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// Step bounds every single wait, so a broken component fails a test instead
// of hanging it. It is never an assertion about speed.
const Step = 10 * time.Second

// WaitFor polls cond until it holds or Step passes.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Step)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Logs

// LogSink keeps log lines so tests can check that no secret was logged, and
// mirrors them to the test log in -v runs until the test ends (a late
// background line must not panic the binary).
type LogSink struct {
	t    testing.TB
	mu   sync.Mutex
	buf  bytes.Buffer
	done bool
}

// NewLog returns a debug-level logger writing to a new LogSink.
func NewLog(t testing.TB) (zerolog.Logger, *LogSink) {
	s := &LogSink{t: t}
	t.Cleanup(func() {
		s.mu.Lock()
		s.done = true
		s.mu.Unlock()
	})
	return zerolog.New(s).Level(zerolog.DebugLevel), s
}

func (l *LogSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf.Len() < 8<<20 {
		l.buf.Write(p)
	}
	if !l.done && testing.Verbose() {
		l.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// String is everything logged so far (up to 8 MiB).
func (l *LogSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// ---------------------------------------------------------------------------
// Test CA

// WriteCert creates a self-signed certificate for 127.0.0.1 in dir and
// returns its files and a pool trusting it (the test CA).
func WriteCert(t testing.TB, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "reach test broker"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// ---------------------------------------------------------------------------
// Broker

// BrokerOptions adjusts StartBroker.
type BrokerOptions struct {
	// Hosts is how many hosts the hosts file lists (0 means 1).
	Hosts int
	// Mutate changes the configuration after the test defaults.
	Mutate func(*server.Config)
	// Plaintext makes the broker serve ws:// (insecure_plaintext on
	// 127.0.0.1) so Listen can terminate TLS itself, with Cert.
	Plaintext bool
	// Listen, when set, wraps every new raw listener before the broker
	// serves on it.
	Listen func(b *Broker, raw net.Listener) net.Listener
}

// Host is one entry of the broker's hosts file.
type Host struct {
	ID    string
	Token wire.Secret
}

// Broker is a real broker serving on 127.0.0.1 with the test CA.
type Broker struct {
	t      testing.TB
	Cfg    server.Config
	Cert   tls.Certificate // the broker's certificate, trusted by Pool
	Pool   *x509.CertPool
	Addr   string // fixed by the first Start, reused by later ones
	Hosts  []Host
	B      *server.Broker // the running broker (the latest Start)
	Logs   *LogSink       // the running broker's log
	listen func(*Broker, net.Listener) net.Listener
	cancel context.CancelFunc
	done   chan error
}

// StartBroker starts a broker that stops when the test ends.
func StartBroker(t testing.TB, o BrokerOptions) *Broker {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile, pool := WriteCert(t, dir)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.TLSCertFile, cfg.TLSKeyFile = certFile, keyFile
	cfg.HostsFile = filepath.Join(dir, "hosts.json")
	cfg.StateFile = filepath.Join(dir, "state.json")
	cfg.AttemptsPerMinute = 100000
	cfg.ShutdownGrace = 2 * time.Second
	if o.Plaintext {
		cfg.InsecurePlaintext = true
		cfg.TLSCertFile, cfg.TLSKeyFile = "", ""
	}
	if o.Mutate != nil {
		o.Mutate(&cfg)
	}
	tb := &Broker{t: t, Cfg: cfg, Cert: cert, Pool: pool, Addr: "127.0.0.1:0", listen: o.Listen}
	for range max(o.Hosts, 1) {
		id, tok, err := store.AddHost(cfg.HostsFile)
		if err != nil {
			t.Fatal(err)
		}
		tb.Hosts = append(tb.Hosts, Host{ID: id, Token: tok})
	}
	tb.Start()
	t.Cleanup(tb.Stop)
	return tb
}

// Start serves on Addr: a new port the first time, the same one after Stop
// or Halt.
func (tb *Broker) Start() {
	t := tb.t
	t.Helper()
	raw, err := net.Listen("tcp", tb.Addr)
	if err != nil {
		t.Fatal(err)
	}
	tb.Addr = raw.Addr().String()
	var ln net.Listener = raw
	if tb.listen != nil {
		ln = tb.listen(tb, raw)
	}
	lg, sink := NewLog(t)
	tb.Logs = sink
	b, err := server.New(tb.Cfg, lg) // debug: secret checks cover every line
	if err != nil {
		raw.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb.B, tb.cancel, tb.done = b, cancel, make(chan error, 1)
	go func() { tb.done <- b.ServeListener(ctx, ln) }()
}

// Halt stops the running broker and returns what ServeListener returned.
// It is a no-op after the broker already stopped.
func (tb *Broker) Halt() error {
	if tb.cancel == nil {
		return nil
	}
	tb.cancel()
	tb.cancel = nil
	select {
	case err := <-tb.done:
		return err
	case <-time.After(2 * Step):
		return errors.New("the broker did not stop")
	}
}

// Stop shuts the broker down gracefully and fails the test on an error.
func (tb *Broker) Stop() {
	if err := tb.Halt(); err != nil {
		tb.t.Errorf("broker: %v", err)
	}
}

// URL is the broker's connect URL.
func (tb *Broker) URL() string { return "wss://" + tb.Addr + wire.ConnectPath }

// HTTPClient trusts the test CA.
func (tb *Broker) HTTPClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tb.Pool}},
		Timeout:   Step,
	}
}

// ---------------------------------------------------------------------------
// Relay

// FakeRelay speaks the Relay's first-frame authentication: the client's
// first message is its auth frame, the answer an auth.ok carrying the
// session token the client presented or a new random one (with members a
// re-encoder would change: non-ASCII, float exponents), then it echoes.
type FakeRelay struct {
	Srv      *httptest.Server
	Upgrades atomic.Int64 // WebSocket sessions
	Frames   atomic.Int64 // client messages that reached it

	mu       sync.Mutex
	auths    [][]byte // the first frame of each session
	sessions []string // the session tokens handed out
	authOKs  [][]byte // every auth.ok, byte for byte
}

// NewFakeRelay starts a fake Relay on 127.0.0.1.
func NewFakeRelay(t testing.TB) *FakeRelay {
	f := &FakeRelay{}
	f.Srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			io.WriteString(w, `{"ok":true}`)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		f.Upgrades.Add(1)
		c.SetReadLimit(4 << 20)
		ctx := r.Context()
		_, first, err := c.Read(ctx)
		if err != nil {
			return
		}
		f.Frames.Add(1)
		var auth struct {
			Payload struct {
				SessionToken string `json:"session_token"`
			} `json:"payload"`
		}
		json.Unmarshal(first, &auth)
		sess := auth.Payload.SessionToken
		if sess == "" {
			sess = RandomSecret("relay-session-") + "-\u00e9"
		}
		sessJSON, _ := json.Marshal(sess)
		ok := []byte(`{"channel":"system","type":"auth.ok","id":"1","payload":{"session_token":` + string(sessJSON) +
			`,"server_version":"0.9.1","profiles":[{"name":"caf\u00e9"}],"expires_at":null,` +
			`"grants":{"chat":1.5e9},"transport_hint":"wss"}}`)
		f.mu.Lock()
		if len(f.auths) < 100 {
			f.auths = append(f.auths, first)
			f.sessions = append(f.sessions, sess)
			f.authOKs = append(f.authOKs, ok)
		}
		f.mu.Unlock()
		if c.Write(ctx, websocket.MessageText, ok) != nil {
			return
		}
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			f.Frames.Add(1)
			if c.Write(ctx, typ, msg) != nil {
				return
			}
		}
	}))
	t.Cleanup(f.Srv.Close)
	return f
}

// Auths returns the first frame of each session (up to 100).
func (f *FakeRelay) Auths() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.auths...)
}

// LastAuthOK is the latest auth.ok the Relay sent, byte for byte.
func (f *FakeRelay) LastAuthOK() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.authOKs) == 0 {
		return nil
	}
	return f.authOKs[len(f.authOKs)-1]
}

// RandomSecret returns a fresh random marker that cannot occur by chance,
// for tests that search logs and captures for secrets.
func RandomSecret(prefix string) string {
	b := make([]byte, 16)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

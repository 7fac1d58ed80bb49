package main

// Scaffolding shared by the tests that drive the real binary as an operator
// would: build it once, write configurations, start `serve`, `broker serve`
// and `connect` as subprocesses and wait for what they print.

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/pairing"
	"github.com/hermes-securelink/securelink/internal/testfake"
	"github.com/hermes-securelink/securelink/pinning"
)

var binPath string

// TestMain builds the real binary once: these tests drive it as an operator
// would, as a subprocess with a config file, curl and signals.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "securelink-e2e-")
	if err != nil {
		panic(err)
	}
	binPath = filepath.Join(dir, "securelink")
	out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// writeConfig writes a front configuration on a fixed free port (`pin`,
// which runs without the daemon, derives the authority's port from it) with
// the API and Dashboard upstreams pointing at nothing.
func writeConfig(t *testing.T, dir, relayURL string) string {
	t.Helper()
	cfg := fmt.Sprintf(`listen: "127.0.0.1:%d"
advertise: "127.0.0.1"
state_dir: %q
upstreams:
  relay: %q
  api: "http://127.0.0.1:1"
  dashboard: "http://127.0.0.1:1"
log:
  level: debug
  format: json
`, freePort(t), filepath.Join(dir, "state"), relayURL)
	p := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// appendConfig adds top-level sections to a configuration file.
func appendConfig(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

// writeBrokerConfig writes a broker configuration with settings plus a
// hosts file and a state file in dir.
func writeBrokerConfig(t *testing.T, dir, settings string) string {
	t.Helper()
	p := filepath.Join(dir, "broker.yaml")
	cfg := fmt.Sprintf("%shosts_file: %s\nstate_file: %s\n", settings, filepath.Join(dir, "hosts.json"), filepath.Join(dir, "state.json"))
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// addHost runs `broker add-host --json` and returns what it printed.
func addHost(t *testing.T, brokerCfg string) (hostID, token string) {
	t.Helper()
	so, se, err := runCLI(t, "broker", "add-host", "--config", brokerCfg, "--json")
	if err != nil {
		t.Fatalf("add-host: %v %s", err, se)
	}
	var host struct {
		HostID string `json:"host_id"`
		Token  string `json:"host_token"`
	}
	if err := json.Unmarshal([]byte(so), &host); err != nil {
		t.Fatalf("add-host output %q: %v", so, err)
	}
	return host.HostID, host.Token
}

// brokerCert writes a self-signed certificate for 127.0.0.1 (it is its own CA).
func brokerCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "test broker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "broker.crt"), filepath.Join(dir, "broker.key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile
}

// newHermesHome makes a $HERMES_HOME under dir holding the Relay's QR secret.
func newHermesHome(t *testing.T, dir string, secret []byte) string {
	t.Helper()
	home := filepath.Join(dir, "hermes")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, pairing.QRSecretFileName), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	return home
}

// syncWriter lets the test read a subprocess's stderr while it is written.
type syncWriter = testfake.LogBuffer

func runCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	return runCLIEnv(t, nil, args...)
}

// runCLIEnv runs the binary to completion with env added to the test's own.
func runCLIEnv(t *testing.T, env []string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	return so.String(), se.String(), err
}

// startLineProc starts the binary and waits for its first stdout line,
// which must start with prefix. Later stdout is drained so the process
// never blocks on a full pipe; it is killed at cleanup unless the test
// already waited for it.
func startLineProc(t *testing.T, prefix string, args ...string) (*exec.Cmd, string, *syncWriter) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	stderr := &syncWriter{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case line <- sc.Text():
			default:
			}
		}
	}()
	select {
	case l := <-line:
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("%v: first line %q; stderr: %s", args, l, stderr.String())
		}
		return cmd, l, stderr
	case <-time.After(20 * time.Second):
		t.Fatalf("%v did not start: %s", args, stderr.String())
	}
	return nil, "", nil
}

type daemonProc struct {
	cmd    *exec.Cmd
	addr   string
	pin    string
	stderr *syncWriter
}

var listeningLine = regexp.MustCompile(`^listening (\S+) authority (\S+) pin (\S+)$`)

func startDaemon(t *testing.T, cfgPath string) *daemonProc {
	t.Helper()
	cmd, l, stderr := startLineProc(t, "listening ", "serve", "--config", cfgPath)
	m := listeningLine.FindStringSubmatch(l)
	if m == nil {
		t.Fatalf("unexpected first line %q; stderr: %s", l, stderr.String())
	}
	return &daemonProc{cmd: cmd, addr: m[1], pin: m[3], stderr: stderr}
}

// configuredPin is the pin `pin --json` reports for the identity on disk.
func configuredPin(t *testing.T, cfgPath string) string {
	t.Helper()
	so, se, err := runCLI(t, "pin", "--json", "--config", cfgPath)
	if err != nil {
		t.Fatalf("pin --json: %v %s", err, se)
	}
	var pj struct {
		Pin string `json:"pin_sha256"`
	}
	if err := json.Unmarshal([]byte(so), &pj); err != nil || pj.Pin == "" {
		t.Fatalf("pin --json output %q: %v", so, err)
	}
	return pj.Pin
}

// eventually polls cond until it holds, failing with what after timeout.
func eventually(t *testing.T, timeout time.Duration, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// echoRelay is the fake Relay (internal/testfake) without the first-frame
// protocol: /health answers, /ws echoes every message from the first, as
// the clients' own stacks in these tests expect. Its base URL.
func echoRelay(t *testing.T) string {
	return testfake.NewRelay(t, func(r *testfake.Relay) { r.NoAuth = true }).URL.String()
}

// pinnedGet fetches url over TLS verified exactly as the Hermes clients do.
func pinnedGet(t *testing.T, addr, pin, path string) (*http.Response, error) {
	t.Helper()
	cfg, err := pinning.PinnedTLSConfig("127.0.0.1", pin)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return c.Get("https://" + addr + path)
}

func scrapeText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

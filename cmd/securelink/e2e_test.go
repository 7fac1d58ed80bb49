package main

import (
	"bufio"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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

type daemonProc struct {
	cmd    *exec.Cmd
	addr   string
	pin    string
	stderr *syncWriter
}

func writeConfig(t *testing.T, dir, relayURL string) string {
	t.Helper()
	// A fixed free port, because `pin` (which runs without the daemon)
	// derives the authority's port from the configuration.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
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
`, port, filepath.Join(dir, "state"), relayURL)
	p := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

var listeningLine = regexp.MustCompile(`^listening (\S+) authority (\S+) pin (\S+)$`)

func startDaemon(t *testing.T, cfgPath string) *daemonProc {
	t.Helper()
	cmd := exec.Command(binPath, "serve", "--config", cfgPath)
	stderr := &syncWriter{b: &strings.Builder{}}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{cmd: cmd, stderr: stderr}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	select {
	case l := <-lines:
		m := listeningLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("unexpected first line %q; stderr: %s", l, stderr.String())
		}
		d.addr, d.pin = m[1], m[3]
	case <-time.After(20 * time.Second):
		t.Fatalf("daemon did not come up; stderr: %s", stderr.String())
	}
	return d
}

// syncWriter lets the test read the daemon's stderr while it is written.
type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func runCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	return so.String(), se.String(), err
}

func fakeRelay(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			w.Write([]byte(`{"status":"ok"}`))
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
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

func TestServeZeroConfigPinAndCurl(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is required (scripts/ensure-test-deps.sh installs it)")
	}
	dir := t.TempDir()
	relaySrv := fakeRelay(t)
	cfgPath := writeConfig(t, dir, relaySrv.URL)
	d := startDaemon(t, cfgPath)

	// `pin --json` reports the identity the daemon serves.
	so, se, err := runCLI(t, "pin", "--json", "--config", cfgPath)
	if err != nil {
		t.Fatalf("pin --json: %v\n%s", err, se)
	}
	if !strings.Contains(se, "config "+cfgPath) || !strings.Contains(se, "state directory "+filepath.Join(dir, "state")) {
		t.Fatalf("pin must print the config file and state dir it used; stderr: %s", se)
	}
	var pj struct {
		Authority string `json:"authority"`
		Pin       string `json:"pin_sha256"`
		CertDER   string `json:"cert_der"`
		CertSHA   string `json:"cert_sha256"`
		NotAfter  string `json:"not_after"`
		SANs      []string
		Candidate map[string]any `json:"candidate"`
	}
	if err := json.Unmarshal([]byte(so), &pj); err != nil {
		t.Fatalf("pin --json output: %v\n%s", err, so)
	}
	if pj.Pin != d.pin {
		t.Fatalf("pin --json %s != served %s", pj.Pin, d.pin)
	}
	if pj.Candidate["role"] != "plugin_proxy" || len(pj.SANs) != 1 || pj.SANs[0] != "127.0.0.1" {
		t.Fatalf("unexpected pin output: %+v", pj)
	}
	der, err := base64.StdEncoding.DecodeString(pj.CertDER)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	if "sha256/"+base64.StdEncoding.EncodeToString(sum[:]) != d.pin {
		t.Fatal("cert_der does not carry the pinned key")
	}
	certPEM := filepath.Join(dir, "cert.pem")
	os.WriteFile(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)

	// curl, as an operator would check it.
	curlPin := "sha256//" + strings.TrimPrefix(d.pin, "sha256/")
	out, err := exec.Command("curl", "-sS", "--max-time", "10", "--cacert", certPEM, "--pinnedpubkey", curlPin,
		"https://"+d.addr+"/relay/health").CombinedOutput()
	if err != nil {
		t.Fatalf("curl: %v\n%s\ndaemon: %s", err, out, d.stderr.String())
	}
	var health struct {
		Status   string `json:"status"`
		Surface  string `json:"surface"`
		Services map[string]struct {
			Available bool `json:"available"`
		} `json:"services"`
	}
	if err := json.Unmarshal(out, &health); err != nil {
		t.Fatalf("health body: %v: %s", err, out)
	}
	if health.Status != "ok" || health.Surface != "hermes_secure_proxy" || !health.Services["relay"].Available || health.Services["api"].Available {
		t.Fatalf("unexpected health: %s", out)
	}
	// A wrong pin makes curl refuse before any request is sent.
	wrong := "sha256//" + base64.StdEncoding.EncodeToString(make([]byte, 32))
	if out, err := exec.Command("curl", "-sS", "--max-time", "10", "--cacert", certPEM, "--pinnedpubkey", wrong,
		"https://"+d.addr+"/relay/health").CombinedOutput(); err == nil {
		t.Fatalf("curl accepted a wrong pin: %s", out)
	}

	// status over the admin socket reports the same pin.
	so, se, err = runCLI(t, "status", "--json", "--config", cfgPath)
	if err != nil {
		t.Fatalf("status: %v %s", err, se)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(so), &st); err != nil || st["pin_sha256"] != d.pin {
		t.Fatalf("status: %v %s", err, so)
	}

	// pin --remote sees what the daemon presents; --expect enforces it.
	if so, se, err := runCLI(t, "pin", "--remote", "https://"+d.addr, "--expect", d.pin); err != nil || !strings.Contains(so, d.pin) {
		t.Fatalf("pin --remote: %v %s %s", err, so, se)
	}
	if _, se, err := runCLI(t, "pin", "--remote", "https://"+d.addr, "--expect", "sha256/"+base64.StdEncoding.EncodeToString(make([]byte, 32))); err == nil || !strings.Contains(se, "mismatch") {
		t.Fatalf("pin --remote --expect wrong pin must fail: %v %s", err, se)
	}

	// SIGTERM: exit 0.
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, d.stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("daemon did not stop within the grace period")
	}
}

func TestRotateAndSIGHUP(t *testing.T) {
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, fakeRelay(t).URL)
	d := startDaemon(t, cfgPath)
	oldPin := d.pin

	// Without --yes nothing changes.
	so, _, err := runCLI(t, "pin", "--rotate", "--config", cfgPath)
	if err != nil || !strings.Contains(so, "--yes") {
		t.Fatalf("pin --rotate without --yes: %v %s", err, so)
	}
	resp, err := pinnedGet(t, d.addr, oldPin, "/relay/health")
	if err != nil {
		t.Fatalf("old pin must still work before rotation: %v", err)
	}
	resp.Body.Close()

	_, se, err := runCLI(t, "pin", "--rotate", "--yes", "--config", cfgPath)
	if err != nil || !strings.Contains(se, "re-pair") || !strings.Contains(se, "securelink pair") {
		t.Fatalf("rotate: %v %s", err, se)
	}
	so, _, _ = runCLI(t, "pin", "--json", "--config", cfgPath)
	var pj struct {
		Pin string `json:"pin_sha256"`
	}
	json.Unmarshal([]byte(so), &pj)
	if pj.Pin == "" || pj.Pin == oldPin {
		t.Fatalf("rotation did not change the pin: %q", pj.Pin)
	}
	// Until reload the daemon keeps serving the old identity: trust never
	// changes behind the operator's back.
	if _, err := pinnedGet(t, d.addr, oldPin, "/relay/health"); err != nil {
		t.Fatalf("before SIGHUP the old identity must be served: %v", err)
	}
	d.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := pinnedGet(t, d.addr, pj.Pin, "/relay/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new pin not served after SIGHUP: %v\n%s", err, d.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := pinnedGet(t, d.addr, oldPin, "/relay/health"); err == nil {
		t.Fatal("old pin still accepted after rotation + reload")
	}
}

func TestServeRefusesUnsupportedAndBadConfig(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c.yaml")
	os.WriteFile(p, []byte("state_dir: "+filepath.Join(dir, "s")+"\nhttp3: true\n"), 0o600)
	_, se, err := runCLI(t, "serve", "--config", p)
	if err == nil || !strings.Contains(se, "not supported yet") || !strings.Contains(se, p+":2") {
		t.Fatalf("want not-supported error naming file:line, got %v %s", err, se)
	}
	os.WriteFile(p, []byte("state_dir: "+filepath.Join(dir, "s")+"\nlisten: \":9443\"\nupstream:\n  api: x\n"), 0o600)
	_, se, err = runCLI(t, "serve", "--config", p)
	if err == nil || !strings.Contains(se, p+":3") {
		t.Fatalf("want unknown-key error naming file:line, got %v %s", err, se)
	}
}

func TestStatusWithoutDaemon(t *testing.T) {
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, "http://127.0.0.1:1")
	_, se, err := runCLI(t, "status", "--config", cfgPath)
	if err == nil || !strings.Contains(se, "no securelink daemon") {
		t.Fatalf("status without daemon: %v %s", err, se)
	}
}

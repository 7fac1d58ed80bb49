package main

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/admin"
)

func TestServeZeroConfigPinAndCurl(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is required (scripts/ensure-test-deps.sh installs it)")
	}
	dir := t.TempDir()
	relaySrv := echoRelay(t)
	cfgPath := writeConfig(t, dir, relaySrv)
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
		StateDir  string         `json:"state_dir"`
		Candidate map[string]any `json:"candidate"`
	}
	if err := json.Unmarshal([]byte(so), &pj); err != nil {
		t.Fatalf("pin --json output: %v\n%s", err, so)
	}
	// operations.md: the keys `pin --json` prints at least.
	requireKeys(t, "pin --json", []byte(so), "authority", "url", "pin_sha256", "cert_sha256", "cert_der", "not_after", "sans", "state_dir", "candidate")
	if pj.Authority != d.addr || pj.StateDir != filepath.Join(dir, "state") || len(pj.CertSHA) != 64 {
		t.Fatalf("pin --json: authority %q, state_dir %q, cert_sha256 %q", pj.Authority, pj.StateDir, pj.CertSHA)
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
	// operations.md: GET /status and GET /identity carry these keys (the
	// reach block's last_error and connected_since only once they are set).
	requireKeys(t, "status", []byte(so), "version", "started_at", "config_file", "state_dir", "authority", "pin_sha256", "identity_changed_at", "upstreams", "reach")
	stJSON, _ := json.Marshal(st["upstreams"])
	requireKeys(t, "status upstreams", stJSON, "relay", "api", "dashboard")
	stJSON, _ = json.Marshal(st["reach"])
	requireKeys(t, "status reach", stJSON, "enabled", "state", "broker_url", "host_id", "active_streams", "completed_streams", "attempts", "last_error", "connected_since")
	var ident json.RawMessage
	if _, err := admin.NewClient(filepath.Join(dir, "state", "admin.sock")).Do(context.Background(), http.MethodGet, "/identity", nil, &ident); err != nil {
		t.Fatalf("GET /identity: %v", err)
	}
	requireKeys(t, "identity", ident, "authority", "url", "pin_sha256", "cert_der", "candidate")

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
	cfgPath := writeConfig(t, dir, echoRelay(t))
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
	newPin := configuredPin(t, cfgPath)
	if newPin == oldPin {
		t.Fatalf("rotation did not change the pin: %q", newPin)
	}
	// Until reload the daemon keeps serving the old identity: trust never
	// changes behind the operator's back.
	if _, err := pinnedGet(t, d.addr, oldPin, "/relay/health"); err != nil {
		t.Fatalf("before SIGHUP the old identity must be served: %v", err)
	}
	d.cmd.Process.Signal(syscall.SIGHUP)
	var err2 error
	eventually(t, 10*time.Second, func() string {
		return fmt.Sprintf("new pin not served after SIGHUP: %v\n%s", err2, d.stderr.String())
	}, func() bool {
		var resp *http.Response
		if resp, err2 = pinnedGet(t, d.addr, newPin, "/relay/health"); err2 == nil {
			resp.Body.Close()
		}
		return err2 == nil
	})
	if _, err := pinnedGet(t, d.addr, oldPin, "/relay/health"); err == nil {
		t.Fatal("old pin still accepted after rotation + reload")
	}
}

// A bad configuration stops serve before it listens, naming file:line: an
// acme mode without its challenge (the error names the three and what each
// needs), a group-readable DNS credentials file, an unknown key.
func TestServeRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c.yaml")
	os.WriteFile(p, []byte("state_dir: "+filepath.Join(dir, "s")+"\nadvertise: front.example.net\ntls:\n  mode: acme\n"), 0o600)
	_, se, err := runCLI(t, "serve", "--config", p)
	for _, want := range []string{p + ":3: tls.acme.challenge", "dns-01", "http-01", "tls-alpn-01", "tls.acme.dns_provider", "tls.acme.http_port"} {
		if err == nil || !strings.Contains(se, want) {
			t.Fatalf("want the acme challenge error naming file:line (%q), got %v %s", want, err, se)
		}
	}
	creds := filepath.Join(dir, "dns.env")
	os.WriteFile(creds, []byte("RFC2136_NAMESERVER=127.0.0.1:53\n"), 0o640)
	os.WriteFile(p, []byte("state_dir: "+filepath.Join(dir, "s")+"\nadvertise: front.example.net\ntls:\n  mode: acme\n  acme:\n    challenge: dns-01\n    dns_provider: rfc2136\n    dns_credentials_file: "+creds+"\n"), 0o600)
	_, se, err = runCLI(t, "serve", "--config", p)
	if err == nil || !strings.Contains(se, p+":8: tls.acme.dns_credentials_file") {
		t.Fatalf("want the credentials file's mode refused naming file:line, got %v %s", err, se)
	}
	os.WriteFile(p, []byte("state_dir: "+filepath.Join(dir, "s")+"\nlisten: \":9443\"\nupstream:\n  api: x\n"), 0o600)
	_, se, err = runCLI(t, "serve", "--config", p)
	if err == nil || !strings.Contains(se, p+":3") {
		t.Fatalf("want unknown-key error naming file:line, got %v %s", err, se)
	}
}

// Commands that talk to the daemon fail clearly when none runs
// (operations.md); pair's case is in pair_test.go.
func TestStatusAndRevokeWithoutDaemon(t *testing.T) {
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, "http://127.0.0.1:1")
	for _, args := range [][]string{
		{"status", "--config", cfgPath},
		{"revoke", "--config", cfgPath, "AAAAAAAAAAAAAAAAAAAAAA"},
	} {
		_, se, err := runCLI(t, args...)
		if err == nil || !strings.Contains(se, "no securelink daemon") {
			t.Fatalf("%s without daemon: %v %s", args[0], err, se)
		}
	}
}

// A SIGHUP after the listen address changed is reported and changes
// nothing about the listener: the daemon keeps serving where it was.
func TestReloadReportsListenChange(t *testing.T) {
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, echoRelay(t))
	d := startDaemon(t, cfgPath)
	b, _ := os.ReadFile(cfgPath)
	_, port, _ := net.SplitHostPort(d.addr)
	moved := strings.Replace(string(b), "127.0.0.1:"+port, fmt.Sprintf("127.0.0.1:%d", freePort(t)), 1)
	if moved == string(b) {
		t.Fatal("listen not found in config")
	}
	os.WriteFile(cfgPath, []byte(moved), 0o600)
	d.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, 10*time.Second, func() string { return "no report of the listen change: " + d.stderr.String() }, func() bool {
		return strings.Contains(d.stderr.String(), "a new listen address needs a restart")
	})
	resp, err := pinnedGet(t, d.addr, d.pin, "/relay/health")
	if err != nil {
		t.Fatalf("old listener after a reported listen change: %v", err)
	}
	resp.Body.Close()
}

func requireKeys(t *testing.T, what string, obj []byte, keys ...string) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(obj, &m); err != nil {
		t.Fatalf("%s: %v: %s", what, err, obj)
	}
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Errorf("%s lacks %q: %s", what, k, obj)
		}
	}
}

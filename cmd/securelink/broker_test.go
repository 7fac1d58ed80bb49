package main

import (
	"bufio"
	"encoding/json"
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
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestBrokerCLI(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	port := freePort(t)
	cfg := filepath.Join(dir, "broker.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("listen: \"127.0.0.1:%d\"\ninsecure_plaintext: true\nhosts_file: %s\nstate_file: %s\nlog: {level: debug, format: json}\n",
		port, filepath.Join(dir, "hosts.json"), filepath.Join(dir, "state.json"))), 0o600)

	so, se, err := runCLI(t, "broker", "add-host", "--config", cfg, "--json")
	if err != nil {
		t.Fatalf("add-host: %v %s", err, se)
	}
	var host struct {
		HostID string `json:"host_id"`
		Token  string `json:"host_token"`
	}
	if err := json.Unmarshal([]byte(so), &host); err != nil || len(host.HostID) != 22 || len(host.Token) != 43 {
		t.Fatalf("add-host output %q: %v", so, err)
	}
	hosts, _ := os.ReadFile(filepath.Join(dir, "hosts.json"))
	if strings.Contains(string(hosts), host.Token) || !strings.Contains(string(hosts), host.HostID) {
		t.Fatal("hosts file must hold the host id and only the token's digest")
	}
	if fi, _ := os.Stat(filepath.Join(dir, "hosts.json")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("hosts file mode %o", fi.Mode().Perm())
	}

	cmd := exec.Command(binPath, "broker", "serve", "--config", cfg)
	stderr := &syncWriter{b: &strings.Builder{}}
	cmd.Stderr = stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
	}()
	select {
	case l := <-line:
		if !strings.HasPrefix(l, "broker listening ") {
			t.Fatalf("first line %q", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("broker did not start: %s", stderr.String())
	}
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

	if _, se, err := runCLI(t, "broker", "remove-host", "--config", cfg, "--", host.HostID); err != nil {
		t.Fatalf("remove-host: %v %s", err, se)
	}
	hosts, _ = os.ReadFile(filepath.Join(dir, "hosts.json"))
	if strings.Contains(string(hosts), host.HostID) {
		t.Fatal("remove-host left the host in the hosts file")
	}
	// Ids are base64url and may start with '-': the flag form always works.
	so, _, _ = runCLI(t, "broker", "add-host", "--config", cfg, "--json")
	json.Unmarshal([]byte(so), &host)
	if _, se, err := runCLI(t, "broker", "remove-host", "--config", cfg, "--host-id", host.HostID); err != nil {
		t.Fatalf("remove-host --host-id: %v %s", err, se)
	}
	if _, _, err := runCLI(t, "broker", "remove-host", "--config", cfg); err == nil {
		t.Fatal("remove-host without an id succeeded")
	}
	cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(stderr.String(), "hosts file reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload after SIGHUP: %s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("broker exit: %v\n%s", err, stderr.String())
	}
}

func TestBrokerServeRefusesPlaintextOffLoopback(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "broker.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("listen: \":9444\"\ninsecure_plaintext: true\nhosts_file: %s\nstate_file: %s\n",
		filepath.Join(dir, "h.json"), filepath.Join(dir, "s.json"))), 0o600)
	_, se, err := runCLI(t, "broker", "serve", "--config", cfg)
	if err == nil || !strings.Contains(se, "insecure_plaintext") {
		t.Fatalf("plaintext on a public address must be refused: %v %s", err, se)
	}
}

package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// With Reach enabled and its broker unreachable, `status` says the
// connector is waiting, why, and when it tries again.
func TestStatusShowsTheReachWait(t *testing.T) {
	dir := t.TempDir()
	cfg := writeConfig(t, dir, echoRelay(t))
	tok := filepath.Join(dir, "host.token")
	if err := os.WriteFile(tok, []byte(strings.Repeat("t", 43)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t) // nothing listens there
	appendConfig(t, cfg, fmt.Sprintf("reach:\n  enabled: true\n  broker_url: wss://127.0.0.1:%d/v1/connect\n  host_id: %s\n  host_token_file: %s\n",
		port, wire.NewID(), tok))
	startDaemon(t, cfg)
	var out string
	eventually(t, 10*time.Second, func() string { return out }, func() bool {
		so, _, err := runCLI(t, "status", "--config", cfg)
		out = so
		return err == nil && strings.Contains(so, "reach wait")
	})
	if !strings.Contains(out, "state=backoff") || !strings.Contains(out, "next attempt 20") {
		t.Fatalf("status while the broker is down:\n%s", out)
	}
}

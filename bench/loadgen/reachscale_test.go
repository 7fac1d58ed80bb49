package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

func TestParseLevels(t *testing.T) {
	got, err := parseLevels(" 5000, 18368 ,")
	if err != nil || !slices.Equal(got, []int{5000, 18368}) {
		t.Fatalf("parseLevels = %v, %v", got, err)
	}
	for _, bad := range []string{"", ",", "5000,5000", "20000,5000", "-1", "x", "2000000", "1,2,3,4,5,6,7,8,9"} {
		if got, err := parseLevels(bad); err == nil {
			t.Errorf("parseLevels(%q) = %v; want an error", bad, got)
		}
	}
}

// kvOf reads a line the way bench/run.sh's kv does: space-separated
// key=value, the first of each key.
func kvOf(line, key string) string {
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok && k == key {
			return v
		}
	}
	return ""
}

func TestOpFigureLine(t *testing.T) {
	// 200 ms of broker CPU in 2 s, 40 ms/s of it keepalive: 120 ms net.
	l := opFigure{phase: "match", level: 5000, ops: 400, errors: 2, retries: 3, secs: 2, cpuUS: 200000, idleUS: 40000, err: "broker said quota_exceeded"}.line()
	want := map[string]string{
		"phase": "match", "level": "5000", "ops": "400", "errors": "2", "retries": "3", "secs": "2.00", "cpu_us": "200000",
		"idle_us_per_s": "40000", "us_per_op": "500.0", "net_us_per_op": "300.0", "per_s": "200", "busy_pct": "10", "per_core_s": "3333",
	}
	for k, v := range want {
		if got := kvOf(l, k); got != v {
			t.Errorf("%s = %q; want %q (line %q)", k, got, v, l)
		}
	}
	// scale.sh matches "phase=P level=L" as the first two fields.
	if f := strings.Fields(l); f[0] != "phase=match" || f[1] != "level=5000" {
		t.Errorf("line starts %q", f[:2])
	}
	if !strings.HasSuffix(l, " error=broker said quota_exceeded") {
		t.Errorf("the error is not last: %q", l)
	}
	// Nothing measured: zeros, no division by zero, no error key.
	z := opFigure{phase: "register", level: 0}.line()
	for _, k := range []string{"us_per_op", "net_us_per_op", "per_s", "busy_pct", "per_core_s"} {
		if v := kvOf(z, k); strings.Trim(v, "0.") != "" {
			t.Errorf("empty figure: %s = %q", k, v)
		}
	}
	if strings.Contains(z, "error=") || strings.Contains(z, "NaN") || strings.Contains(z, "Inf") {
		t.Errorf("empty figure: %q", z)
	}
	// A baseline larger than the window's CPU (noise) is not a negative cost.
	if n := kvOf(opFigure{ops: 10, secs: 1, cpuUS: 1000, idleUS: 5000}.line(), "net_us_per_op"); n != "0.0" {
		t.Errorf("net below the baseline = %q; want 0.0", n)
	}
}

func TestReconnectsSumsOnlyReconnects(t *testing.T) {
	got := reconnects(map[string]int64{"reconnect:dial": 2, "reconnect:register_timeout": 1, "registered": 5, "open": 9})
	if got != 3 {
		t.Fatalf("reconnects = %d; want 3", got)
	}
}

func TestPerSocket(t *testing.T) {
	if got := perSocket(1000, 33000, 1000); got != 32 {
		t.Errorf("perSocket = %v; want 32", got)
	}
	if got := perSocket(1000, 33000, 0); got != 0 {
		t.Errorf("perSocket with no sockets = %v; want 0", got)
	}
}

// reach-hosts writes, in one go, a hosts file the broker's own loader reads
// and credentials whose tokens match its digests.
func TestReachHostsWritesWhatTheBrokerLoads(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "b")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	hostsFile, out := filepath.Join(dir, "hosts.json"), filepath.Join(dir, "hosts.jsonl")
	printed := captureStdout(t, func() error {
		return cmdReachHosts([]string{"-n", "50", "-hosts-file", hostsFile, "-out", out})
	})
	if strings.TrimSpace(printed) != "hosts=50" {
		t.Fatalf("printed %q", printed)
	}
	h, err := store.LoadHosts(hostsFile)
	if err != nil || len(h) != 50 {
		t.Fatalf("LoadHosts: %d hosts, %v", len(h), err)
	}
	lines, err := readHosts(out, 50)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		id, err := wire.ParseID(l.HostID)
		if err != nil {
			t.Fatal(err)
		}
		if h[id] != wire.TokenDigest(l.Token) {
			t.Fatalf("host %s: the token does not match the stored digest", l.HostID)
		}
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file mode %v, %v; want 0600", fi.Mode(), err)
	}
	// It only creates: a second run must not replace the hosts.
	if err := cmdReachHosts([]string{"-n", "5", "-hosts-file", hostsFile, "-out", out + ".2"}); err == nil {
		t.Fatal("reach-hosts replaced an existing hosts file")
	}
	if h2, _ := store.LoadHosts(hostsFile); len(h2) != 50 {
		t.Fatalf("hosts file changed: %d hosts", len(h2))
	}
}

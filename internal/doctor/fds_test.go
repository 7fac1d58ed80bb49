package doctor

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/server"
)

// fdChild starts a real process holding 3 + extra descriptors (stdin,
// stdout, stderr and extra inherited pipe ends; the shell may leave one or
// two of its own) under a soft and hard RLIMIT_NOFILE of limit, and returns
// its pid once it runs `sleep`.
func fdChild(t *testing.T, extra, limit int) int {
	t.Helper()
	var files []*os.File
	for i := 0; i < extra; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(); w.Close() })
		files = append(files, r)
	}
	cmd := exec.Command("sh", "-c", "ulimit -n "+strconv.Itoa(limit)+" && exec sleep 60")
	cmd.ExtraFiles = files
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); ; {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if strings.TrimSpace(string(b)) == "sleep" {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child did not exec sleep (comm %q)", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCheckFDsOfARealProcess(t *testing.T) {
	cases := []struct {
		name         string
		extra, limit int
		need         int
		want         Status
		detail       string
	}{
		{"plenty", 30, 1000, 500, OK, "of 1000 descriptors open (3 %"},
		{"limit below what the config needs", 30, 1000, 2000, Warn, "below the 2000 a full broker needs"},
		{"past 80 %", 30, 40, 10, Warn, "of 40 descriptors open (8"},
		{"near exhaustion", 30, 34, 10, Fail, "EMFILE"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pid := fdChild(t, c.extra, c.limit)
			open, soft, err := ProcFDs(pid)
			if err != nil || open < 3+c.extra || open > 5+c.extra || soft != c.limit {
				t.Fatalf("ProcFDs = %d, %d, %v; want %d..%d, %d", open, soft, err, 3+c.extra, 5+c.extra, c.limit)
			}
			r := CheckFDs(pid, c.need, "test")
			if r.Status != c.want || !strings.Contains(r.Detail, c.detail) {
				t.Fatalf("CheckFDs = %s %q; want %s containing %q", r.Status, r.Detail, c.want, c.detail)
			}
			if c.want != OK && !strings.Contains(r.Fix, "LimitNOFILE") {
				t.Errorf("fix %q does not name LimitNOFILE", r.Fix)
			}
		})
	}
}

func TestCheckFDsOfAGoneProcess(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if r := CheckFDs(cmd.Process.Pid, 1, "test"); r.Status != Warn || !strings.Contains(r.Detail, "cannot read") {
		t.Fatalf("CheckFDs of an exited process = %s %q", r.Status, r.Detail)
	}
}

func TestListenerPIDFindsTheListeningProcess(t *testing.T) {
	for _, network := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := net.Listen("tcp", network)
		if err != nil {
			if network == "[::1]:0" {
				t.Logf("no IPv6 loopback: %v", err)
				continue
			}
			t.Fatal(err)
		}
		defer ln.Close()
		addr := ln.Addr().String()
		pid, err := listenerPID(addr)
		if err != nil || pid != os.Getpid() {
			t.Fatalf("listenerPID(%s) = %d, %v; want this process, %d", addr, pid, err, os.Getpid())
		}
		_, port, _ := net.SplitHostPort(addr)
		if pid, err := listenerPID(":" + port); err != nil || pid != os.Getpid() {
			t.Fatalf("listenerPID(:%s) = %d, %v; want %d", port, pid, err, os.Getpid())
		}
	}
	// A port nobody listens on (one just closed).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if _, err := listenerPID(addr); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("listenerPID of a closed port: %v; want 'not running'", err)
	}
}

func TestRunBrokerChecksTheRunningBroker(t *testing.T) {
	// This test process plays the broker: it listens on cfg.Listen.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, soft, err := ProcFDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.Listen = ln.Addr().String()
	cfg.MaxHosts, cfg.MaxStreamsPerHost = 10, 1
	rs := RunBroker(&cfg, nil, "broker.yaml")
	if Failed(rs) || len(rs) != 3 || rs[1].Check != "broker process" || rs[2].Status != OK {
		t.Fatalf("small limits:\n%s", Format(rs))
	}
	if !strings.Contains(rs[1].Detail, "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("broker process: %q does not name this process", rs[1].Detail)
	}
	// Limits that need more descriptors than this process may open.
	cfg.MaxHosts = 1 << 16
	cfg.MaxStreamsPerHost = soft/cfg.MaxHosts + 1
	rs = RunBroker(&cfg, nil, "broker.yaml")
	if last := rs[len(rs)-1]; last.Status != Warn || !strings.Contains(last.Detail, "below the") || !strings.Contains(last.Detail, "max_hosts 65536") {
		t.Fatalf("large limits:\n%s", Format(rs))
	}
	// No broker on the address: a warning that says so, no FD figure.
	ln.Close()
	rs = RunBroker(&cfg, nil, "broker.yaml")
	if len(rs) != 2 || rs[1].Status != Warn || !strings.Contains(rs[1].Detail, "not running") {
		t.Fatalf("no broker:\n%s", Format(rs))
	}
}

func TestParseNOFILE(t *testing.T) {
	const limits = "Limit                     Soft Limit           Hard Limit           Units     \n" +
		"Max processes             63704                63704                processes \n" +
		"Max open files            1024                 524288               files     \n"
	if v, err := parseNOFILE([]byte(limits)); err != nil || v != 1024 {
		t.Fatalf("parseNOFILE = %d, %v; want 1024", v, err)
	}
	if v, err := parseNOFILE([]byte("Max open files            unlimited            unlimited            files\n")); err != nil || v != 1<<31-1 {
		t.Fatalf("unlimited = %d, %v", v, err)
	}
	for _, bad := range []string{"", "Max open files\n", "Max open files  -1  5  files\n", "Max processes 5 5\n"} {
		if _, err := parseNOFILE([]byte(bad)); err == nil {
			t.Errorf("parseNOFILE(%q) succeeded", bad)
		}
	}
}

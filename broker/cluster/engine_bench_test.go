package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestEngineLatency measures the operations the broker's shared state needs
// on the two candidate engines (docs/decisions.md "Cluster engine"): it
// prints p50/p99 per operation and asserts nothing about time. It runs only
// with CLUSTER_ENGINE_BENCH=1 (a few seconds per engine); Redis is skipped
// when redis-server is not installed.
func TestEngineLatency(t *testing.T) {
	if os.Getenv("CLUSTER_ENGINE_BENCH") == "" {
		t.Skip("set CLUSTER_ENGINE_BENCH=1 to measure the engines")
	}
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("CLUSTER_ENGINE_N")); err == nil && v > 0 {
		n = v
	}
	t.Run("nats-R3", func(t *testing.T) { benchNATS(t, n) })
	t.Run("redis", func(t *testing.T) { benchRedis(t, n) })
}

type latencies map[string][]time.Duration

func (l latencies) time(op string, f func() error) error {
	start := time.Now()
	err := f()
	l[op] = append(l[op], time.Since(start))
	return err
}

func (l latencies) print(t *testing.T, engine string) {
	ops := make([]string, 0, len(l))
	for op := range l {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		d := l[op]
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		p := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
		t.Logf("%-8s %-22s n=%-5d p50=%-10v p99=%v", engine, op, len(d), p(0.50).Round(time.Microsecond), p(0.99).Round(time.Microsecond))
	}
}

func benchNATS(t *testing.T, n int) {
	c := startNATSCluster(t)
	nc, err := nats.Connect(strings.Join(c.urls(), ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: "bench", Replicas: 3, Storage: jetstream.FileStorage, LimitMarkerTTL: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	l := latencies{}
	val := []byte(strings.Repeat("v", 120))
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%d", i)
		var rev uint64
		if err := l.time("create+ttl", func() (err error) {
			rev, err = kv.Create(ctx, k, val, jetstream.KeyTTL(time.Hour))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if err := l.time("create-conflict", func() error {
			_, err := kv.Create(ctx, k, val, jetstream.KeyTTL(time.Hour))
			if !errors.Is(err, jetstream.ErrKeyExists) {
				return fmt.Errorf("second create: %v", err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := l.time("update@rev", func() error { _, err := kv.Update(ctx, k, val, rev); return err }); err != nil {
			t.Fatal(err)
		}
		if err := l.time("get", func() error { _, err := kv.Get(ctx, k); return err }); err != nil {
			t.Fatal(err)
		}
		if err := l.time("delete", func() error { return kv.Delete(ctx, k) }); err != nil {
			t.Fatal(err)
		}
	}
	l.print(t, "nats-R3")
}

// respConn is the smallest RESP client the measurement needs, so the
// comparison adds no module.
type respConn struct {
	c net.Conn
	r *bufio.Reader
}

func (r *respConn) do(args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := r.c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := r.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "(nil)", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r.r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

func benchRedis(t *testing.T, n int) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed")
	}
	port := freePort(t)
	// appendfsync always: a write is on disk before it is acknowledged,
	// the single-node equivalent of a quorum ack.
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var nc net.Conn
	for i := 0; i < 100; i++ {
		if nc, err = net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := &respConn{c: nc, r: bufio.NewReader(nc)}
	// Update at an expected version: the value carries its version, and a
	// script swaps it only when the version matches (Redis has no
	// per-key revision).
	const cas = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL') else return redis.error_reply('mismatch') end`
	l := latencies{}
	val := strings.Repeat("v", 120)
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("k%d", i)
		check := func(want string) func(string, error) error {
			return func(got string, err error) error {
				if err != nil {
					return err
				}
				if want != "" && got != want {
					return fmt.Errorf("%s: got %q, want %q", k, got, want)
				}
				return nil
			}
		}
		steps := []struct {
			op   string
			args []string
			want string
		}{
			{"create+ttl", []string{"SET", k, "1" + val, "NX", "PX", "3600000"}, "OK"},
			{"create-conflict", []string{"SET", k, "1" + val, "NX", "PX", "3600000"}, "(nil)"},
			{"update@rev", []string{"EVAL", cas, "1", k, "1" + val, "2" + val}, "OK"},
			{"get", []string{"GET", k}, "2" + val},
			{"delete", []string{"DEL", k}, "1"},
		}
		for _, s := range steps {
			if err := l.time(s.op, func() error { return check(s.want)(r.do(s.args...)) }); err != nil {
				t.Fatal(err)
			}
		}
	}
	l.print(t, "redis-1")
}

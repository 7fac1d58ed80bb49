package relay

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

// The benchmarks compare a client talking to an echoing Relay directly with
// the same client going through the bridge; the difference is what the bridge
// costs. Everything runs in this process, so only differences are meaningful.

// echoRelay answers the auth frame with auth.ok and then echoes every message.
func echoRelay(tb testing.TB) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(testfake.MaxMessage + 1)
		ctx := context.Background()
		if _, _, err := c.Read(ctx); err != nil {
			return
		}
		if c.Write(ctx, websocket.MessageText, []byte(testfake.AuthOKMsg)) != nil {
			return
		}
		buf := make([]byte, 0, 4096)
		for {
			typ, rd, err := c.Reader(ctx)
			if err != nil {
				return
			}
			buf = buf[:0]
			for {
				if len(buf) == cap(buf) {
					buf = append(buf, 0)[:len(buf)]
				}
				n, err := rd.Read(buf[len(buf):cap(buf)])
				buf = buf[:len(buf)+n]
				if err != nil {
					break
				}
			}
			if c.Write(ctx, typ, buf) != nil {
				return
			}
		}
	}))
	tb.Cleanup(srv.Close)
	return srv
}

type benchTarget struct {
	url    string
	client *http.Client
	bridge *Bridge // nil for the direct target
}

// settle waits until every bridged session of t has ended.
func (t benchTarget) settle(b *testing.B) {
	deadline := time.Now().Add(15 * time.Second)
	for t.bridge != nil && t.bridge.Active() > 0 {
		if time.Now().After(deadline) {
			b.Fatal("bridged sessions did not end")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// benchTargets returns the echo Relay itself and a bridge in front of it
// (over TLS when tlsFront, like the real front).
func benchTargets(b *testing.B, tlsFront bool) (direct, bridged benchTarget) {
	relay := echoRelay(b)
	u, _ := url.Parse(relay.URL)
	br, err := NewBridge(Options{Upstream: u, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/relay/ws", br)
	front := httptest.NewUnstartedServer(mux)
	if tlsFront {
		front.StartTLS()
	} else {
		front.Start()
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = br.Shutdown(ctx)
		front.Close()
	})
	plain := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	direct = benchTarget{url: "ws://" + relay.Listener.Addr().String() + "/ws", client: plain}
	bridged = benchTarget{url: "ws://" + front.Listener.Addr().String() + "/relay/ws", client: plain, bridge: br}
	if tlsFront {
		bridged.url = "wss://" + front.Listener.Addr().String() + "/relay/ws"
		bridged.client = &http.Client{Transport: &http.Transport{
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		}}
	}
	return direct, bridged
}

func benchDial(b *testing.B, t benchTarget) *websocket.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, t.url, &websocket.DialOptions{HTTPClient: t.client})
	if err != nil {
		b.Fatal(err)
	}
	c.SetReadLimit(testfake.MaxMessage + 1)
	if err := c.Write(ctx, websocket.MessageText, testfake.AuthFrame(testfake.GoodCode)); err != nil {
		b.Fatal(err)
	}
	if _, msg, err := c.Read(ctx); err != nil || string(msg) != testfake.AuthOKMsg {
		b.Fatalf("auth: %q %v", msg, err)
	}
	return c
}

// BenchmarkEcho: one text message in flight, round trip directly and through
// the bridge, plain and behind TLS (allocs/op include the client and the echo
// Relay: the bridge's share is the difference from direct).
func BenchmarkEcho(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		direct, bridged := benchTargets(b, false)
		_, bridgedTLS := benchTargets(b, true)
		for _, tc := range []struct {
			name string
			t    benchTarget
		}{{"direct", direct}, {"bridge", bridged}, {"bridge-tls", bridgedTLS}} {
			b.Run(tc.name+"/"+byteSize(size), func(b *testing.B) {
				c := benchDial(b, tc.t)
				defer c.CloseNow()
				msg := bytes.Repeat([]byte{'x'}, size)
				ctx := context.Background()
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
						b.Fatal(err)
					}
					if _, got, err := c.Read(ctx); err != nil || len(got) != size {
						b.Fatalf("echo: %d bytes, %v", len(got), err)
					}
				}
			})
		}
	}
}

func byteSize(n int) string {
	return strconv.Itoa(n>>10) + "KiB"
}

// liveBytes is the live heap plus goroutine stacks after collection; a few
// cycles let the runtime shrink stacks that grew during the handshakes.
func liveBytes() (heap, stack uint64, goroutines int) {
	var ms runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.StackInuse, runtime.NumGoroutine()
}

// BenchmarkIdle opens idleConns authenticated connections directly and
// through the bridge and reports what each bridged one adds: live heap plus
// stacks (B/conn) and goroutines.
func BenchmarkIdle(b *testing.B) {
	const idleConns = 200
	for _, tlsFront := range []bool{false, true} {
		name := "plain"
		if tlsFront {
			name = "tls"
		}
		b.Run(name, func(b *testing.B) {
			direct, bridged := benchTargets(b, tlsFront)
			type costs struct{ heap, stack, goroutines float64 }
			cost := func(t benchTarget) costs {
				h0, s0, g0 := liveBytes()
				conns := make([]*websocket.Conn, 0, idleConns)
				for range idleConns {
					conns = append(conns, benchDial(b, t))
				}
				time.Sleep(200 * time.Millisecond)
				h1, s1, g1 := liveBytes()
				for _, c := range conns {
					_ = c.CloseNow()
				}
				t.settle(b)
				per := func(a, b uint64) float64 { return float64(int64(b)-int64(a)) / idleConns }
				return costs{per(h0, h1), per(s0, s1), float64(g1-g0) / idleConns}
			}
			var d, t costs
			for b.Loop() {
				d, t = cost(direct), cost(bridged)
			}
			b.ReportMetric(t.heap+t.stack-d.heap-d.stack, "B/conn")
			b.ReportMetric(t.heap-d.heap, "heap-B/conn")
			b.ReportMetric(t.stack-d.stack, "stack-B/conn")
			b.ReportMetric(t.goroutines-d.goroutines, "goroutines/conn")
		})
	}
}

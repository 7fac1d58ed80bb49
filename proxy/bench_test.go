package proxy

// Benchmarks of the small proxied GET, the figure `make bench` compares with
// nginx. The upstream is a canned-response TCP server that allocates nothing
// per request, so allocs/op is the front's path: ours, the forwarder and
// net/http's client side (Forward) or also its server side and TLS (TLS).

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/pinning"
)

const benchBody = 100

// cannedUpstream answers every request on a connection with the same
// 100-byte response, the way bench/loadgen's /small does (Content-Length,
// keep-alive). It only understands bodiless requests.
func cannedUpstream(b testing.TB) *url.URL {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
		strconv.Itoa(benchBody) + "\r\nDate: Mon, 30 Nov 2026 10:00:00 GMT\r\n\r\n" +
		string(bytes.Repeat([]byte("s"), benchBody)))
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	b.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReaderSize(c, 8<<10)
				for {
					// Headers end with an empty line; no request has a body.
					for {
						line, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(line) <= 2 {
							break
						}
					}
					if _, err := c.Write(resp); err != nil {
						return
					}
				}
			}()
		}
	}()
	return &url.URL{Scheme: "http", Host: ln.Addr().String()}
}

func benchServer(b testing.TB) (*Server, *pinning.Identity, int, net.Listener) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	id, err := pinning.LoadOrCreate(pinning.IdentityConfig{
		StateDir:  b.TempDir() + "/s",
		Authority: pinning.Authority{Host: "127.0.0.1", Port: port},
	})
	if err != nil {
		b.Fatal(err)
	}
	up := cannedUpstream(b)
	s, err := New(Options{
		AuthorityHost: "127.0.0.1",
		AuthorityPort: port,
		Upstreams:     Upstreams{Relay: up, API: up, Dashboard: up},
		Limits:        DefaultLimits(),
		Log:           zerolog.Nop(),
	}, id)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s, id, port, ln
}

// discardWriter is the least a handler can write to.
type discardWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
func (w *discardWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// BenchmarkForwardSmallGET is one small GET through ServeHTTP: routing,
// policy, the forwarder and the upstream round trip, without the client leg.
func BenchmarkForwardSmallGET(b *testing.B) {
	s, _, port, ln := benchServer(b)
	ln.Close()
	host := "127.0.0.1:" + strconv.Itoa(port)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := &http.Request{
			Method: http.MethodGet, URL: &url.URL{Path: "/api/small"}, RequestURI: "/api/small",
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Host: host,
			Header:     http.Header{"User-Agent": {"wrk"}, "Accept": {"*/*"}},
			Body:       http.NoBody,
			RemoteAddr: "127.0.0.1:40000",
		}
		r = r.WithContext(context.Background())
		clear(w.h)
		w.status, w.n = 0, 0
		s.ServeHTTP(w, r)
		if w.status != http.StatusOK || w.n != benchBody {
			b.Fatalf("status %d, %d bytes", w.status, w.n)
		}
	}
}

// BenchmarkTLSSmallGET is the bench's small GET end to end: keep-alive TLS
// connections (one per parallel goroutine) sending wrk's request. The client
// side runs in the same process, so ns/op is not the server's cost alone.
func BenchmarkTLSSmallGET(b *testing.B) {
	s, id, port, ln := benchServer(b)
	go s.Serve(ln)
	cfg, err := pinning.PinnedTLSConfig("127.0.0.1", id.Pin)
	if err != nil {
		b.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	req := []byte("GET /api/small HTTP/1.1\r\nHost: " + addr + "\r\n\r\n")
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := tls.Dial("tcp", addr, cfg.Clone())
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for pb.Next() {
			if _, err := c.Write(req); err != nil {
				b.Error(err)
				return
			}
			n := -1
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					b.Error(err)
					return
				}
				if len(line) <= 2 {
					break
				}
				if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
					n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
				}
			}
			if n != benchBody {
				b.Errorf("Content-Length %d", n)
				return
			}
			if _, err := br.Discard(n); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// The direct path's allocations per small GET (routing, policy, the
// forwarder and the upstream exchange; no client leg, and the canned
// upstream allocates nothing): the exchange's parts and the answer's header
// map are reused between requests, readResponse parses the answer itself
// and the client-gone cancel is armed only for a slow exchange
// (goneWatch), so what is left is the answer's head string and value slice
// (15 with http.ReadResponse and an AfterFunc per request).
func TestDirectPathAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items at random")
	}
	s, _, port, ln := benchServer(t)
	ln.Close()
	host := "127.0.0.1:" + strconv.Itoa(port)
	const runs = 200
	reqs := make([]*http.Request, runs+1) // AllocsPerRun runs once more to warm up
	for i := range reqs {
		// A context that can end, as net/http's request context: the
		// client-gone cancel costs what it costs on a real request.
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		reqs[i] = (&http.Request{
			Method: http.MethodGet, URL: &url.URL{Path: "/api/small"}, RequestURI: "/api/small",
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Host: host,
			Header:     http.Header{"User-Agent": {"wrk"}, "Accept": {"*/*"}},
			Body:       http.NoBody,
			RemoteAddr: "127.0.0.1:40000",
		}).WithContext(ctx)
	}
	w := &discardWriter{h: http.Header{}}
	i := 0
	allocs := testing.AllocsPerRun(runs, func() {
		clear(w.h)
		w.status, w.n = 0, 0
		s.ServeHTTP(w, reqs[i])
		i++
	})
	if w.status != http.StatusOK || w.n != benchBody {
		t.Fatalf("status %d, %d bytes", w.status, w.n)
	}
	if allocs > 4 {
		t.Fatalf("%.1f allocations per small GET on the direct path, want at most 4", allocs)
	}
	t.Logf("%.1f allocations per small GET", allocs)
}

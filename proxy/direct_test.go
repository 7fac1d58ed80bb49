package proxy

// Tests of what only the direct path (direct.go, upstream.go) does itself:
// its keep-alive pool, the liveness check of pooled connections, retries
// under http.Transport's rules, and the request head it writes.

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawUpstream is an HTTP/1.1 upstream on a bare listener, so a test sees
// which connection each request came on and when the front closes one, and
// can answer what http.Server never would (a keep-alive connection dropped
// without a word, an unasked 101, an oversized head). Probe requests are
// answered and not recorded.
type rawUpstream struct {
	t   *testing.T
	ln  net.Listener
	url *url.URL
	// answer writes the answer to the n-th request (from 0) on connection
	// conn and reports whether to keep the connection; nil answers 200 "ok".
	answer func(req *http.Request, conn, n int, w *bufio.Writer) bool

	mu      sync.Mutex
	nconns  int
	seen    []rawSeen
	byFront map[int]bool // connections the front closed
	changed chan struct{}
}

type rawSeen struct {
	method, path string
	conn         int
}

func newRawUpstream(t *testing.T, answer func(req *http.Request, conn, n int, w *bufio.Writer) bool) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{t: t, ln: ln, answer: answer, byFront: map[int]bool{}, changed: make(chan struct{}, 1)}
	u.url = &url.URL{Scheme: "http", Host: ln.Addr().String()}
	var wg sync.WaitGroup
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		u.mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		u.mu.Unlock()
		wg.Wait()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			conns = append(conns, c)
			u.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				u.serveConn(c)
			}()
		}
	}()
	return u
}

func (u *rawUpstream) serveConn(c net.Conn) {
	defer c.Close()
	br, bw := bufio.NewReader(c), bufio.NewWriter(c)
	idx, n := -1, 0
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			if errors.Is(err, io.EOF) && idx >= 0 {
				u.mu.Lock()
				u.byFront[idx] = true
				u.mu.Unlock()
				u.notify()
			}
			return
		}
		io.Copy(io.Discard, req.Body)
		if req.Header.Get("User-Agent") == probeUA {
			bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}")
			bw.Flush()
			continue
		}
		u.mu.Lock()
		if idx < 0 {
			idx = u.nconns
			u.nconns++
		}
		u.seen = append(u.seen, rawSeen{req.Method, req.URL.Path, idx})
		answer := u.answer
		u.mu.Unlock()
		u.notify()
		keep := true
		if answer == nil {
			bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		} else {
			keep = answer(req, idx, n, bw)
		}
		bw.Flush()
		n++
		if !keep {
			return
		}
	}
}

func (u *rawUpstream) notify() {
	select {
	case u.changed <- struct{}{}:
	default:
	}
}

func (u *rawUpstream) conns() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.nconns
}

func (u *rawUpstream) setAnswer(a func(req *http.Request, conn, n int, w *bufio.Writer) bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.answer = a
}

func (u *rawUpstream) requests() []rawSeen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]rawSeen(nil), u.seen...)
}

// connOf is the connection the i-th recorded request came on.
func (u *rawUpstream) connOf(t *testing.T, i int) int {
	t.Helper()
	r := u.requests()
	if len(r) <= i {
		t.Fatalf("upstream saw %d requests, want more than %d", len(r), i)
	}
	return r[i].conn
}

func (u *rawUpstream) count(path string) int {
	n := 0
	for _, s := range u.requests() {
		if s.path == path {
			n++
		}
	}
	return n
}

func (u *rawUpstream) waitClosedByFront(t *testing.T, conn int) {
	t.Helper()
	deadline := time.After(testTimeout)
	for {
		u.mu.Lock()
		done := u.byFront[conn]
		u.mu.Unlock()
		if done {
			return
		}
		select {
		case <-u.changed:
		case <-deadline:
			t.Fatalf("the front kept upstream connection %d open", conn)
		}
	}
}

func (h *harness) rawDo(method, path string, headers ...string) *http.Response {
	h.t.Helper()
	resp, _ := h.rawReq(method, path, headers...)
	return resp
}

func TestDirectPathReusesUpstreamConnections(t *testing.T) {
	up := newRawUpstream(t, nil)
	h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
	for range 10 {
		resp, body := h.get("/api/x")
		if resp.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("status %d, body %q", resp.StatusCode, body)
		}
	}
	if n := up.conns(); n != 1 {
		t.Fatalf("10 sequential requests used %d upstream connections, want 1", n)
	}

	// Concurrent clients: never more connections than requests in flight.
	const clients = 6
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := h.client()
			for range 10 {
				resp, err := c.Get(h.url("/api/y"))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	if n := up.conns(); n > 1+clients {
		t.Fatalf("%d concurrent clients used %d upstream connections", clients, n)
	}
}

// A pooled connection the upstream closed meanwhile is never used: even a
// request that must not be sent twice (DELETE) gets through.
func TestDirectPathSkipsConnectionsTheUpstreamClosed(t *testing.T) {
	up := newRawUpstream(t, func(req *http.Request, conn, n int, w *bufio.Writer) bool {
		// Answer as if keeping the connection, then close it.
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return false
	})
	h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
	for i := range 3 {
		resp := h.rawDo("DELETE", "/api/jobs/"+itoa(i))
		wantStatus(t, "DELETE after the upstream closed the previous connection", resp, 200)
		// The front must have seen the close before the next request.
		st := h.srv.state.Load()
		waitFor(t, "the pooled connection to be closed", func() bool {
			st.api.pool.mu.Lock()
			defer st.api.pool.mu.Unlock()
			for _, pc := range st.api.pool.idle {
				if pc.alive() {
					return false
				}
			}
			return true
		})
	}
	for i := range 3 {
		if n := up.count("/jobs/" + itoa(i)); n != 1 {
			t.Fatalf("DELETE %d reached the upstream %d times", i, n)
		}
	}
}

// When the upstream drops a reused connection right as the request arrives
// (its keep-alive timeout racing the request), the request is retried on a
// new connection only if that is safe, as http.Transport decides.
func TestDirectPathRetriesOnlyReplayableRequests(t *testing.T) {
	up := newRawUpstream(t, func(req *http.Request, conn, n int, w *bufio.Writer) bool {
		if n > 0 {
			return false // the second request on a connection: dropped unanswered
		}
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
	wantStatus(t, "first GET", h.rawDo("GET", "/api/a"), 200)
	wantStatus(t, "GET on a dropped connection", h.rawDo("GET", "/api/b"), 200)
	if n := up.count("/b"); n != 2 {
		t.Fatalf("GET /b sent %d times, want 2 (retried once)", n)
	}
	wantStatus(t, "DELETE on a dropped connection", h.rawDo("DELETE", "/api/c"), http.StatusBadGateway)
	if n := up.count("/c"); n != 1 {
		t.Fatalf("DELETE /c sent %d times, want 1 (never retried)", n)
	}
	wantStatus(t, "GET", h.rawDo("GET", "/api/d"), 200)
	wantStatus(t, "DELETE with Idempotency-Key", h.rawDo("DELETE", "/api/e", "Idempotency-Key: k1"), 200)
	if n := up.count("/e"); n != 2 {
		t.Fatalf("idempotent DELETE /e sent %d times, want 2", n)
	}
}

func TestDirectPathHEADKeepsTheConnection(t *testing.T) {
	up := newRawUpstream(t, func(req *http.Request, conn, n int, w *bufio.Writer) bool {
		if req.Method == http.MethodHead {
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nContent-Type: text/plain\r\n\r\n")
		} else {
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		return true
	})
	h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
	req, _ := http.NewRequest(http.MethodHead, h.url("/api/file"), nil)
	resp, body := h.do(req)
	wantStatus(t, "HEAD", resp, 200)
	if resp.ContentLength != 1234 || len(body) != 0 {
		t.Fatalf("HEAD: Content-Length %d, %d body bytes", resp.ContentLength, len(body))
	}
	resp, body = h.get("/api/file")
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("GET after HEAD: %d %q", resp.StatusCode, body)
	}
	if n := up.conns(); n != 1 {
		t.Fatalf("HEAD then GET used %d upstream connections", n)
	}
}

// An upstream that closes after its answer, or says so, is not reused; an
// unasked protocol switch is a failure, not an answer.
func TestDirectPathHonorsConnectionCloseAndRefusesUnaskedUpgrades(t *testing.T) {
	up := newRawUpstream(t, func(req *http.Request, conn, n int, w *bufio.Writer) bool {
		switch req.URL.Path {
		case "/close": // said, but the connection stays open: the front must still not reuse it
			w.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
			return true
		case "/eof": // close-delimited body
			w.WriteString("HTTP/1.1 200 OK\r\n\r\nuntil close")
			return false
		case "/switch":
			w.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
			return false
		}
		w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
	for _, path := range []string{"/close", "/eof"} {
		resp, body := h.get("/api" + path)
		if resp.StatusCode != 200 || (string(body) != "ok" && string(body) != "until close") {
			t.Fatalf("%s: %d %q", path, resp.StatusCode, body)
		}
		resp, _ = h.get("/api/after")
		wantStatus(t, "after "+path, resp, 200)
		r := up.requests()
		if closed, next := r[len(r)-2].conn, r[len(r)-1].conn; closed == next {
			t.Fatalf("the request after %s reused the closed connection %d", path, closed)
		}
	}
	resp, _ := h.get("/api/switch")
	wantStatus(t, "unasked 101", resp, http.StatusBadGateway)
}

// FuzzRequestHead holds writeRequestHead to what (*http.Request).Write
// writes for the same bodiless request, byte for byte, when the request line
// passes checkRequestLine (and refuses it otherwise). Header lines are
// "Name: value" separated by "\n"; CONNECT never reaches the forwarder.
func FuzzRequestHead(f *testing.F) {
	f.Add("GET", "/v1/x", "a=1&b=%20", "Accept: */*\nUser-Agent: hermes/1\nX-Custom: kept")
	f.Add("DELETE", "/jobs/7", "", "Idempotency-Key: k\nauthorization: Bearer t")
	f.Add("POST", "/", "", "Content-Length: 0\nTransfer-Encoding: chunked\nTrailer: X\nHost: evil")
	f.Add("HEAD", "/a%2Fb", "x", "User-Agent: \nX-Empty:")
	f.Add("OPTIONS", "//double", "", "X-Sp:  padded  \nX-Bad Name: v\nX-Ctl: a\rb")
	f.Add("get", "/\x01", "q\x7f", "")
	f.Add("PATCH", "/p", "", "B: 2\nA: 1\nA: 0\nContent-Type: application/json")
	f.Fuzz(func(t *testing.T, method, path, query, headers string) {
		if method == "" || method == http.MethodConnect || strings.ContainsAny(method, " \r\n") || !strings.HasPrefix(path, "/") {
			t.Skip()
		}
		h := http.Header{}
		for _, line := range strings.Split(headers, "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok || k == "" {
				continue
			}
			h[k] = append(h[k], strings.TrimPrefix(v, " "))
		}
		req := &http.Request{
			Method: method,
			URL:    &url.URL{Scheme: "http", Host: "127.0.0.1:8642", Opaque: path, RawQuery: query},
			Proto:  "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: h,
			Host:   "127.0.0.1:8642",
		}
		var got bytes.Buffer
		bw := bufio.NewWriter(&got)
		gotErr := writeRequestHead(bw, req)
		bw.Flush()
		if checkRequestLine(method, req.URL.RequestURI()) != nil {
			// Request.Write writes lines that do not re-parse to the
			// same method and target (FuzzUpstreamRequestLine); the
			// direct path refuses them.
			if gotErr == nil {
				t.Fatalf("wrote a refused request line: %q", got.String())
			}
			return
		}

		// ReverseProxy's rule, which writeRequestHead applies itself: no
		// User-Agent stays none.
		ref := req.Clone(req.Context())
		if _, ok := ref.Header["User-Agent"]; !ok {
			ref.Header["User-Agent"] = []string{""}
		}
		var want bytes.Buffer
		wantErr := ref.Write(&want)
		if (gotErr != nil) != (wantErr != nil) {
			t.Fatalf("errors differ: got %v, Request.Write %v", gotErr, wantErr)
		}
		if gotErr == nil && got.String() != want.String() {
			t.Fatalf("head differs:\n got %q\nwant %q", got.String(), want.String())
		}
	})
}

func TestCanonicalAddr(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8642": "127.0.0.1:8642",
		"http://127.0.0.1":      "127.0.0.1:80",
		"http://[::1]:9119/x":   "[::1]:9119",
		"http://[::1]":          "[::1]:80",
		"http://localhost":      "localhost:80",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := canonicalAddr(u); got != want {
			t.Errorf("canonicalAddr(%s) = %q, want %q", in, got, want)
		}
	}
}

// A body read at full speed switches the direct path's copy to the bulk
// buffer mid-body; the bytes arrive intact and in order, length-delimited
// and chunked, on both paths.
func TestDirectPathBulkBodyArrivesIntact(t *testing.T) {
	body := make([]byte, 3<<20+12345)
	for i := range body {
		body[i] = byte(i*7 + i>>11)
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/chunked" {
			w.(http.Flusher).Flush() // no Content-Length: chunked
		} else {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		}
		w.Write(body)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	for _, rpOnly := range []bool{false, true} {
		h := newHarness(t, withOptions(func(o *Options) {
			o.Upstreams.API = u
			o.reverseProxyOnly = rpOnly
		}))
		for _, p := range []string{"/api/big", "/api/chunked", "/api/big"} {
			resp, got := h.get(p)
			if resp.StatusCode != 200 || !bytes.Equal(got, body) {
				t.Fatalf("reverseProxyOnly=%v %s: status %d, %d bytes (want %d), equal %v",
					rpOnly, p, resp.StatusCode, len(got), len(body), bytes.Equal(got, body))
			}
		}
	}
}

// An upstream status below 100 (http.ReadResponse takes any three digits)
// is a failure on both paths: 502, the front's connection to the client
// kept, and the upstream's connection not reused.
func TestUpstreamStatusBelow100IsABadGateway(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		up := newRawUpstream(t, func(req *http.Request, conn, n int, w *bufio.Writer) bool {
			if req.URL.Path == "/odd" {
				w.WriteString("HTTP/1.1 042 Odd\r\nContent-Length: 2\r\n\r\nok")
				return true
			}
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		})
		h := newHarness(t, path, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
		c := h.client()
		for _, p := range []string{"/odd", "/after"} {
			resp, err := c.Get(h.url("/api" + p))
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			resp.Body.Close()
			want := http.StatusBadGateway
			if p == "/after" {
				want = http.StatusOK
			}
			wantStatus(t, p, resp, want)
		}
		if r := up.requests(); len(r) != 2 || r[0].conn == r[1].conn {
			t.Fatalf("upstream saw %d requests; the one after a status below 100 must take a new connection: %+v", len(r), r)
		}
	})
}

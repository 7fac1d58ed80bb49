package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

const maxBody = 16 << 20

// zeroReader yields n zero bytes and hides its length, so the client must
// send a chunked body.
type zeroReader struct{ n int64 }

func (z *zeroReader) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.n {
		p = p[:z.n]
	}
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}

func (h *harness) post(path string, n int64, chunked bool) *http.Response {
	h.t.Helper()
	var body io.Reader = &zeroReader{n}
	req, err := http.NewRequest(http.MethodPost, h.url(path), body)
	if err != nil {
		h.t.Fatal(err)
	}
	if chunked {
		req.ContentLength = -1
	} else {
		req.ContentLength = n
	}
	resp, err := h.client().Do(req)
	if err != nil {
		h.t.Fatalf("POST %s (%d bytes, chunked %v): %v", path, n, chunked, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestRequestBodyOfExactlyTheLimitPasses(t *testing.T) {
	h := newHarness(t)
	for _, chunked := range []bool{false, true} {
		resp := h.post("/api/upload", maxBody, chunked)
		wantStatus(t, "16 MiB body, chunked="+strconv.FormatBool(chunked), resp, 200)
		got := h.api.last()
		if got.BodyLen != maxBody || got.BodyErr != nil {
			t.Fatalf("chunked=%v: upstream read %d bytes (err %v), want %d", chunked, got.BodyLen, got.BodyErr, maxBody)
		}
	}
	// The Dashboard namespace has the same limit.
	resp := h.post("/dashboard/upload", maxBody, true)
	wantStatus(t, "16 MiB dashboard body", resp, 200)
	if got := h.dash.last(); got.BodyLen != maxBody {
		t.Fatalf("dashboard read %d bytes", got.BodyLen)
	}
}

func TestDeclaredBodyOverLimitIs413BeforeReading(t *testing.T) {
	h := newHarness(t)
	for _, p := range []string{"/api/upload", "/dashboard/upload"} {
		// Only the headers are sent: the answer must come from the
		// Content-Length alone, before any body byte is read.
		resp, _ := h.rawReq("POST", p, "Content-Length: "+strconv.Itoa(maxBody+1))
		wantStatus(t, "POST "+p+" with Content-Length 16 MiB + 1", resp, http.StatusRequestEntityTooLarge)
	}
	if h.api.hits.Load()+h.dash.hits.Load() != 0 {
		t.Fatal("an oversize declared body reached an upstream")
	}
}

func TestStreamedBodyOverLimitIs413(t *testing.T) {
	h := newHarness(t)
	resp := h.post("/api/upload", maxBody+1, true)
	wantStatus(t, "chunked 16 MiB + 1", resp, http.StatusRequestEntityTooLarge)
	for _, r := range h.api.requests() {
		if r.BodyErr == nil && r.BodyLen > maxBody {
			t.Fatalf("upstream received a complete oversize body of %d bytes", r.BodyLen)
		}
		if r.BodyErr == nil && r.BodyLen >= 0 {
			t.Fatalf("upstream saw a cleanly finished body of %d bytes; the overflow was not aborted", r.BodyLen)
		}
	}
}

// After the body is in, the per-read body deadline must not linger on the
// connection and cancel a slow answer.
func TestSlowAnswerAfterUploadIsNotCut(t *testing.T) {
	h := newHarness(t, withLimits(func(l *Limits) { l.BodyReadTimeout = 300 * time.Millisecond }))
	h.api.handle(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(1500 * time.Millisecond): // well past BodyReadTimeout
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "computed")
	})
	req, _ := http.NewRequest(http.MethodPost, h.url("/api/v1/slow"), strings.NewReader(`{"q":1}`))
	resp, body := h.do(req)
	wantStatus(t, "slow answer after upload", resp, 200)
	if string(body) != "computed" {
		t.Fatalf("body %q", body)
	}
}

func TestStalledUploadIsAborted(t *testing.T) {
	h := newHarness(t, withLimits(func(l *Limits) { l.BodyReadTimeout = 300 * time.Millisecond }))
	c, err := h.dialTLS(h.tlsConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testTimeout))
	io.WriteString(c, "POST /api/upload HTTP/1.1\r\nHost: "+h.addr+"\r\nContent-Length: 100\r\n\r\n0123456789")
	// Never send the rest: the front must give up on the body.
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatal("the front neither answered nor closed a connection whose upload stalled")
	case err == nil && resp.StatusCode == 200:
		t.Fatal("a stalled upload completed")
	}
	waitFor(t, "the upstream to see the body end", func() bool {
		r := h.api.requests()
		return len(r) == 1 && r[0].BodyLen >= 0
	})
	if r := h.api.last(); r.BodyErr == nil {
		t.Fatalf("upstream saw a complete body of %d bytes", r.BodyLen)
	}
}

func limitedResponse(h *harness) *harness {
	h.api.handle(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		if r.URL.Query().Get("declare") == "1" {
			w.Header().Set("Content-Length", strconv.Itoa(n))
		}
		w.WriteHeader(200)
		chunk := bytes.Repeat([]byte{'r'}, 32<<10)
		for n > 0 {
			k := min(n, len(chunk))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			n -= k
		}
	})
	return h
}

const maxResp = 1 << 20

func TestGzipPassesUntouched(t *testing.T) {
	h := newHarness(t)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(bytes.Repeat([]byte("compressible hermes text "), 2000))
	zw.Close()
	want := gz.Bytes()
	h.api.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Vary", "Accept-Encoding")
		w.Write(want)
	})
	req, _ := http.NewRequest(http.MethodGet, h.url("/api/text"), nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, body := h.do(req)
	wantStatus(t, "gzip", resp, 200)
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Content-Encoding %q", resp.Header.Get("Content-Encoding"))
	}
	if !bytes.Equal(body, want) {
		t.Fatalf("gzip bytes changed: got %d bytes, want %d", len(body), len(want))
	}
	if ae := h.api.last().Header.Get("Accept-Encoding"); ae != "gzip" {
		t.Fatalf("upstream Accept-Encoding %q, want the client's", ae)
	}

	// Without the client asking, the front must not ask for (and undo)
	// compression on its own.
	h.api.handle(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ae="+r.Header.Get("Accept-Encoding"))
	})
	req, _ = http.NewRequest(http.MethodGet, h.url("/api/text"), nil)
	_, body = h.do(req)
	if string(body) != "ae=" {
		t.Fatalf("front added Accept-Encoding: %q", body)
	}
}

func TestUpstreamDownIs502AndFrontStaysHealthy(t *testing.T) {
	down := closedURL(t)
	h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = down }))
	for range 3 {
		resp, body := h.get("/api/v1/x")
		wantStatus(t, "API down", resp, http.StatusBadGateway)
		if len(body) > 64 || strings.Contains(string(body), down.Host) || strings.Contains(string(body), "127.0.0.1") ||
			strings.Contains(string(body), down.Port()) {
			t.Fatalf("502 body leaks or is long: %q", body)
		}
	}
	resp, _ := h.get("/relay/health")
	wantStatus(t, "health after upstream failures", resp, 200)
	resp, _ = h.get("/dashboard/")
	wantStatus(t, "dashboard after API failures", resp, 200)
}

// The defaults are the contract's numbers (secure-link.md, "Limits and
// timeouts" and "Availability probes"); tests elsewhere shorten them, so
// only this test notices a changed default.
func TestDefaultLimitsAreTheContracts(t *testing.T) {
	got := DefaultLimits()
	want := Limits{
		ReadHeaderTimeout:    10 * time.Second,
		BodyReadTimeout:      60 * time.Second,
		IdleTimeout:          120 * time.Second,
		MaxHeaderBytes:       64 << 10,
		MaxRequestBody:       16 << 20,
		MaxResponseBody:      64 << 20,
		UpstreamConnect:      5 * time.Second,
		UpstreamIdleRead:     2 * time.Minute,
		UpstreamTotal:        15 * time.Minute,
		TCPKeepAlive:         15 * time.Second,
		ProbeInterval:        15 * time.Second,
		ProbeTimeout:         3 * time.Second,
		MaxUpstreamIdleConns: 256,
		UpstreamIdleConn:     90 * time.Second,
	}
	if got != want {
		t.Fatalf("DefaultLimits() = %+v\nwant %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
}

package proxy

// HTTP/2 carries the method and the target as header values, which may hold
// what an HTTP/1.1 request line cannot. The front refuses them (400) before
// its CONNECT/TRACE check, and the request line it writes upstream, on
// either path, re-parses to the same method and target or is not written.

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Request sends one request with exactly the given :method and :path (and
// body, when not empty) over a raw HTTP/2 connection and returns the
// response status.
func (h *harness) h2Request(method, path, body string) int {
	h.t.Helper()
	cfg := h.tlsConfig()
	cfg.NextProtos = []string{"h2"}
	c, err := h.dialTLS(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testTimeout))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		h.t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		h.t.Fatal(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	fields := [][2]string{{":method", method}, {":scheme", "https"}, {":authority", h.addr}, {":path", path}}
	if body != "" {
		fields = append(fields, [2]string{"content-length", strconv.Itoa(len(body))})
	}
	for _, f := range fields {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true, EndStream: body == "",
	}); err != nil {
		h.t.Fatal(err)
	}
	if body != "" {
		if err := fr.WriteData(1, true, []byte(body)); err != nil {
			h.t.Fatal(err)
		}
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			h.t.Fatalf("%q %q: reading frames: %v", method, path, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				code, _ := strconv.Atoi(f.PseudoValue("status"))
				return code
			}
		case *http2.RSTStreamFrame:
			h.t.Fatalf("%q %q: stream reset (%v)", method, path, f.ErrCode)
		case *http2.GoAwayFrame:
			h.t.Fatalf("%q %q: GOAWAY (%v)", method, path, f.ErrCode)
		}
	}
}

func TestHTTP2MethodAndTargetThatAreNoHTTP11RequestLineAre400(t *testing.T) {
	h := newHarness(t)
	for _, body := range []string{"", `{"q":1}`} { // the direct and the ReverseProxy path
		for _, prefix := range []string{"/api", "/dashboard"} {
			if code := h.h2Request("GET", prefix+"/ok?a=b", body); code != 200 {
				t.Fatalf("a plain request over raw h2: status %d", code)
			}
			for _, c := range []struct{ method, path string }{
				{"TRACE ", "/x"}, {"TRACE\t", "/x"}, {"GET /admin", "/x"}, {"HEAD ", "/x"},
				{"G\xc3\xa9T", "/x"}, {"GET(", "/x"}, {"GET,PUT", "/x"},
				{"GET", "/x?a b"}, {"GET", "/x?a=1 HTTP/1.1"},
				{"GET", "/x?a=\xc3\xa9"}, {"GET", "/x?a#b"}, {"GET", "/x#frag"},
			} {
				if code := h.h2Request(c.method, prefix+c.path, body); code != http.StatusBadRequest {
					t.Errorf("%q %q (body %v): status %d, want 400", c.method, prefix+c.path, body != "", code)
				}
			}
		}
	}
	for _, c := range []struct{ method, path string }{
		{"TRACE ", "/relay/health"}, {"CONNECT ", "/relay/ws"}, {"GET", "/relay/health?a b"}, {"GET", "/relay/ws?x=\xc3\xa9"},
	} {
		if code := h.h2Request(c.method, c.path, ""); code != http.StatusBadRequest {
			t.Errorf("%q %q: status %d, want 400", c.method, c.path, code)
		}
	}
	for _, r := range append(h.api.requests(), h.dash.requests()...) {
		if r.RequestURI != "/ok?a=b" {
			t.Errorf("an upstream received %q %q", r.Method, r.RequestURI)
		}
	}
}

// The write sites refuse what the entry check would: a request line that is
// not one an HTTP/1.1 client could send is never written.
func TestBothPathsRefuseToWriteAnInvalidRequestLine(t *testing.T) {
	h := newHarness(t)
	f := h.srv.state.Load().api
	for _, c := range []struct{ method, opaque, query string }{
		{"TRACE ", "/x", ""}, {"GET /admin", "/x", ""}, {"GET", "/x", "a b"}, {"GET", "/x y", ""}, {"GET", "/x", "a#b"},
	} {
		out := &http.Request{
			Method: c.method,
			URL:    &url.URL{Scheme: "http", Host: h.api.url.Host, Opaque: c.opaque, RawQuery: c.query},
			Header: http.Header{}, Host: h.api.url.Host,
		}
		var buf bytes.Buffer
		if err := writeRequestHead(bufio.NewWriter(&buf), out); err == nil {
			t.Errorf("direct path wrote %q %q?%q", c.method, c.opaque, c.query)
		}
		resp, err := f.rp.Transport.RoundTrip(out)
		if err == nil {
			resp.Body.Close()
			t.Errorf("ReverseProxy path sent %q %q?%q", c.method, c.opaque, c.query)
		}
	}
	if n := h.api.hits.Load(); n != 0 {
		t.Fatalf("the API received %d requests", n)
	}
}

// FuzzUpstreamRequestLine holds both writers of the upstream request line
// to the contract: what they write re-parses (http.ReadRequest) to the same
// method and target, or they refuse to write it.
func FuzzUpstreamRequestLine(f *testing.F) {
	f.Add("GET", "/v1/x", "a=1&b=%20")
	f.Add("TRACE ", "/x", "")
	f.Add("GET /admin", "/x", "")
	f.Add("HEAD ", "/x", "q")
	f.Add("GET", "/x", "a b")
	f.Add("GET", "/x", "a=1 HTTP/1.1\r\nX: y")
	f.Add("GET", "/x", "a#b")
	f.Add("GET", "//double", "")
	f.Add("PROPFIND", "/x;p=1", "é")
	f.Add("M\x00", "/x", "\x7f")
	f.Fuzz(func(t *testing.T, method, opaque, query string) {
		req := &http.Request{
			Method: method,
			URL:    &url.URL{Scheme: "http", Host: "127.0.0.1:8642", Opaque: opaque, RawQuery: query},
			Proto:  "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{},
			Host:   "127.0.0.1:8642",
		}
		if method == "" {
			method = http.MethodGet
		}
		target := req.URL.RequestURI()
		reparses := func(what string, head []byte) {
			got, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
			if err != nil {
				t.Fatalf("%s wrote %q, which does not parse: %v", what, head, err)
			}
			if got.Method != method || got.RequestURI != target {
				t.Fatalf("%s wrote %q for %q %q; it parses as %q %q", what, head, method, target, got.Method, got.RequestURI)
			}
		}
		var buf bytes.Buffer
		bw := bufio.NewWriter(&buf)
		if err := writeRequestHead(bw, req); err == nil {
			bw.Flush()
			reparses("the direct path", buf.Bytes())
		}
		// The ReverseProxy path: what lineChecked lets through is written
		// by http.Transport, that is by (*http.Request).Write.
		if checkRequestLine(req.Method, target) == nil && req.Method != "" {
			buf.Reset()
			if err := req.Write(&buf); err != nil {
				t.Fatalf("Request.Write refused what lineChecked passes: %v", err)
			}
			reparses("the ReverseProxy path", buf.Bytes())
		}
	})
}

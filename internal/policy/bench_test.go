package policy

import (
	"net/http"
	"net/url"
	"testing"
)

// benchHeaders runs apply on a fresh copy of src per iteration.
func benchHeaders(b *testing.B, src http.Header, apply func(http.Header)) {
	h := make(http.Header, len(src))
	b.ReportAllocs()
	for b.Loop() {
		clear(h)
		for k, v := range src {
			h[k] = v
		}
		apply(h)
	}
}

// The header policy on a small API exchange, as the proxy applies it to
// every request: a browser-like request and a small JSON answer.
func BenchmarkRequestHeaders(b *testing.B) {
	benchHeaders(b, http.Header{
		"User-Agent": {"Mozilla/5.0"}, "Accept": {"*/*"}, "Accept-Encoding": {"gzip"},
		"Authorization": {"Bearer x"}, "Cookie": {"a=b"}, "X-Forwarded-For": {"1.2.3.4"},
	}, func(h http.Header) {
		RequestHeaders(NSAPI, h, "example.com:9443", "127.0.0.1:4000", false)
	})
}

func BenchmarkResponseHeaders(b *testing.B) {
	up := &url.URL{Scheme: "http", Host: "127.0.0.1:8642"}
	benchHeaders(b, http.Header{
		"Content-Type": {"application/json"}, "Content-Length": {"100"},
		"Date": {"Mon, 30 Nov 2026 10:00:00 GMT"}, "Cache-Control": {"no-store"},
	}, func(h http.Header) {
		StripHopByHop(h) // as the proxy's direct path applies it
		ResponseHeaders(NSAPI, h, up)
	})
}

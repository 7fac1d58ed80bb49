package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"

	"github.com/hermes-securelink/securelink/pinning"
)

// The built binary with `http3: true` serves the same origin over QUIC on
// the listen address's UDP port: same pin, same answers, Alt-Svc on TCP.
func TestServeHTTP3OnTheSameAddress(t *testing.T) {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	dir := t.TempDir()
	cfg := writeConfig(t, dir, echoRelay(t))
	appendConfig(t, cfg, "http3: true\n")
	d := startDaemon(t, cfg)

	resp, err := pinnedGet(t, d.addr, d.pin, "/relay/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, port, _ := net.SplitHostPort(d.addr)
	if got, want := resp.Header.Get("Alt-Svc"), `h3=":`+port+`"; ma=86400`; got != want {
		t.Errorf("TCP Alt-Svc = %q, want %q", got, want)
	}

	get := func(pin string) (*http.Response, error) {
		tc, err := pinning.PinnedTLSConfig("127.0.0.1", pin)
		if err != nil {
			t.Fatal(err)
		}
		tr := &http3.Transport{TLSClientConfig: tc}
		t.Cleanup(func() { tr.Close() })
		// The request's context must outlive get: its body is read after,
		// and a cancelled context resets the stream (H3_REQUEST_CANCELLED).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+d.addr+"/relay/health", nil)
		return tr.RoundTrip(req)
	}
	r3, err := get(d.pin)
	if err != nil {
		t.Fatalf("pinned HTTP/3 GET: %v; stderr: %s", err, d.stderr.String())
	}
	body, rerr := io.ReadAll(r3.Body)
	r3.Body.Close()
	if r3.Proto != "HTTP/3.0" || r3.StatusCode != 200 || !strings.Contains(string(body), `"hermes_secure_proxy"`) {
		t.Fatalf("HTTP/3 answer %s %d %s (read: %v, header %v)", r3.Proto, r3.StatusCode, body, rerr, r3.Header)
	}
	if r3.Header.Get("Alt-Svc") != "" {
		t.Errorf("HTTP/3 response advertises Alt-Svc %q", r3.Header.Get("Alt-Svc"))
	}

	// A well-formed pin of another key.
	if _, err := get("sha256/" + strings.Repeat("A", 43) + "="); err == nil {
		t.Fatal("HTTP/3 handshake accepted a wrong pin")
	}
}

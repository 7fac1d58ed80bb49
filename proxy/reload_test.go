package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/testfake"
	"github.com/hermes-securelink/securelink/pinning"
)

func TestReloadRotatedIdentityKeepsOpenRelaySocket(t *testing.T) {
	h := newHarness(t)
	c := h.mustDialWS("/relay/ws", "")
	testfake.Authenticate(t, c, testfake.GoodCode)
	echoWS(h.api)
	pass := h.mustDialWS("/api/ws", "")

	oldPin := h.id.Pin
	rotated, err := pinning.Rotate(h.idCfg)
	if err != nil {
		t.Fatal(err)
	}
	if rotated.Pin == oldPin {
		t.Fatal("rotation kept the pin")
	}
	if err := h.srv.Reload(h.opts, rotated); err != nil {
		t.Fatalf("Reload: %v", err)
	}

	// Established connections keep working.
	wsSend(t, c, websocket.MessageText, []byte("after rotation"))
	if _, msg, err := wsRead(c); err != nil || string(msg) != "after rotation" {
		t.Fatalf("bridged socket after rotation: %q %v", msg, err)
	}
	echoRoundTrip(t, pass)

	// New handshakes show the new pin.
	nc, err := h.dialTLS(h.tlsConfigFor("127.0.0.1", rotated.Pin))
	if err != nil {
		t.Fatalf("handshake pinned to the rotated identity: %v", err)
	}
	if got := pinning.SPKIPin(nc.ConnectionState().PeerCertificates[0]); got != rotated.Pin {
		t.Fatalf("new handshake presented %s", got)
	}
	nc.Close()
	if _, err := h.dialTLS(h.tlsConfigFor("127.0.0.1", oldPin)); !errors.Is(err, pinning.ErrPinMismatch) {
		t.Fatalf("handshake pinned to the old identity: %v, want a pin mismatch", err)
	}
	if h.srv.Identity().Pin != rotated.Pin {
		t.Fatal("Identity() does not report the rotated identity")
	}
	h.id = rotated // later harness clients pin the new identity
	resp, _ := h.get("/relay/health")
	wantStatus(t, "health after rotation", resp, 200)
}

func TestReloadChangedAPIUpstream(t *testing.T) {
	h := newHarness(t)
	cl := h.client() // one keep-alive connection across the reload
	get := func() {
		t.Helper()
		resp, err := cl.Get(h.url("/api/v1/x"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		wantStatus(t, "GET /api/v1/x", resp, 200)
	}
	get()
	second := newAPI(t)
	opts := h.opts
	opts.Upstreams.API = second.url
	if err := h.srv.Reload(opts, h.id); err != nil {
		t.Fatal(err)
	}
	get()
	get()
	if a, b := h.api.hits.Load(), second.hits.Load(); a != 1 || b != 2 {
		t.Fatalf("old upstream %d requests, new %d; want 1 and 2", a, b)
	}
	// The availability cache is forgotten, so health probes the new upstream.
	resp, _ := h.get("/relay/health")
	wantStatus(t, "health", resp, 200)
	if second.probes.Load() != 1 {
		t.Fatalf("new upstream probed %d times, want 1", second.probes.Load())
	}
}

func TestReloadChangedRelayKeepsEstablishedBridge(t *testing.T) {
	h := newHarness(t)
	c := h.mustDialWS("/relay/ws", "")
	testfake.Authenticate(t, c, testfake.GoodCode)
	second := testfake.NewRelay(t, nil)
	opts := h.opts
	opts.Upstreams.Relay = second.URL
	if err := h.srv.Reload(opts, h.id); err != nil {
		t.Fatal(err)
	}
	wsSend(t, c, websocket.MessageText, []byte("old relay"))
	if _, msg, err := wsRead(c); err != nil || string(msg) != "old relay" {
		t.Fatalf("established bridge after reload: %q %v", msg, err)
	}
	c2 := h.mustDialWS("/relay/ws", "")
	testfake.Authenticate(t, c2, testfake.GoodCode)
	if h.relay.Upgrades.Load() != 1 || second.Upgrades.Load() != 1 {
		t.Fatalf("upgrades: old relay %d, new relay %d; want 1 each", h.relay.Upgrades.Load(), second.Upgrades.Load())
	}
}

func TestReloadNamesApplyToNewRequestsAndHandshakes(t *testing.T) {
	h := newHarness(t)
	resp, _ := h.rawReq("GET", "/relay/health", "Host: "+extraName)
	wantStatus(t, "extra name before reload", resp, 200)
	opts := h.opts
	opts.ExtraNames = nil
	if err := h.srv.Reload(opts, h.id); err != nil {
		t.Fatal(err)
	}
	resp, _ = h.rawReq("GET", "/relay/health", "Host: "+extraName)
	wantStatus(t, "removed extra name", resp, http.StatusMisdirectedRequest)
	cfg := h.tlsConfig()
	cfg.ServerName = extraName
	if _, err := h.dialTLS(cfg); err == nil || !strings.Contains(err.Error(), "unrecognized name") {
		t.Fatalf("SNI of a removed extra name: %v", err)
	}
}

func TestInvalidReloadKeepsPreviousState(t *testing.T) {
	h := newHarness(t)
	bad := h.opts
	bad.AuthorityPort = 0
	if err := h.srv.Reload(bad, h.id); err == nil {
		t.Fatal("Reload accepted an authority without a port")
	}
	bad = h.opts
	bad.Upstreams.API = nil
	if err := h.srv.Reload(bad, h.id); err == nil {
		t.Fatal("Reload accepted a missing upstream")
	}
	bad = h.opts
	bad.Limits.MaxRequestBody = 0
	if err := h.srv.Reload(bad, h.id); err == nil {
		t.Fatal("Reload accepted an unbounded body")
	}
	if err := h.srv.Reload(h.opts, nil); err == nil {
		t.Fatal("Reload accepted no identity")
	}
	resp, _ := h.get("/api/x")
	wantStatus(t, "API after rejected reloads", resp, 200)
	if h.srv.Identity().Pin != h.id.Pin {
		t.Fatal("a rejected reload changed the identity")
	}
}

func TestNewRefusesIncompleteOptions(t *testing.T) {
	h := newHarness(t)
	if _, err := New(h.opts, nil); err == nil {
		t.Fatal("New accepted no identity")
	}
	o := h.opts
	o.Limits.ProbeInterval = 0
	if _, err := New(o, h.id); err == nil {
		t.Fatal("New accepted a zero probe interval")
	}
	o = h.opts
	o.AuthorityHost = ""
	if _, err := New(o, h.id); err == nil {
		t.Fatal("New accepted no authority")
	}
}

func TestShutdownLetsInFlightRequestsFinish(t *testing.T) {
	h := newHarness(t)
	started, release := h.holdUpstream(t)
	type result struct {
		code int
		body string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := h.client().Get(h.url("/api/slow"))
		if err != nil {
			res <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		res <- result{resp.StatusCode, string(b), err}
	}()
	<-started
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		shut <- h.srv.Shutdown(ctx)
	}()
	// New connections are refused once Shutdown has closed the listener.
	waitFor(t, "the listener to close", func() bool {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	release()
	if r := <-res; r.err != nil || r.code != 200 || r.body != "finished" {
		t.Fatalf("in-flight request during Shutdown: %d %q %v", r.code, r.body, r.err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// Graceful stop ends an open event stream at once and cleanly (the client
// reads a properly terminated response, no error), so the drain is not held
// for its whole grace, while an ordinary in-flight request still completes.
// The stream must end while the slow request is still held by the upstream:
// that ordering, not a clock, is the assertion.
func TestShutdownEndsEventStreamsCleanlyAndLetsRequestsFinish(t *testing.T) {
	for _, p := range forwardPaths {
		for _, cl := range strayClients {
			t.Run(p.name+"/"+cl.name, func(t *testing.T) {
				h := newHarness(t)
				release, started := make(chan struct{}), make(chan struct{})
				releaseAll := sync.OnceFunc(func() { close(release) })
				t.Cleanup(releaseAll) // before the upstream's Close waits for its handlers
				h.api.handle(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
					if r.URL.Path == "/slow" {
						close(started)
						<-release
						io.WriteString(w, "finished")
						return
					}
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, "data: 1\n\n")
					w.(http.Flusher).Flush()
					select { // an endless stream, until the front leaves
					case <-r.Context().Done():
					case <-release:
					}
				})
				resp, err := h.clientProto(cl.h2).Do(p.request(t, h, "/api/events"))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if cl.h2 != (resp.ProtoMajor == 2) {
					t.Fatalf("client spoke %s", resp.Proto)
				}
				br := bufio.NewReader(resp.Body)
				if line, err := br.ReadString('\n'); err != nil || line != "data: 1\n" {
					t.Fatalf("first event %q, %v", line, err)
				}
				type result struct {
					body string
					err  error
				}
				sse := make(chan result, 1)
				go func() {
					b, err := io.ReadAll(br)
					sse <- result{string(b), err}
				}()
				slow := make(chan result, 1)
				go func() {
					resp, err := h.clientProto(cl.h2).Do(p.request(t, h, "/api/slow"))
					if err != nil {
						slow <- result{err: err}
						return
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					slow <- result{string(b), err}
				}()
				<-started
				shut := make(chan error, 1)
				go func() {
					// The daemon's grace (cmd/securelink: shutdownGrace).
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					shut <- h.srv.Shutdown(ctx)
				}()
				select {
				case r := <-sse:
					if r.err != nil || r.body != "\n" {
						t.Fatalf("event stream ended with %q, %v; want a clean end", r.body, r.err)
					}
				case <-time.After(testTimeout):
					t.Fatal("Shutdown did not end the event stream while an ordinary request was in flight")
				}
				releaseAll()
				if r := <-slow; r.err != nil || r.body != "finished" {
					t.Fatalf("in-flight request during Shutdown: %q %v", r.body, r.err)
				}
				if err := <-shut; err != nil {
					t.Fatalf("Shutdown: %v (the drain waited for the whole grace)", err)
				}
			})
		}
	}
}

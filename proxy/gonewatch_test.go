package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/pinning"
)

// An exchange that outlasts the watch's ticks is armed: the client leaving
// cancels its connection, and done reports the cancel (the connection is
// not reused). One that ends first is never armed and its connection stays
// usable; the watch stops ticking once nothing is listed.
func TestGoneWatchArmsSlowExchanges(t *testing.T) {
	var g goneWatch

	quick, _ := sendPair(t)
	qctx, qcancel := context.WithCancel(context.Background())
	var qw clientWait
	g.add(&qw, qctx, quick)
	// Not armed at once: at least two ticks pass first (one to list it
	// before a tick, the next to arm it).
	g.mu.Lock()
	armedEarly := qw.stop != nil && g.gen < qw.gen+2
	g.mu.Unlock()
	if armedEarly {
		t.Fatal("an exchange was armed before it had lasted a tick")
	}
	if !g.done(&qw) {
		t.Fatal("an exchange that ended at once reports a cancel")
	}
	qcancel()

	slow, _ := sendPair(t)
	sctx, scancel := context.WithCancel(context.Background())
	var sw clientWait
	g.add(&sw, sctx, slow)
	// Armed after one to two ticks: wait until it is, then leave.
	deadline := time.Now().Add(testTimeout)
	for {
		g.mu.Lock()
		armed := sw.stop != nil
		g.mu.Unlock()
		if armed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a waiting exchange was never armed")
		}
		time.Sleep(time.Millisecond)
	}
	scancel()
	for !slow.canceled.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the client leaving did not cancel the exchange's connection")
		}
		time.Sleep(time.Millisecond)
	}
	if g.done(&sw) {
		t.Fatal("done reports no cancel after the exchange was canceled")
	}
	if quick.canceled.Load() {
		t.Fatal("the exchange that had ended was canceled")
	}
	for {
		g.mu.Lock()
		ticking := g.ticking
		g.mu.Unlock()
		if !ticking {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch kept ticking with nothing listed")
		}
		time.Sleep(time.Millisecond)
	}
	// A second done (a panic's cleanup after finish) changes nothing.
	if !g.done(&sw) {
		t.Fatal("a repeated done reports a cancel")
	}
}

// A request whose client has already left is not sent upstream at all:
// the direct path answers 499 before taking a connection, not a tick later.
func TestDirectPathSendsNothingForAClientGone(t *testing.T) {
	var hits atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	id, err := pinning.LoadOrCreate(pinning.IdentityConfig{
		StateDir:  t.TempDir() + "/s",
		Authority: pinning.Authority{Host: "127.0.0.1", Port: 443},
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{
		AuthorityHost: "127.0.0.1", AuthorityPort: 443,
		Upstreams: Upstreams{Relay: u, API: u, Dashboard: u},
		Limits:    DefaultLimits(), Log: zerolog.Nop(),
	}, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	serve := func(ctx context.Context) int {
		r := (&http.Request{
			Method: http.MethodGet, URL: &url.URL{Path: "/api/x"}, RequestURI: "/api/x",
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Host: "127.0.0.1:443",
			Header: http.Header{}, Body: http.NoBody, RemoteAddr: "127.0.0.1:40000",
		}).WithContext(ctx)
		w := &discardWriter{h: http.Header{}}
		s.ServeHTTP(w, r)
		return w.status
	}
	// The first leaves a pooled connection (a dial would fail on the
	// canceled context by itself).
	if st := serve(context.Background()); st != http.StatusOK || hits.Load() != 1 {
		t.Fatalf("status %d, %d requests upstream", st, hits.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if st := serve(ctx); st != 499 || hits.Load() != 1 {
		t.Fatalf("status %d, %d requests upstream; want 499 and no new one", st, hits.Load())
	}
}

package relay

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

// flood counts how n parallel upgrades from localIP on front ended; each
// admitted one sends a wrong guess, which the Relay holds. The admitted
// connections are dropped when the test function returns (t.Cleanup would be
// too late: the bridge's shutdown would wait for their close handshakes).
func flood(t *testing.T, front *httptest.Server, localIP string, n int) (admitted, refused int, conns []*websocket.Conn) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, resp, err := dial(t, front, dialOpt{localIP: localIP})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := c.Write(ctx, websocket.MessageText, testfake.AuthFrame("WRONG1")); err != nil {
					t.Errorf("auth frame: %v", err)
				}
				conns = append(conns, c)
			case resp != nil && resp.StatusCode == http.StatusTooManyRequests:
				refused++
			default:
				t.Errorf("upgrade: %v (resp %v)", err, resp)
			}
		}()
	}
	wg.Wait()
	return admitted, refused, conns
}

func dropAll(conns *[]*websocket.Conn) {
	for _, c := range *conns {
		_ = c.CloseNow()
	}
}

// spec: a direct source may have at most 5 unauthenticated /relay/ws
// sessions at once; further upgrades get 429 and never reach the Relay.
func TestBridgeBoundsUnauthenticatedSessionsPerSource(t *testing.T) {
	relay, b, front := setup(t, func(r *testfake.Relay) { r.HoldAuth = make(chan struct{}) }, nil)
	defer close(relay.HoldAuth) // answers every held guess, so the sessions end at once
	admitted, refused, conns := flood(t, front, "127.0.0.1", 40)
	defer dropAll(&conns)
	if admitted != 5 || refused != 35 {
		t.Fatalf("40 parallel guesses: %d admitted, %d refused with 429; want 5 and 35", admitted, refused)
	}
	waitFor(t, "5 held auth frames", func() bool { return relay.Held.Load() == 5 })
	if n := relay.Upgrades.Load(); n != 5 {
		t.Fatalf("the Relay saw %d upgrades, want 5", n)
	}

	// Another source is unaffected.
	other := mustDial(t, front, dialOpt{localIP: "127.0.0.2"})
	if n := relay.Upgrades.Load(); n != 6 {
		t.Fatalf("127.0.0.2's upgrade: the Relay saw %d upgrades, want 6", n)
	}
	conns = append(conns, other)

	// One held guess is answered (auth.fail, the Relay closes): its slot
	// comes back and admits one more upgrade from the same source.
	relay.HoldAuth <- struct{}{}
	waitFor(t, "a released slot", func() bool { return b.pending.held("127.0.0.1/32") == 4 })
	admitted, refused, more := flood(t, front, "127.0.0.1", 3)
	conns = append(conns, more...)
	if admitted != 1 || refused != 2 {
		t.Fatalf("after one slot came back: %d admitted, %d refused; want 1 and 2", admitted, refused)
	}
	if n := relay.Upgrades.Load(); n != 7 {
		t.Fatalf("the Relay saw %d upgrades, want 7", n)
	}
}

// A session stops counting at the Relay's first auth.ok, and a session that
// ends before its verdict gives its slot back.
func TestBridgeUnauthenticatedSlotFreedByAuthOKAndEnd(t *testing.T) {
	bothModes(t, testBridgeUnauthenticatedSlotFreedByAuthOKAndEnd)
}

func testBridgeUnauthenticatedSlotFreedByAuthOKAndEnd(t *testing.T) {
	relay, b, front := setup(t, func(r *testfake.Relay) { r.HoldAuth = make(chan struct{}) },
		func(o *Options) { o.MaxUnauthenticated = 1 })
	defer close(relay.HoldAuth)
	const src = "127.0.0.1/32"
	a := mustDial(t, front, dialOpt{localIP: "127.0.0.1"})
	if _, resp, err := dial(t, front, dialOpt{localIP: "127.0.0.1"}); err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second unauthenticated session: %v %v, want 429", err, resp)
	}
	verdict := make(chan string, 1)
	go func() { verdict <- testfake.Authenticate(t, a, testfake.GoodCode) }()
	waitFor(t, "the held auth frame", func() bool { return relay.Held.Load() == 1 })
	relay.HoldAuth <- struct{}{}
	if got := <-verdict; got != testfake.AuthOKMsg {
		t.Fatalf("verdict %s", got)
	}
	waitFor(t, "the slot after auth.ok", func() bool { return b.pending.held(src) == 0 })

	// a is authenticated and still bridged; a new guess is admitted.
	c := mustDial(t, front, dialOpt{localIP: "127.0.0.1"})
	send(t, a, websocket.MessageText, []byte("still here"))
	if _, msg, err := readMsg(t, a); err != nil || string(msg) != "still here" {
		t.Fatalf("authenticated session after the slot went: %q %v", msg, err)
	}
	// c leaves before any verdict: its slot comes back.
	_ = c.Close(websocket.StatusNormalClosure, "")
	waitFor(t, "the slot after the session ended", func() bool { return b.pending.held(src) == 0 })
	mustDial(t, front, dialOpt{localIP: "127.0.0.1"})
}

// The shared source "reach" allows the connector's stream limit (16), so one
// Reach device cannot lock the others out; direct sources are separate.
func TestBridgeReachSourceAllowsStreamLimit(t *testing.T) {
	relay := testfake.NewRelay(t, func(r *testfake.Relay) { r.HoldAuth = make(chan struct{}) })
	b := newBridge(t, testOptions(t, relay))
	defer close(relay.HoldAuth)
	brokerFront, directFront := frontFor(t, b, true), frontFor(t, b, false)
	admitted, refused, conns := flood(t, brokerFront, "127.0.0.1", 20)
	defer dropAll(&conns)
	if admitted != 16 || refused != 4 {
		t.Fatalf("20 parallel broker upgrades: %d admitted, %d refused; want 16 and 4", admitted, refused)
	}
	admitted, refused, more := flood(t, directFront, "127.0.0.1", 6)
	conns = append(conns, more...)
	if admitted != 5 || refused != 1 {
		t.Fatalf("direct upgrades beside reach: %d admitted, %d refused; want 5 and 1", admitted, refused)
	}
	waitFor(t, "21 held auth frames", func() bool { return relay.Held.Load() == 21 })
}

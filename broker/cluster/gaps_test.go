package cluster

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// TestForwardedClientKeepalive: a client relayed by an instance that does
// not hold its host is pinged there with the spec's keepalive (shortened
// here); once it stops answering, that instance closes it and the peer
// link, so the stream ends on the owner and the host gets its CLOSE.
func TestForwardedClientKeepalive(t *testing.T) {
	r := newRigWith(t, shortLease(rigEngineTimeout), ownFirst, func(c *server.Config) {
		c.PingInterval = 50 * time.Millisecond
		c.PongTimeout = 400 * time.Millisecond
	})
	route := wire.Secret("route-" + testenv.RandomSecret(""))
	hA := r.hostOn(0)
	r.publishRoute(hA, "dev1", route)
	r.mirrored(hA, 1, route)
	drainOpens(hA)

	// A client that answers pings stays through many intervals.
	live, liveID := r.matched(hA, 1, wire.KindRoute, route)

	// A client that stops reading answers no ping (the WebSocket library
	// answers them while it reads).
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Step)
	defer cancel()
	silent := r.dialRaw(1)
	reg, _ := wire.Marshal(wire.Register{Role: wire.RoleClient, HostID: r.hostID, ConnectionID: wire.NewID(), CredentialKind: wire.KindRoute, Token: route})
	if err := silent.Write(ctx, websocket.MessageText, reg); err != nil {
		t.Fatal(err)
	}
	_, data, err := silent.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := wire.ParseBrokerMessage(data)
	mm, ok := m.(wire.Matched)
	if err != nil || !ok {
		t.Fatalf("silent client not matched: %#v %v", m, err)
	}
	if o, ok := hA.msg().(wire.Open); !ok || o.StreamID != mm.StreamID {
		t.Fatal("host did not get open for the silent client")
	}
	// The silent client's stream ends on the owner: the host gets CLOSE.
	for {
		rr := hA.read()
		if rr.err != nil {
			t.Fatalf("host socket: %v", rr.err)
		}
		f, err := wire.ParseFrame(rr.data)
		if err == nil && f.StreamID == mm.StreamID && f.Flags == wire.FlagClose {
			break
		}
		if err == nil && f.StreamID == liveID {
			t.Fatal("the live client's stream ended")
		}
	}
	if n := r.brokers[1].B.Stats().Counts["forward:ping_timeout"]; n != 1 {
		t.Fatalf("forward:ping_timeout = %d, want 1", n)
	}
	// The silent client, reading again, finds its socket closed by the
	// forwarding instance.
	for {
		_, _, err := silent.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) && (ce.Code != websocket.StatusGoingAway || ce.Reason != "ping timeout") {
				t.Fatalf("silent client closed with %v, want 1001 ping timeout", err)
			}
			break
		}
	}
	// The answering one still relays, well past the pong timeout.
	time.Sleep(600 * time.Millisecond)
	echo(t, hA, live, liveID, payload(20_000))
	if n := r.brokers[1].B.Stats().Counts["forward:ping_timeout"]; n != 1 {
		t.Fatalf("forward:ping_timeout = %d after the live client, want 1", n)
	}
}

// holdWatch holds back the changes instance i's mirror receives from the
// engine until the returned function is called (or the test ends).
func (r *rig) holdWatch(i int) (release func()) {
	gate := make(chan struct{})
	r.shared[i].followGate.Store(&gate)
	var once sync.Once
	release = func() { once.Do(func() { r.shared[i].followGate.Store(nil); close(gate) }) }
	r.t.Cleanup(release)
	return release
}

// TestMirrorMissAsksTheEngine: a client that lands on an instance whose
// mirror has not yet received a publication (its watch held back) is not
// refused `unauthorized`: the instance reads the credential from the
// engine once and matches it, whether the host is elsewhere (forwarded)
// or here (a bootstrap, consumed through the read).
func TestMirrorMissAsksTheEngine(t *testing.T) {
	r := newRig(t, 10*time.Minute)
	hA := r.hostOn(0)
	release := r.holdWatch(1)
	route := wire.Secret("route-" + testenv.RandomSecret(""))
	r.publishRoute(hA, "dev1", route)
	c, id := r.matched(hA, 1, wire.KindRoute, route)
	echo(t, hA, c, id, payload(10_000))
	if n := r.brokers[1].B.Stats().Counts["cluster:mirror_miss"]; n != 1 {
		t.Fatalf("cluster:mirror_miss = %d, want 1", n)
	}
	// An unknown digest is still refused, after the one read.
	if _, m := r.client(1, wire.KindRoute, wire.Secret("route-"+testenv.RandomSecret("")), wire.NewID()); code(m) != wire.CodeUnauthorized {
		t.Fatalf("unknown route: %#v", m)
	}

	// The host, now also registered on B, published a bootstrap on A
	// that B's mirror has not received: B consumes it through the read.
	hB := r.hostOn(1)
	boot := wire.Secret("boot-" + testenv.RandomSecret(""))
	r.publishBootstrap(hA, "pair1", boot)
	c, id = r.matched(hB, 1, wire.KindBootstrap, boot)
	echo(t, hB, c, id, payload(1000))
	if _, m := r.client(1, wire.KindBootstrap, boot, wire.NewID()); code(m) != wire.CodeReplayed {
		t.Fatalf("bootstrap used through the read, presented again on B: %#v, want replayed", m)
	}
	if _, m := r.client(0, wire.KindBootstrap, boot, wire.NewID()); code(m) != wire.CodeReplayed {
		t.Fatalf("bootstrap used through the read, presented on A: %#v, want replayed", m)
	}
	release()
}

// TestReplaySharesAcrossInstances: the host's and a credential's replay
// shares are counted in the engine, so two instances holding the host
// fill one share together; a client over it is refused `quota_exceeded`
// and its connection_id is not kept as accepted.
func TestReplaySharesAcrossInstances(t *testing.T) {
	r := newRigWith(t, 10*time.Minute, ownFirst, func(c *server.Config) {
		c.ReplayPerHost, c.ReplayPerCredential = 5, 3
	})
	hA := r.hostOn(0)
	route1 := wire.Secret("route-" + testenv.RandomSecret(""))
	route2 := wire.Secret("route-" + testenv.RandomSecret(""))
	before := r.mirroredOps(1)
	r.publishRoute(hA, "dev1", route1)
	r.publishRoute(hA, "dev2", route2)
	testenv.WaitFor(t, "B mirrors both routes", func() bool { return r.mirroredOps(1) >= before+2 })
	// The host holds registrations on A and B at once (a long lease: A
	// keeps its own), so clients of each are matched where they land.
	hB := r.hostOn(1)

	// route1: two clients on A and one on B fill its share of 3.
	r.matched(hA, 0, wire.KindRoute, route1)
	r.matched(hA, 0, wire.KindRoute, route1)
	r.matched(hB, 1, wire.KindRoute, route1)
	over := wire.NewID()
	if _, m := r.client(1, wire.KindRoute, route1, over); code(m) != wire.CodeQuotaExceeded {
		t.Fatalf("a 4th client of route1 on B: %#v, want quota_exceeded", m)
	}
	// Its connection_id was not kept: presented again (here on C, which
	// forwards to the host's newest instance) it is over the share again,
	// not replayed.
	if _, m := r.client(2, wire.KindRoute, route1, over); code(m) != wire.CodeQuotaExceeded {
		t.Fatalf("the refused connection_id again, on C: %#v, want quota_exceeded", m)
	}
	// route2: two clients on B bring the host to its share of 5.
	r.matched(hB, 1, wire.KindRoute, route2)
	r.matched(hB, 1, wire.KindRoute, route2)
	for _, i := range []int{0, 1} {
		if _, m := r.client(i, wire.KindRoute, route2, wire.NewID()); code(m) != wire.CodeQuotaExceeded {
			t.Fatalf("a 6th client of the host on broker %d: %#v, want quota_exceeded", i, m)
		}
	}
	if n := r.brokers[0].B.Stats().Counts["cluster:replay_share_full"] + r.brokers[1].B.Stats().Counts["cluster:replay_share_full"]; n != 4 {
		t.Fatalf("cluster:replay_share_full = %d, want 4", n)
	}
}

// TestReloadLoadsAddedHosts: a host added to the hosts file and reloaded
// (SIGHUP) on one instance registers and publishes there; another
// instance, whose mirror skipped that publication while the host was not
// in its list, loads it from the engine when it reloads too, so its first
// client is matched from the mirror, without a miss.
func TestReloadLoadsAddedHosts(t *testing.T) {
	r := newRig(t, 10*time.Minute)
	id, tok, err := store.AddHost(r.hostsFile)
	if err != nil {
		t.Fatal(err)
	}
	host2, err := wire.ParseID(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.brokers[0].B.ReloadHosts(); err != nil {
		t.Fatal(err)
	}
	h2 := r.dial(0)
	h2.sendMsg(wire.Register{Role: wire.RoleHost, HostID: host2, ConnectionID: wire.NewID(), CredentialKind: wire.KindHost, Token: tok})
	if _, ok := h2.msg().(wire.Registered); !ok {
		t.Fatal("the added host did not register on A")
	}
	route2 := wire.Secret("route-" + testenv.RandomSecret(""))
	r.publishRoute(h2, "dev2", route2)
	// A later publication of the first host reaching B's mirror means
	// B's watch delivered (and skipped) the added host's before it.
	hA := r.hostOn(0)
	before := r.mirroredOps(1)
	r.publishRoute(hA, "dev1", wire.Secret("route-"+testenv.RandomSecret("")))
	testenv.WaitFor(t, "B mirrors the first host's route", func() bool { return r.mirroredOps(1) > before })

	if err := r.brokers[1].B.ReloadHosts(); err != nil {
		t.Fatal(err)
	}
	c := r.dial(1)
	c.sendMsg(wire.Register{Role: wire.RoleClient, HostID: host2, ConnectionID: wire.NewID(), CredentialKind: wire.KindRoute, Token: route2})
	mm, ok := c.msg().(wire.Matched)
	if !ok {
		t.Fatal("the added host's route not matched through B")
	}
	if o, ok := h2.msg().(wire.Open); !ok || o.StreamID != mm.StreamID {
		t.Fatal("the added host did not get open")
	}
	echo(t, h2, c, mm.StreamID, payload(5000))
	if n := r.brokers[1].B.Stats().Counts["cluster:mirror_miss"]; n != 0 {
		t.Fatalf("B read %d credentials from the engine at a miss; its reload should have loaded them", n)
	}
}

// TestRouteReplacementIsAtomic: a publish that replaces a route (the new
// route's put and the old one's delete) is one atomic batch in the
// engine. With the engine lost after the first op was sent, the publish
// answers `unavailable` and the engine shows neither half: the old route
// stays, the new one never appears.
func TestRouteReplacementIsAtomic(t *testing.T) {
	r := newRig(t, 10*time.Minute)
	if !r.shared[0].AtomicWrites() {
		t.Fatal("the engine does not take atomic batches (nats-server >= 2.12 expected)")
	}
	hA := r.hostOn(0)
	engine := func(tok wire.Secret) bool {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Step)
		defer cancel()
		_, found, err := r.shared[1].LookupCredential(ctx, wire.TokenDigest(string(tok)))
		if err != nil {
			t.Fatal(err)
		}
		return found
	}
	t1 := wire.Secret("route-" + testenv.RandomSecret(""))
	t2 := wire.Secret("route-" + testenv.RandomSecret(""))
	t3 := wire.Secret("route-" + testenv.RandomSecret(""))
	r.publishRoute(hA, "dev1", t1)
	r.publishRoute(hA, "dev1", t2) // replaces t1, through a batch
	if engine(t1) || !engine(t2) {
		t.Fatalf("after a replacement the engine holds t1=%v t2=%v, want only t2", engine(t1), engine(t2))
	}

	// The engine is lost after the replacement's first op was sent.
	var ops atomic.Int32
	hook := func(i int) {
		ops.Add(1)
		if i == 0 {
			r.shared[0].nc.Close()
		}
	}
	r.shared[0].writeHook.Store(&hook)
	hA.sendMsg(wire.PublishRoute{CredentialID: "dev1", TokenSHA256: wire.TokenDigest(string(t3)),
		ExpiresAt: time.Now().Add(time.Hour).Unix(), DeviceIDHash: wire.TokenDigest("device")})
	if m := hA.reply(); code(m) != wire.CodeUnavailable {
		t.Fatalf("a replacement the engine lost half-way: %#v, want unavailable", m)
	}
	if n := ops.Load(); n != 1 {
		t.Fatalf("the write went past its first op (%d) after the engine was lost", n)
	}
	for range 3 { // and it stays so
		if !engine(t2) || engine(t3) {
			t.Fatalf("after a replacement lost half-way the engine holds t2=%v t3=%v, want t2 only", engine(t2), engine(t3))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestEachEngineOperationHasItsTimeout: engine_timeout bounds one engine
// operation. A match records its client in the engine with a chain of
// them (the host's and the credential's replay shares, read and written,
// then a bootstrap's use: five round trips for a host's first client);
// behind an engine where each takes about a third of the timeout the
// bootstrap is matched, not answered `unavailable` for the chain's sum.
func TestEachEngineOperationHasItsTimeout(t *testing.T) {
	const timeout = time.Second
	var link netDelay
	r := newRigTimeout(t, shortLease(timeout), timeout, func(all []string, i int) []string {
		if i == 0 {
			return []string{"nats://" + delayProxy(t, all[0][len("nats://"):], &link)}
		}
		return ownFirst(all, i)
	}, nil)
	hA := r.hostOn(0)
	boot := wire.Secret("boot-" + testenv.RandomSecret(""))
	r.publishBootstrap(hA, "pair1", boot)
	link.set(timeout / 6) // each way: a round trip is a third of the timeout
	c, id := r.matched(hA, 0, wire.KindBootstrap, boot)
	echo(t, hA, c, id, payload(1000))
}

package cluster

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// TestLeasesSurviveASlowEngineAtScale: many held leases behind an engine
// far away (every byte to and from the NATS node is delayed each way) are
// all renewed within their TTL. With renewParallel writes in flight a
// round over the leases takes `batches` round trips, two thirds of the
// lease: longer than OwnerTTL/3, so rounds run back to back, and shorter
// than the lease, which every lease outlives only because each round
// renews the oldest first (in another order a lease renewed in the first
// batch of one round and the last of the next waits almost two rounds,
// 1.25 leases). One write at a time a round takes two minutes. The round
// is the delay's, not the CPU's: a loaded machine slows each of the round's
// round trips, so they are few and long (a third of the lease is left for
// their slowing, ~290 ms each), and the engine_timeout is the product's
// default with the shortest lease it allows.
func TestLeasesSurviveASlowEngineAtScale(t *testing.T) {
	nc := startNATSCluster(t)
	const timeout = outageEngineTimeout
	ttl := shortLease(timeout)
	// A round: 8 batches of renewParallel (32) writes.
	const batches, leases = 8, 256
	var link netDelay // none while the buckets are made
	ow := ownersBehind(t, nc, &link, timeout, ttl)
	link.set(ttl * 2 / 3 / (2 * batches))

	hosts := make([]wire.ID, leases)
	var lost atomic.Int64
	var wg sync.WaitGroup
	work := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := ow.Hold(context.Background(), hosts[i], wire.NewID(), func(server.LeaseLoss) { lost.Add(1) }); err != nil {
					t.Errorf("hold %d: %v", i, err)
				}
			}
		}()
	}
	for i := range hosts {
		hosts[i] = wire.NewID()
		work <- i
	}
	close(work)
	wg.Wait()

	time.Sleep(2 * ttl)
	if n := lost.Load(); n != 0 {
		t.Fatalf("%d of %d leases lost in %v while their hosts stayed", n, leases, 2*ttl)
	}
	gctx, gcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer gcancel()
	var gets sync.WaitGroup
	for _, h := range hosts[:50] { // at once: each read is a round trip
		gets.Add(1)
		go func() {
			defer gets.Done()
			if _, err := ow.owner.Get(gctx, ownerKey(h)); err != nil {
				t.Errorf("lease of %v not in the engine: %v", h, err)
			}
		}()
	}
	gets.Wait()
}

// ownersBehind opens instance b0's state and owner leases (engine_timeout
// timeout, owner_ttl ttl) through a delayProxy to node 0 of nc.
func ownersBehind(t *testing.T, nc *natsCluster, link *netDelay, timeout, ttl time.Duration) *Owners {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	st, err := Open(ctx, Options{
		InstanceID: "b0", URLs: []string{"nats://" + delayProxy(t, nc.url(0)[len("nats://"):], link)},
		BucketPrefix: "reach", Replicas: 3, Timeout: timeout,
	})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ca := newPeerCA(t)
	cert, key := ca.issue("b0")
	ow, err := st.OpenOwners(context.Background(), PeerOptions{
		Advertise: "127.0.0.1:1", CertFile: cert, KeyFile: key, CAFile: ca.CAFile, OwnerTTL: ttl,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ow.Close)
	return ow
}

// netDelay is how long a delayProxy holds each chunk, in each direction;
// it may change while the proxy runs (a chunk keeps the delay it was read
// with, and order is kept, so a long delay holds back what follows).
type netDelay struct{ toEngine, fromEngine atomic.Int64 }

func (n *netDelay) set(d time.Duration) {
	n.toEngine.Store(int64(d))
	n.fromEngine.Store(int64(d))
}

// delayProxy relays TCP connections to target on 127.0.0.1, holding every
// chunk for the current delay of its direction: an engine further away
// than loopback.
func delayProxy(t *testing.T, target string, d *netDelay) string {
	t.Helper()
	return testenv.Forward(t, target, func(c, u net.Conn) {
		go delayed(u, c, &d.toEngine)
		go delayed(c, u, &d.fromEngine)
	})
}

func delayed(dst, src net.Conn, d *atomic.Int64) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(time.Duration(d.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
}

// TestARenewalWhoseAnswerWasLostKeepsTheLease: a renewal's write reaches
// the engine but its answer comes after engine_timeout (held back on the
// way), so the instance never learns the lease's new revision. The next
// renewal, written at the revision it knows, is refused as changed; the
// record is still this registration's, so that is its own write, not
// another instance's takeover, and the lease stays (before, the host was
// closed `replaced` by a lease nobody else held).
func TestARenewalWhoseAnswerWasLostKeepsTheLease(t *testing.T) {
	nc := startNATSCluster(t)
	const timeout = 500 * time.Millisecond
	const ttl = 3 * time.Second // the shortest owner_ttl: renewals every second
	var link netDelay
	ow := ownersBehind(t, nc, &link, timeout, ttl)
	// The engine as another instance sees it, without the relay.
	direct, err := Open(context.Background(), Options{InstanceID: "b1", URLs: nc.urls(), BucketPrefix: "reach", Replicas: 3, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	owners, err := direct.js.KeyValue(context.Background(), "reach-owner")
	if err != nil {
		t.Fatal(err)
	}
	revision := func(h wire.ID) uint64 {
		e, err := owners.Get(context.Background(), ownerKey(h))
		if err != nil {
			t.Fatal(err)
		}
		return e.Revision()
	}

	host := wire.NewID()
	var lost atomic.Int64
	var why atomic.Value
	if err := ow.Hold(context.Background(), host, wire.NewID(), func(w server.LeaseLoss) { why.Store(w); lost.Add(1) }); err != nil {
		t.Fatal(err)
	}
	held := revision(host)
	// Answers from the engine now take longer than the timeout: the next
	// renewal lands, and the instance gives up on it.
	link.fromEngine.Store(int64(3 * timeout / 2))
	testenv.WaitFor(t, "a renewal reaches the engine", func() bool { return revision(host) != held })
	landed := revision(host)
	time.Sleep(timeout) // its writer has timed out by now
	link.fromEngine.Store(0)

	mine := func() (uint64, bool) {
		ow.mu.Lock()
		defer ow.mu.Unlock()
		l, ok := ow.held[host]
		return l.rev, ok
	}
	testenv.WaitFor(t, "the next renewal answered", func() bool {
		rev, ok := mine()
		return lost.Load() > 0 || !ok || rev > landed
	})
	if n := lost.Load(); n != 0 {
		t.Fatalf("the lease was dropped (%d, %v) after a renewal of its own whose answer was lost", n, why.Load())
	}
	if rev, _ := mine(); rev != revision(host) {
		t.Fatalf("the instance holds revision %d, the engine %d", rev, revision(host))
	}
}

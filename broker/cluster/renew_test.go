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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	st, err := Open(ctx, Options{
		InstanceID: "b0", URLs: []string{"nats://" + delayProxy(t, nc.url(0)[len("nats://"):], &link)},
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

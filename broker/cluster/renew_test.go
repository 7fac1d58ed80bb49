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
// far away (every byte to and from the NATS node is delayed 100 ms each
// way) are all renewed within their TTL. With renewParallel writes in
// flight a round over 600 leases takes ~19 round trips, ~4 s: longer than
// OwnerTTL/3, so rounds run back to back, and shorter than the 6 s lease,
// which every lease outlives only because each round renews the oldest
// first (in another order a lease renewed early in one round and late in
// the next waits ~8 s). One write at a time a round takes two minutes.
// The round is the delay's, not the CPU's: a loaded machine, which makes
// every write slower, leaves ~2 s of the lease.
func TestLeasesSurviveASlowEngineAtScale(t *testing.T) {
	nc := startNATSCluster(t)
	const delay = 100 * time.Millisecond // each way
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	st, err := Open(ctx, Options{
		InstanceID: "b0", URLs: []string{"nats://" + delayProxy(t, nc.url(0)[len("nats://"):], delay)},
		BucketPrefix: "reach", Replicas: 3, Timeout: rigEngineTimeout,
	})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ca := newPeerCA(t)
	cert, key := ca.issue("b0")
	const ttl = 6 * time.Second
	ow, err := st.OpenOwners(context.Background(), PeerOptions{
		Advertise: "127.0.0.1:1", CertFile: cert, KeyFile: key, CAFile: ca.CAFile, OwnerTTL: ttl,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ow.Close)

	const leases = 600
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
	for _, h := range hosts[:50] { // at once: each read is a 200 ms round trip
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

// delayProxy relays TCP connections to target on 127.0.0.1, holding every
// chunk d in each direction (order kept): an engine further away than
// loopback.
func delayProxy(t *testing.T, target string, d time.Duration) string {
	t.Helper()
	return testenv.Forward(t, target, func(c, u net.Conn) {
		go delayed(u, c, d)
		go delayed(c, u, d)
	})
}

func delayed(dst, src net.Conn, d time.Duration) {
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
				ch <- chunk{buf[:n], time.Now().Add(d)}
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

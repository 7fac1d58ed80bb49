package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// TestShareCountSlots: a replay share counts entries per hour of expiry;
// an entry leaves the count once its hour has ended, never before its
// expiry, and a give-back removes one from the right hour.
func TestShareCountSlots(t *testing.T) {
	const h = 3600
	var c shareCount
	c.add(10*h+1, 1) // hour ending 11h
	c.add(10*h+5, 1)
	c.add(12*h, 1) // ends exactly at 12h
	c.add(9*h+7, 1)
	if n := c.live(9 * h); n != 4 || len(c.Slots) != 3 {
		t.Fatalf("live = %d in %d slots, want 4 in 3", n, len(c.Slots))
	}
	if n := c.live(10*h + 7); n != 3 { // the 10h slot ended
		t.Fatalf("live after 10h = %d, want 3", n)
	}
	c.add(10*h+5, -1)
	if n := c.live(10*h + 7); n != 2 {
		t.Fatalf("after a give-back: %d, want 2", n)
	}
	c.add(10*h+5, -1) // the 11h slot empties and goes
	c.add(13*h, -1)   // nothing there: no slot made
	if n := c.live(10*h + 7); n != 1 || len(c.Slots) != 1 || c.Slots[0] != [2]int64{12 * h, 1} {
		t.Fatalf("slots %v (live %d), want [[12h 1]]", c.Slots, n)
	}
	if n := c.live(12 * h); n != 0 || len(c.Slots) != 0 {
		t.Fatalf("at 12h: %d in %v, want none", n, c.Slots)
	}
}

// TestShareGiveBackAfterAConflictLeavesTheRightHour: instance A's cached
// count of a host (one entry, five hours out) is stale after instance B
// counted an entry two hours out; A's give-back of an entry two hours out
// fails its guessed write, reads the engine and must take the one from the
// two-hour slot — not from the slot its first round last saw, which would
// leave the share one short of its entries for hours.
func TestShareGiveBackAfterAConflictLeavesTheRightHour(t *testing.T) {
	nc := startNATSCluster(t)
	open := func(id string) *State {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := Open(ctx, Options{InstanceID: id, URLs: nc.urls(), BucketPrefix: "reach", Replicas: 3, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	}
	a, b := open("a"), open("b")
	ctx := context.Background()
	key := preShareHost + wire.NewID().String()
	now := time.Now().Unix()
	early, late := now+2*shareSlot, now+5*shareSlot
	if ok, err := a.addShare(ctx, key, late, 10, 1); err != nil || !ok {
		t.Fatalf("a counts: %v %v", ok, err)
	}
	if ok, err := b.addShare(ctx, key, early, 10, 1); err != nil || !ok {
		t.Fatalf("b counts: %v %v", ok, err)
	}
	if ok, err := a.addShare(ctx, key, early, 0, -1); err != nil || !ok {
		t.Fatalf("a gives back: %v %v", ok, err)
	}
	e, err := a.replay.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var c shareCount
	if err := json.Unmarshal(e.Value(), &c); err != nil {
		t.Fatal(err)
	}
	want := (late + shareSlot - 1) / shareSlot * shareSlot
	if len(c.Slots) != 1 || c.Slots[0] != [2]int64{want, 1} {
		t.Fatalf("after the give-back the engine holds %v, want [[%d 1]] (the five-hour entry)", c.Slots, want)
	}
}

// TestSimultaneousClientsOfAHostAreAllCounted: the clients of one host
// are all admitted on its owner; many at once (a browser opening its
// connections) each get their place in the host's replay share, counted
// once each, rather than losing the compare-and-set to one another until
// the retries run out (`unavailable`). An instance answers them in turn.
func TestSimultaneousClientsOfAHostAreAllCounted(t *testing.T) {
	nc := startNATSCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	st, err := Open(ctx, Options{InstanceID: "a", URLs: nc.urls(), BucketPrefix: "reach", Replicas: 3, Timeout: 2 * time.Second})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	const clients = 4 * shareRetries
	host := wire.NewID()
	exp := time.Now().Add(wire.ReplayTTL)
	errs := make(chan error, clients)
	start := make(chan struct{})
	for range clients {
		go func() {
			<-start
			cctx, cancel := context.WithTimeout(context.Background(), st.Timeout())
			defer cancel()
			d := wire.TokenDigest(wire.NewID().String()) // a client credential of its own
			ok, err := st.CountReplay(cctx, host, d, exp, clients, clients)
			if err == nil && !ok {
				err = errors.New("refused as full")
			}
			errs <- err
		}()
	}
	close(start)
	for range clients {
		if err := <-errs; err != nil {
			t.Errorf("a client of the host: %v", err)
		}
	}
	e, err := st.replay.Get(context.Background(), preShareHost+host.String())
	if err != nil {
		t.Fatal(err)
	}
	var c shareCount
	if err := json.Unmarshal(e.Value(), &c); err != nil {
		t.Fatal(err)
	}
	if n := c.live(time.Now().Unix()); n != clients {
		t.Fatalf("the host's share counts %d clients, want %d", n, clients)
	}
}

// TestShareTurnsArePerKey: a change of a counter waits only for changes of
// the same counter, and a counter nobody changes keeps no entry.
func TestShareTurnsArePerKey(t *testing.T) {
	var turns shareTurns
	relA, err := turns.take(context.Background(), "h.a")
	if err != nil {
		t.Fatal(err)
	}
	relB, err := turns.take(context.Background(), "h.b") // not behind h.a
	if err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := turns.take(gone, "h.a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a second change of h.a while the first holds its turn: %v, want to wait (canceled)", err)
	}
	relA()
	relB()
	if n := len(turns.m); n != 0 {
		t.Fatalf("%d turns kept after every change ended", n)
	}
	rel, err := turns.take(context.Background(), "h.a")
	if err != nil {
		t.Fatal(err)
	}
	rel()
}

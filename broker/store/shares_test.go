package store

import (
	"testing"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// A host table never refuses: a host past its share forgets its own
// oldest connection_ids (first stored first at equal expiries), others
// keep theirs, and a full table forgets the oldest of all. The per-host
// index stays bounded however long the loop.
func TestHostReplayCacheForgetsOwnOldest(t *testing.T) {
	r := NewHostReplayCache(40, 16)
	a, b := wire.NewID(), wire.NewID()
	now := int64(1000)
	var bIDs []wire.ID
	for i := 0; i < 10; i++ {
		id := wire.NewID()
		bIDs = append(bIDs, id)
		if !r.Add(id, b, wire.Digest{}, now+100, now) {
			t.Fatal("host b refused")
		}
	}
	var aIDs []wire.ID
	for i := 0; i < 5000; i++ {
		id := wire.NewID()
		aIDs = append(aIDs, id)
		if !r.Add(id, a, wire.Digest{}, now+100, now) {
			t.Fatalf("host a refused at %d", i)
		}
	}
	if n, _ := r.Counts(a, wire.Digest{}); n != 16 {
		t.Fatalf("host a holds %d, want 16", n)
	}
	for i, id := range aIDs {
		if want := i >= len(aIDs)-16; r.Seen(id, now) != want {
			t.Fatalf("a's entry %d seen=%v", i, !want)
		}
	}
	for _, id := range bIDs {
		if !r.Seen(id, now) {
			t.Fatal("host a's loop forgot host b's entry")
		}
	}
	if h := len(r.own.m[a].h); h > 2*16+16+1 {
		t.Fatalf("host a's index holds %d items", h)
	}
	// More hosts than shares: the table (40) forgets its oldest entry.
	for i := 0; i < 20; i++ {
		if !r.Add(wire.NewID(), wire.NewID(), wire.Digest{}, now+200+int64(i), now) {
			t.Fatal("a new host refused on a full table")
		}
	}
	if r.Len() != 40 {
		t.Fatalf("table holds %d, want 40", r.Len())
	}
}

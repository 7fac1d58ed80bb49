package store

import (
	"container/heap"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// hostShares counts the entries each host holds in a Table and finds the
// host's oldest one (the first to expire, of equal expiries the first
// stored), so a host whose share is full
// makes room by forgetting its own oldest entry: it can neither be refused
// for what other hosts stored nor crowd them out. Each host has a min-heap
// of (key, expiry); items of entries that left the table or changed are
// dropped lazily (live says which still hold) and the heap is rebuilt when
// they outnumber the live ones, so it stays within a constant factor of
// the host's share. Not safe for concurrent use (its Table's owner's lock).
type hostShares[K comparable] struct {
	m   map[wire.ID]*hostShare[K]
	seq uint64
	// live reports whether host still holds k with expiry exp in the table.
	live func(host wire.ID, k K, exp int64) bool
}

type hostShare[K comparable] struct {
	n int
	h shareHeap[K]
}

type shareItem[K comparable] struct {
	k   K
	exp int64
	seq uint64
}

// shareHeap orders by expiry, then by when the entry was stored.
type shareHeap[K comparable] []shareItem[K]

func (h shareHeap[K]) Len() int { return len(h) }
func (h shareHeap[K]) Less(i, j int) bool {
	return h[i].exp < h[j].exp || (h[i].exp == h[j].exp && h[i].seq < h[j].seq)
}
func (h shareHeap[K]) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *shareHeap[K]) Push(x any)   { *h = append(*h, x.(shareItem[K])) }
func (h *shareHeap[K]) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

func newHostShares[K comparable](live func(wire.ID, K, int64) bool) *hostShares[K] {
	return &hostShares[K]{m: map[wire.ID]*hostShare[K]{}, live: live}
}

// count is how many entries host holds.
func (s *hostShares[K]) count(host wire.ID) int {
	if sh := s.m[host]; sh != nil {
		return sh.n
	}
	return 0
}

// added: host stored a new key k until exp (moved says it was already
// counted: an entry updated in place).
func (s *hostShares[K]) added(host wire.ID, k K, exp int64, moved bool) {
	sh := s.m[host]
	if sh == nil {
		sh = &hostShare[K]{}
		s.m[host] = sh
	}
	if !moved {
		sh.n++
	}
	s.seq++
	heap.Push(&sh.h, shareItem[K]{k: k, exp: exp, seq: s.seq})
	if len(sh.h) > 2*sh.n+16 {
		live := sh.h[:0]
		for _, it := range sh.h {
			if s.live(host, it.k, it.exp) {
				live = append(live, it)
			}
		}
		clear(sh.h[len(live):])
		sh.h = live
		heap.Init(&sh.h)
	}
}

// removed: one of host's entries left the table.
func (s *hostShares[K]) removed(host wire.ID) {
	sh := s.m[host]
	if sh == nil {
		return
	}
	if sh.n--; sh.n <= 0 {
		delete(s.m, host)
	}
}

// oldest returns the key of host's entry that expires first.
func (s *hostShares[K]) oldest(host wire.ID) (K, bool) {
	if sh := s.m[host]; sh != nil {
		for len(sh.h) > 0 {
			if it := sh.h[0]; s.live(host, it.k, it.exp) {
				return it.k, true
			}
			heap.Pop(&sh.h)
		}
	}
	var zero K
	return zero, false
}

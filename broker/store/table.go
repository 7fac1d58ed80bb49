package store

import "container/heap"

// Table is a bounded map whose entries carry an expiry. It backs every
// tracking table of the broker (replayed connection ids, consumed and revoked
// digests, closed stream ids): the spec requires each to be bounded and to
// evict by expiry, and — when it is full of entries that have not expired
// yet — to refuse new entries instead of growing or forgetting one early
// (forgetting a consumed digest early would re-enable a one-use token).
//
// Expiries are plain int64 values in whatever unit the owner uses (Unix
// seconds for what is persisted, Unix nanoseconds for short-lived tables);
// an entry is live while expiry > now. Table is not safe for concurrent use:
// the broker serializes access with its own lock, and no method blocks.
type Table[K comparable, V any] struct {
	max int
	m   map[K]tableEntry[V]
	h   expiryHeap[K]
	// onEvict, when set, hears of every entry that leaves the table.
	onEvict func(K, V)
}

type tableEntry[V any] struct {
	v   V
	exp int64
}

// NewTable returns a table holding at most max entries (max >= 1).
func NewTable[K comparable, V any](max int) *Table[K, V] {
	if max < 1 {
		max = 1
	}
	return &Table[K, V]{max: max, m: map[K]tableEntry[V]{}}
}

// Cap is the configured bound.
func (t *Table[K, V]) Cap() int { return t.max }

// Len counts stored entries, including expired ones not swept yet.
func (t *Table[K, V]) Len() int { return len(t.m) }

// Get returns the value of a live entry.
func (t *Table[K, V]) Get(k K, now int64) (V, bool) {
	e, ok := t.m[k]
	if !ok || e.exp <= now {
		var zero V
		return zero, false
	}
	return e.v, true
}

// Expiry returns the expiry of a live entry.
func (t *Table[K, V]) Expiry(k K, now int64) (int64, bool) {
	e, ok := t.m[k]
	if !ok || e.exp <= now {
		return 0, false
	}
	return e.exp, true
}

// Contains reports whether k has a live entry.
func (t *Table[K, V]) Contains(k K, now int64) bool {
	_, ok := t.Get(k, now)
	return ok
}

// Add stores k until exp. An existing key is updated in place and keeps
// the later of its two expiries, so a table never forgets a key earlier than
// some caller asked. A new key needs room: expired entries are swept first,
// and if the table is still full, Add stores nothing and returns false.
func (t *Table[K, V]) Add(k K, v V, exp, now int64) bool {
	if exp <= now {
		return true // already expired: nothing to remember
	}
	if e, ok := t.m[k]; ok {
		if e.exp > exp {
			exp = e.exp
		}
		t.m[k] = tableEntry[V]{v: v, exp: exp}
		if exp != e.exp {
			t.push(k, exp)
		}
		return true
	}
	if len(t.m) >= t.max {
		t.Sweep(now)
		if len(t.m) >= t.max {
			return false
		}
	}
	t.m[k] = tableEntry[V]{v: v, exp: exp}
	t.push(k, exp)
	return true
}

// Remove forgets k.
func (t *Table[K, V]) Remove(k K) {
	if e, ok := t.m[k]; ok && t.onEvict != nil {
		t.onEvict(k, e.v)
	}
	delete(t.m, k)
	t.compact()
}

// Room sweeps expired entries and reports how many new keys fit.
func (t *Table[K, V]) Room(now int64) int {
	t.Sweep(now)
	return t.max - len(t.m)
}

// Sweep removes every entry with exp <= now and returns how many it removed.
// It costs O(k log n) for k expired entries.
func (t *Table[K, V]) Sweep(now int64) int {
	n := 0
	for len(t.h) > 0 && t.h[0].exp <= now {
		it := heap.Pop(&t.h).(heapItem[K])
		if e, ok := t.m[it.k]; ok && e.exp == it.exp {
			delete(t.m, it.k)
			if t.onEvict != nil {
				t.onEvict(it.k, e.v)
			}
			n++
		}
	}
	return n
}

// oldest sweeps expired entries and returns the key of the live entry that
// expires first.
func (t *Table[K, V]) oldest(now int64) (K, bool) {
	t.Sweep(now)
	for len(t.h) > 0 {
		it := t.h[0]
		if e, ok := t.m[it.k]; ok && e.exp == it.exp {
			return it.k, true
		}
		heap.Pop(&t.h) // left the table or changed since
	}
	var zero K
	return zero, false
}

// Each calls fn for every live entry, in no particular order.
func (t *Table[K, V]) Each(now int64, fn func(k K, v V, exp int64)) {
	for k, e := range t.m {
		if e.exp > now {
			fn(k, e.v, e.exp)
		}
	}
}

func (t *Table[K, V]) push(k K, exp int64) {
	heap.Push(&t.h, heapItem[K]{k: k, exp: exp})
	t.compact()
}

// compact rebuilds the heap when stale items (updated or removed keys)
// outnumber live ones, so the heap stays within a constant factor of max.
func (t *Table[K, V]) compact() {
	if len(t.h) <= 2*len(t.m)+64 {
		return
	}
	h := make(expiryHeap[K], 0, len(t.m))
	for k, e := range t.m {
		h = append(h, heapItem[K]{k: k, exp: e.exp})
	}
	heap.Init(&h)
	t.h = h
}

type heapItem[K comparable] struct {
	k   K
	exp int64
}

type expiryHeap[K comparable] []heapItem[K]

func (h expiryHeap[K]) Len() int           { return len(h) }
func (h expiryHeap[K]) Less(i, j int) bool { return h[i].exp < h[j].exp }
func (h expiryHeap[K]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap[K]) Push(x any)        { *h = append(*h, x.(heapItem[K])) }
func (h *expiryHeap[K]) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

package relay

import (
	"container/list"
	"sync"
	"time"
)

// authLimiter counts the Relay's auth.fail verdicts per source and blocks a
// source that collects limit of them within window. It is a plain map plus
// LRU list rather than an expiring cache library because it must stay
// bounded without a sweeper goroutine per instance, and because eviction must
// prefer forgetting a partial count over forgetting an active block.
type authLimiter struct {
	limit  int
	window time.Duration
	block  time.Duration
	max    int
	now    func() time.Time

	mu      sync.Mutex
	entries map[string]*list.Element // source → element whose Value is *limEntry
	lru     list.List                // front = most recent failure
	// untracked counts failures that could not be recorded because every
	// slot held an active block; the Relay's own limiter still applies.
	untracked uint64
}

type limEntry struct {
	source       string
	fails        []time.Time // oldest first, at most limit entries
	blockedUntil time.Time
}

func newAuthLimiter(limit int, window, block time.Duration, max int) *authLimiter {
	return &authLimiter{
		limit: limit, window: window, block: block, max: max,
		now:     time.Now,
		entries: make(map[string]*list.Element),
	}
}

// blocked reports whether source is blocked now, and for how much longer.
func (l *authLimiter) blocked(source string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	el, ok := l.entries[source]
	if !ok {
		return 0, false
	}
	left := el.Value.(*limEntry).blockedUntil.Sub(l.now())
	if left <= 0 {
		return 0, false
	}
	return left, true
}

// fail records one auth.fail for source and reports whether this failure
// started a block.
func (l *authLimiter) fail(source string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	el, ok := l.entries[source]
	if !ok {
		if len(l.entries) >= l.max && !l.evict(now) {
			l.untracked++
			return false
		}
		el = l.lru.PushFront(&limEntry{source: source, fails: make([]time.Time, 0, l.limit)})
		l.entries[source] = el
	} else {
		l.lru.MoveToFront(el)
	}
	e := el.Value.(*limEntry)
	cut := 0
	for cut < len(e.fails) && now.Sub(e.fails[cut]) >= l.window {
		cut++
	}
	e.fails = append(e.fails[:0], e.fails[cut:]...)
	e.fails = append(e.fails, now)
	if len(e.fails) < l.limit {
		return false
	}
	e.fails = e.fails[:0]
	e.blockedUntil = now.Add(l.block)
	return true
}

// evict frees one slot by forgetting the least recently failing source that
// is not blocked (an entry idle for a whole window holds nothing anyway). It
// refuses to drop an active block, so flooding the table from many sources
// cannot unblock a source; the walk only passes over blocked entries.
func (l *authLimiter) evict(now time.Time) bool {
	for el := l.lru.Back(); el != nil; el = el.Prev() {
		if !el.Value.(*limEntry).blockedUntil.After(now) {
			l.remove(el)
			return true
		}
	}
	return false
}

func (l *authLimiter) remove(el *list.Element) {
	delete(l.entries, el.Value.(*limEntry).source)
	l.lru.Remove(el)
}

func (l *authLimiter) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}

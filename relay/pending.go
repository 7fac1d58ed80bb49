package relay

import "sync"

// pendingLimiter bounds the unauthenticated /relay/ws sessions each source
// has at once: from admission (before the Relay is dialed) until the Relay's
// first auth.ok passes, or until the session ends. The auth-failure limiter
// only counts verdicts that already came back, so without this bound a
// source could open any number of guesses in parallel and have all of them
// answered inside one window.
//
// The table holds only sources with a slot taken: an entry goes when its
// count drops to zero, so its size is bounded by the live sessions.
type pendingLimiter struct {
	direct, reach int // slots per direct source, and for the shared "reach" source

	mu    sync.Mutex
	count map[string]int
}

func newPendingLimiter(direct, reach int) *pendingLimiter {
	return &pendingLimiter{direct: direct, reach: reach, count: make(map[string]int)}
}

// acquire takes one slot for source; false when the source has none left.
// A true result must be paired with exactly one release.
func (p *pendingLimiter) acquire(source string) bool {
	limit := p.direct
	if source == SourceReach {
		limit = p.reach
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.count[source] >= limit {
		return false
	}
	p.count[source]++
	return true
}

func (p *pendingLimiter) release(source string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := p.count[source]; n > 1 {
		p.count[source] = n - 1
	} else {
		delete(p.count, source)
	}
}

// held reports how many slots source holds now.
func (p *pendingLimiter) held(source string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count[source]
}

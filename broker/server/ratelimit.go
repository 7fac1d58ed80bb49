package server

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// rateLimiter allows each source perMinute connect attempts per minute as a
// token bucket (a burst of perMinute, then one every 60/perMinute s). It
// tracks at most max sources; a bucket that has refilled completely carries
// no information and is evicted first. When every slot holds a source that
// is still limited, unknown sources are refused too: the table must not
// grow, and forgetting a limited source would let it start over.
type rateLimiter struct {
	mu        sync.Mutex
	perMinute float64
	max       int
	m         map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newRateLimiter(perMinute, max int) *rateLimiter {
	return &rateLimiter{perMinute: float64(perMinute), max: max, m: map[string]*bucket{}}
}

func (l *rateLimiter) allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	bk, ok := l.m[key]
	if !ok {
		if len(l.m) >= l.max {
			l.sweepLocked(now)
			if len(l.m) >= l.max {
				return false
			}
		}
		bk = &bucket{tokens: l.perMinute, last: now}
		l.m[key] = bk
	}
	bk.refill(now, l.perMinute)
	if bk.tokens < 1 {
		return false
	}
	bk.tokens--
	return true
}

func (b *bucket) refill(now time.Time, perMinute float64) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(perMinute, b.tokens+d.Minutes()*perMinute)
		b.last = now
	}
}

func (l *rateLimiter) sweep(now time.Time) {
	l.mu.Lock()
	l.sweepLocked(now)
	l.mu.Unlock()
}

func (l *rateLimiter) sweepLocked(now time.Time) {
	for k, b := range l.m {
		b.refill(now, l.perMinute)
		if b.tokens >= l.perMinute {
			delete(l.m, k)
		}
	}
}

// sourceKey groups a remote address: an IPv4 address alone, an IPv6 address
// by its /64 (one subscriber usually holds a whole /64).
func sourceKey(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	a = a.Unmap()
	if a.Is4() {
		return a.String()
	}
	p, _ := a.WithZone("").Prefix(64)
	return p.String()
}

package server

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// rateLimiter allows each source perMinute connect attempts per minute as a
// token bucket (a burst of perMinute, then one every 60/perMinute s). It
// tracks at most max sources in an LRU: when the table is full, a new
// source evicts the least recently seen one in O(1), so a flood of fresh
// addresses cannot lock every newcomer out, and a source that keeps trying
// stays the most recently seen and keeps its bucket. A source forgotten
// after max other sources were seen starts with a full bucket again, which
// at worst grants one burst more.
type rateLimiter struct {
	mu        sync.Mutex
	perMinute float64
	m         *simplelru.LRU[string, *bucket]
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newRateLimiter(perMinute, max int) *rateLimiter {
	m, err := simplelru.NewLRU[string, *bucket](max, nil)
	if err != nil {
		panic(err) // max < 1: Config.Validate refuses it
	}
	return &rateLimiter{perMinute: float64(perMinute), m: m}
}

func (l *rateLimiter) allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	bk, ok := l.m.Get(key) // marks key as most recently seen
	if !ok {
		bk = &bucket{tokens: l.perMinute, last: now}
		l.m.Add(key, bk)
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

package server

import (
	"sync"

	"github.com/hermes-securelink/securelink/broker/msgconn"
)

// budget is the broker-wide bound on queued bytes (spec: "at the cap the
// broker pauses readers instead of allocating"). A reader that cannot
// acquire waits on the returned channel, which is closed at the next
// release. The lock is a leaf: nothing is locked while holding it.
type budget struct {
	mu   sync.Mutex
	used int64
	max  int64
	ch   chan struct{}
}

// acquire takes n bytes, or returns a channel to wait on. An empty budget
// always admits one item, so a configuration smaller than a frame cannot
// deadlock.
func (b *budget) acquire(n int) (bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used == 0 || b.used+int64(n) <= b.max {
		b.used += int64(n)
		return true, nil
	}
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return false, b.ch
}

func (b *budget) release(n int) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= int64(n)
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
	b.mu.Unlock()
}

func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// broadcast is a reusable "something changed" signal for several waiters;
// the owner's lock guards it.
type broadcast struct{ ch chan struct{} }

func (c *broadcast) wait() <-chan struct{} {
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	return c.ch
}

func (c *broadcast) fire() {
	if c.ch != nil {
		close(c.ch)
		c.ch = nil
	}
}

// signal wakes the single goroutine waiting on ch (capacity 1) without
// blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// keepalive is the keepalive of one socket with the broker's timings.
func (b *Broker) keepalive(c msgconn.Conn, p *msgconn.Pause, stop <-chan struct{}, dead func()) msgconn.Keepalive {
	return msgconn.Keepalive{Conn: c, Interval: b.cfg.PingInterval, Timeout: b.cfg.PongTimeout, Pause: p, Stop: stop, Dead: dead}
}

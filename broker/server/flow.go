package server

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
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

// pauseState records when a socket's reader deliberately stops reading
// (backpressure or a pending state write). A pong can only be seen while the
// reader reads, so keepalive forgives a missing pong while or after a pause
// instead of dropping a peer for the broker's own backpressure.
type pauseState struct {
	n     atomic.Int32
	epoch atomic.Uint64
}

func (p *pauseState) enter() { p.n.Add(1); p.epoch.Add(1) }
func (p *pauseState) leave() { p.n.Add(-1) }

// keepalive pings c every PingInterval and calls dead when no pong arrived
// within PongTimeout of the previous one, unless the reader was paused
// meanwhile. It returns when stop is closed or ctx ends.
func (b *Broker) keepalive(ctx context.Context, c MessageConn, p *pauseState, stop <-chan struct{}, dead func()) {
	last := time.Now()
	t := time.NewTimer(b.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-stop:
			return
		case <-ctx.Done():
			return
		}
		e0 := p.epoch.Load()
		if p.n.Load() > 0 {
			last = time.Now()
			t.Reset(b.cfg.PingInterval)
			continue
		}
		pctx, cancel := context.WithDeadline(ctx, last.Add(b.cfg.PongTimeout))
		err := c.Ping(pctx)
		cancel()
		switch {
		case err == nil || p.epoch.Load() != e0 || p.n.Load() > 0:
			last = time.Now()
		default:
			select {
			case <-stop:
			case <-ctx.Done():
			default:
				dead()
			}
			return
		}
		t.Reset(b.cfg.PingInterval)
	}
}

package msgconn

import (
	"context"
	"sync/atomic"
	"time"
)

// Pause records when a socket's side deliberately does not read (its
// reader waits for queue space, a state write, or the application taking
// queued bytes) or is inside a data write the peer's backpressure holds
// back. A pong is only seen while the reader reads, and our ping queues
// behind our own data write, so Keepalive forgives a missing pong during or
// across a pause instead of dropping a live peer for backpressure.
// The zero value is ready to use.
type Pause struct {
	n     atomic.Int32
	epoch atomic.Uint64
}

// Enter starts a pause; every Enter is matched by one Leave.
func (p *Pause) Enter() { p.n.Add(1); p.epoch.Add(1) }

// Leave ends a pause.
func (p *Pause) Leave() { p.n.Add(-1) }

// Paused reports whether a pause is in progress.
func (p *Pause) Paused() bool { return p.n.Load() > 0 }

// Keepalive is a ping loop that ends a socket whose peer stopped answering.
type Keepalive struct {
	Conn     Conn
	Interval time.Duration // between pings
	Timeout  time.Duration // a pong is overdue this long after the previous one
	Pause    *Pause        // pauses that forgive a missing pong; nil: none
	// Stop, when not nil, ends the loop like ctx does.
	Stop <-chan struct{}
	// Dead is called once when a pong is overdue and neither ctx nor
	// Stop has ended; Run returns right after.
	Dead func()
}

// Run pings every Interval and calls Dead when no pong arrived within
// Timeout of the previous one, unless the side paused meanwhile (then the
// clock restarts). It returns when ctx ends, Stop closes or Dead was
// called.
func (k Keepalive) Run(ctx context.Context) {
	p := k.Pause
	if p == nil {
		p = new(Pause)
	}
	if k.Stop != nil { // Stop also cuts a ping in progress
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-k.Stop:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	last := time.Now()
	t := time.NewTimer(k.Interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-k.Stop:
			return
		case <-ctx.Done():
			return
		}
		// The epoch is read before the count: a pause that starts in
		// between changes the epoch, one that started before is counted.
		e0 := p.epoch.Load()
		if p.n.Load() > 0 {
			last = time.Now()
			t.Reset(k.Interval)
			continue
		}
		pctx, cancel := context.WithDeadline(ctx, last.Add(k.Timeout))
		err := k.Conn.Ping(pctx)
		cancel()
		if err == nil || p.epoch.Load() != e0 || p.n.Load() > 0 {
			last = time.Now()
			t.Reset(k.Interval)
			continue
		}
		select {
		case <-k.Stop:
		case <-ctx.Done():
		default:
			k.Dead()
		}
		return
	}
}

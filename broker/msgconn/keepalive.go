package msgconn

import (
	"context"
	"sync"
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

// Keepalive is the pause-forgiving ping of one socket: it ends a socket
// whose peer stopped answering. Start runs it on a timer (no goroutine
// while it waits; a ping in progress runs on the timer's own goroutine,
// which exists only for the ping's write when the socket's reader notes
// pongs, else until the pong), Run on the calling goroutine.
type Keepalive struct {
	Conn     Conn
	Interval time.Duration // between pings
	Timeout  time.Duration // a pong is overdue this long after the previous one
	Pause    *Pause        // pauses that forgive a missing pong; nil: none
	// Stop, when not nil, ends the keepalive like ctx does. Run watches
	// it; Start only checks it before and after each ping (call the stop
	// function Start returns to cut a ping in progress).
	Stop <-chan struct{}
	// Dead is called once when a pong is overdue and neither ctx nor
	// Stop has ended; the keepalive ends right after.
	Dead func()
}

// Run pings every Interval and calls Dead when no pong arrived within
// Timeout of the previous one, unless the side paused meanwhile (then the
// clock restarts). It returns when ctx ends, Stop closes or Dead was
// called.
func (k Keepalive) Run(ctx context.Context) {
	dead := make(chan struct{})
	fn := k.Dead
	k.Dead = func() { fn(); close(dead) }
	stop := k.Start(ctx)
	defer stop()
	select {
	case <-dead:
	case <-k.Stop:
	case <-ctx.Done():
	}
}

// Start runs the keepalive of Run on a timer and returns at once. The
// returned function stops it: it cuts a waiting ping and returns once no
// tick decides any more, so Dead is never called after it returned (a
// noted-pong ping's frame write may still finish afterwards; it calls
// nothing). It must not be called from Dead.
//
// On a socket whose reader notes pongs (a WebSocket from Accept) a ping is
// one frame write: the timer's goroutine writes it and ends, the reader
// notes the pong, and the next tick (the next ping's, or the pong's
// deadline) reads when it came. Elsewhere the tick waits for each pong
// with Conn.Ping. A ping write stuck behind the peer's backpressure is not
// cut by stop but by the socket's end (the session closes it; a pong
// overdue calls Dead, which ends it).
func (k Keepalive) Start(ctx context.Context) (stop func()) {
	t := &keepaliveTimer{k: k, p: k.Pause, ctx: ctx, last: time.Now()}
	if t.p == nil {
		t.p = new(Pause)
	}
	if n, ok := k.Conn.(pongNoter); ok {
		if _, notes := n.lastPong(); notes {
			t.noter = n
		}
	}
	t.epoch = t.p.epoch.Load()
	t.mu.Lock()
	t.t = time.AfterFunc(k.Interval, t.tick)
	t.mu.Unlock()
	return t.stop
}

// pongNoter is a Conn whose reader notes the pongs of its pings itself
// (WebSocket from Accept): sendPing writes a ping and returns without
// waiting for its pong; lastPong says when one last arrived, and ok is
// false when this socket's reader does not note them after all.
type pongNoter interface {
	sendPing() error
	lastPong() (at time.Time, ok bool)
}

// keepaliveTimer is one started Keepalive. mu is held while a tick
// decides (and, without a pongNoter, while it waits for its pong), so stop
// can wait for it. It keeps no context of its own: a cancelable child of
// Start's ctx would keep, for the socket's life, the map and the channel
// its first ping's deadline allocated in it (~350 bytes per idle socket);
// stop cuts the ping in progress through pingMu instead.
type keepaliveTimer struct {
	k     Keepalive
	p     *Pause
	ctx   context.Context // Start's
	noter pongNoter       // nil: each ping waits for its pong (Conn.Ping)
	mu    sync.Mutex
	t     *time.Timer
	last  time.Time // the last pong, or the last pause seen

	// With a noter, under mu:
	epoch    uint64    // the pause epoch the last tick saw
	lastPing time.Time // when the last ping was written; zero: none yet
	pinging  bool      // a tick writes a ping (outside mu)
	dead     bool      // Dead was called

	stopped    atomic.Bool
	pingMu     sync.Mutex
	pingCancel context.CancelFunc // the ping in progress; nil when none
}

func (t *keepaliveTimer) ended() bool {
	return t.dead || t.stopped.Load() || t.ctx.Err() != nil || (t.k.Stop != nil && isClosed(t.k.Stop))
}

// ping sends one ping and waits for its pong until the deadline, ctx or
// stop.
func (t *keepaliveTimer) ping() error {
	pctx, cancel := context.WithDeadline(t.ctx, t.last.Add(t.k.Timeout))
	defer cancel()
	t.pingMu.Lock()
	if t.stopped.Load() {
		t.pingMu.Unlock()
		return context.Canceled
	}
	t.pingCancel = cancel
	t.pingMu.Unlock()
	err := t.k.Conn.Ping(pctx)
	t.pingMu.Lock()
	t.pingCancel = nil
	t.pingMu.Unlock()
	return err
}

func (t *keepaliveTimer) tick() {
	t.mu.Lock()
	if t.ended() {
		t.mu.Unlock()
		return
	}
	if t.noter == nil {
		t.tickWaiting()
		t.mu.Unlock()
		return
	}
	ping := t.tickNoted()
	t.mu.Unlock()
	if !ping {
		return
	}
	err := t.noter.sendPing()
	t.mu.Lock()
	t.pinging = false
	if err != nil && !t.ended() {
		// The socket is broken; a pause does not mend that.
		t.die()
	}
	t.mu.Unlock()
}

// tickWaiting pings and waits for the pong (mu held throughout).
func (t *keepaliveTimer) tickWaiting() {
	// The epoch is read before the count: a pause that starts in between
	// changes the epoch, one that started before is counted.
	e0 := t.p.epoch.Load()
	if t.p.n.Load() == 0 {
		err := t.ping()
		if err != nil && t.p.epoch.Load() == e0 && t.p.n.Load() == 0 {
			if !t.ended() {
				t.die()
			}
			return
		}
	}
	t.last = time.Now()
	t.t.Reset(t.k.Interval)
}

// tickNoted is a tick on a socket whose reader notes pongs (mu held): it
// calls Dead when the pong is overdue, arms the next tick (the next ping's
// or the pong's deadline, whichever is first) and says whether to write a
// ping now, outside mu.
func (t *keepaliveTimer) tickNoted() (ping bool) {
	now := time.Now()
	if at, _ := t.noter.lastPong(); at.After(t.last) {
		t.last = at
	}
	// A pause since the last tick, or one in progress, restarts the clock
	// (the epoch is read before the count, as in tickWaiting).
	e := t.p.epoch.Load()
	paused := t.p.n.Load() > 0
	if e != t.epoch || paused {
		t.epoch, t.last = e, now
	}
	if now.Sub(t.last) >= t.k.Timeout {
		t.die()
		return false
	}
	// Paused, or the last ping still being written: look again in an
	// interval (or at the deadline).
	due := onSlot(now.Add(t.k.Interval), t.k.Interval, false)
	pingAt := onSlot(t.lastPing.Add(t.k.Interval), t.k.Interval, false)
	switch {
	case paused || t.pinging:
	case t.lastPing.IsZero() || !now.Before(pingAt):
		t.lastPing, t.pinging, ping = now, true, true
	default:
		due = pingAt
	}
	next := onSlot(t.last.Add(t.k.Timeout), t.k.Interval, true)
	if due.Before(next) {
		next = due
	}
	t.t.Reset(max(next.Sub(now), time.Millisecond))
	return ping
}

// keepaliveSlot is the grid the noted-pong keepalive's ticks fall on at
// the spec's timings: every socket's ping whose due time falls in the
// same quarter second is written in one wake-up of the process, not each
// in its own. A ping comes early (the interval stays at most Interval), a
// pong's deadline late (a socket is never dropped before Timeout).
const keepaliveSlot = 250 * time.Millisecond

// onSlot moves t down (up: up) onto the keepaliveSlot grid, unless the
// interval is too short for it (tests).
func onSlot(t time.Time, interval time.Duration, up bool) time.Time {
	if interval < 20*keepaliveSlot {
		return t
	}
	d := t.Sub(monoBase)
	r := d % keepaliveSlot
	if r == 0 {
		return t
	}
	if up {
		return t.Add(keepaliveSlot - r)
	}
	return t.Add(-r)
}

// die calls Dead once (mu held).
func (t *keepaliveTimer) die() {
	t.dead = true
	t.k.Dead()
}

func (t *keepaliveTimer) stop() {
	t.pingMu.Lock()
	t.stopped.Store(true)
	if t.pingCancel != nil {
		t.pingCancel() // cuts the ping in progress
	}
	t.pingMu.Unlock()
	t.mu.Lock()
	t.t.Stop()
	t.mu.Unlock()
}

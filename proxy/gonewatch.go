package proxy

import (
	"context"
	"sync"
	"time"
)

// goneWatch gives the direct path's exchanges their client-gone cancel
// (context.AfterFunc on the request's context: a client that leaves
// cancels the upstream's exchange) only once they have lasted a tick.
// Registered per request, the AfterFunc cost its cancel context, the
// request context's done channel and children map and the stop closure
// (five allocations, 1.5-2.5 µs per small GET), for exchanges that almost
// all end in well under a millisecond. Here an exchange joins a list (two
// pointer writes under a lock) and leaves it when it ends; a timer, running
// only while the list is not empty, arms the exchanges that were already
// listed at its previous tick. So a client that leaves is noticed within
// two ticks (10 ms) instead of at once, and an exchange that ends sooner
// never pays for the AfterFunc.
type goneWatch struct {
	mu      sync.Mutex
	waiting clientWait // sentinel of the list, oldest first
	gen     uint64     // ticks so far
	ticking bool
	timer   *time.Timer
}

// goneTick is the watch's period: an exchange is armed after one to two.
const goneTick = 5 * time.Millisecond

// clientWait is one exchange's place in the watch. Only the exchange's own
// goroutine writes active; the rest is the watch's, under its lock.
type clientWait struct {
	active     bool // between add and done
	ctx        context.Context
	pc         *upConn
	prev, next *clientWait
	gen        uint64
	stop       func() bool // set when armed
}

// add watches the exchange on pc for ctx's end.
func (g *goneWatch) add(w *clientWait, ctx context.Context, pc *upConn) {
	w.active = true
	g.mu.Lock()
	if g.waiting.next == nil {
		g.waiting.next, g.waiting.prev = &g.waiting, &g.waiting
	}
	w.ctx, w.pc, w.gen, w.stop = ctx, pc, g.gen, nil
	last := g.waiting.prev
	w.prev, w.next = last, &g.waiting
	last.next, g.waiting.prev = w, w
	if !g.ticking {
		g.ticking = true
		if g.timer == nil {
			g.timer = time.AfterFunc(goneTick, g.tick)
		} else {
			g.timer.Reset(goneTick)
		}
	}
	g.mu.Unlock()
}

// done ends the watch of an exchange and reports, as an AfterFunc's stop
// does, whether the cancel had not run (the connection may be reused).
func (g *goneWatch) done(w *clientWait) bool {
	if !w.active {
		return true
	}
	w.active = false
	g.mu.Lock()
	stop := w.stop
	if stop == nil {
		w.prev.next, w.next.prev = w.next, w.prev
	}
	w.prev, w.next, w.ctx, w.pc, w.stop = nil, nil, nil, nil, nil
	g.mu.Unlock()
	if stop != nil {
		return stop()
	}
	return true
}

// tick arms the exchanges listed before the previous tick and goes on
// ticking while any remain listed. Arming happens under the lock, so done
// either unlists an exchange before it is armed or finds it armed and stops
// its AfterFunc: a cancel can never reach a connection an exchange has
// handed back.
func (g *goneWatch) tick() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for w := g.waiting.next; w != &g.waiting && w.gen != g.gen; {
		next := w.next
		w.prev.next, next.prev = next, w.prev
		w.prev, w.next = nil, nil
		w.stop = context.AfterFunc(w.ctx, w.pc.cancelFn)
		w = next
	}
	g.gen++
	if g.waiting.next == &g.waiting {
		g.ticking = false
		return
	}
	g.timer.Reset(goneTick)
}

package server

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// An idle socket costs the broker one goroutine: its reader. Its writer
// runs only while something is queued (writer), and its keepalive and idle
// watch are timers (msgconn.Keepalive.Start, idleTimer), so 10,000 idle
// hosts and 50,000 idle streams do not park 150,000 more goroutines and
// their stacks.

// writer runs a socket's write loop on a goroutine of its own only while
// there is work: kick starts it when it is not running, and once drain
// finds the queue empty it lingers for writerLinger, then exits. The
// linger keeps a request/response exchange from starting a goroutine per
// message; an idle socket has none after it. At most one drain runs at a
// time, so drain may keep state in plain fields; it returns true once the
// socket is closed, and the writer then ends for good. A writer starts
// held (as if running): kicks before start only mark work, so nothing is
// written before the session is ready.
type writer struct {
	state  atomic.Int32  // writerIdle … writerLingering
	wake   chan struct{} // capacity 1: a kick ended the linger
	linger *time.Timer   // the drain goroutine's only; nil once it lingered
	drain  func() (closed bool)
}

const (
	writerIdle      = iota
	writerRunning   // a drain runs (or the writer is held)
	writerKicked    // and work arrived since it started
	writerLingering // the goroutine waits for a kick before it exits
)

// writerLinger is how long a drained writer waits for more work.
const writerLinger = time.Second

func newWriter(drain func() bool) *writer {
	w := &writer{drain: drain, wake: make(chan struct{}, 1)}
	w.state.Store(writerRunning)
	return w
}

// start ends the hold: the write loop runs once now (whatever was queued
// meanwhile), then on kicks.
func (w *writer) start() { go w.loop() }

// kick says there is something to write (or an end to carry out). It never
// blocks.
func (w *writer) kick() {
	for {
		switch w.state.Load() {
		case writerIdle:
			if w.state.CompareAndSwap(writerIdle, writerRunning) {
				go w.loop()
				return
			}
		case writerRunning:
			if w.state.CompareAndSwap(writerRunning, writerKicked) {
				return
			}
		case writerLingering:
			if w.state.CompareAndSwap(writerLingering, writerRunning) {
				w.wake <- struct{}{} // the one send for this linger
				return
			}
		default:
			return
		}
	}
}

func (w *writer) loop() {
	for {
		if w.drain() {
			return
		}
		// Kicked while draining: what arrived may have been missed.
		if w.state.CompareAndSwap(writerKicked, writerRunning) ||
			!w.state.CompareAndSwap(writerRunning, writerLingering) {
			continue
		}
		if w.linger == nil {
			w.linger = time.NewTimer(writerLinger)
		} else {
			w.linger.Reset(writerLinger)
		}
		select {
		case <-w.wake:
			w.linger.Stop()
			continue
		case <-w.linger.C:
		}
		w.linger = nil // an idle socket keeps no timer
		if w.state.CompareAndSwap(writerLingering, writerIdle) {
			return
		}
		<-w.wake // a kick won the race and sends
	}
}

// idleTimer calls fire after d; fire returns how long to wait before the
// next call, or 0 to end. stop returns once no call runs, so fire never
// runs after it.
type idleTimer struct {
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

func startIdleTimer(d time.Duration, fire func() time.Duration) *idleTimer {
	it := &idleTimer{}
	it.mu.Lock()
	defer it.mu.Unlock()
	it.t = time.AfterFunc(d, func() {
		it.mu.Lock()
		defer it.mu.Unlock()
		if it.stopped {
			return
		}
		if next := fire(); next > 0 {
			it.t.Reset(next)
		}
	})
	return it
}

func (it *idleTimer) stop() {
	it.mu.Lock()
	it.stopped = true
	it.t.Stop()
	it.mu.Unlock()
}

// logField adds one field to every event of a socket's logger. A logger
// made with With keeps a 500-byte field buffer per socket for its life;
// a hook costs its two strings and runs only for an event that is logged.
type logField struct{ key, value string }

func (f logField) Run(e *zerolog.Event, _ zerolog.Level, _ string) { e.Str(f.key, f.value) }

// GCPercent is the collector's target for a broker process: `securelink
// broker serve` sets it when the environment does not set GOGC. An idle
// socket's ~13 KiB of heap and its reader's 8 KiB stack are most of a
// broker's memory, and at Go's default (100) the heap grows by as much
// again between collections: ~40 KiB of RSS per idle socket once the
// keepalive's garbage has filled it, ~31-33 at 50 (4,000 sockets), for
// ~5 % more CPU per registration (docs/decisions.md).
const GCPercent = 50

package msgconn

import (
	"sync"
	"time"
)

// Deadline emulates a net.Conn read or write deadline for a connection
// built on messages (the net.Pipe technique): Wait returns a channel that
// is closed once the deadline passed, and every Set re-arms it, so a
// blocked Read or Write selects on it next to its other events. Use
// NewDeadline.
type Deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{}
	armed  bool
}

// NewDeadline returns a deadline that is not set.
func NewDeadline() *Deadline { return &Deadline{cancel: make(chan struct{})} }

// Set arms the deadline at t; a zero t clears it, a past t fires it now.
func (d *Deadline) Set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait until its callback closed cancel
	}
	d.timer = nil
	closed := isClosed(d.cancel)
	d.armed = !t.IsZero()
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		ch := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	if !closed {
		close(d.cancel)
	}
}

// Wait returns a channel closed once the deadline passed. A later Set
// gives a new channel; callers fetch it again after each wake-up.
func (d *Deadline) Wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

// IsSet reports whether a (future or past) deadline is set.
func (d *Deadline) IsSet() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.armed
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

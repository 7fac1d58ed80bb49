// Package deadline re-arms a connection's deadline lazily. A wait that must
// be allowed at least a bound keeps the deadline already set when that one
// grants the bound and passes no limit; otherwise the deadline moves to the
// bound plus a slack from now. A busy connection then re-arms its runtime
// timer about once per slack instead of once per frame or request, and every
// wait still gets at least its bound and at most the bound plus the slack.
package deadline

import "time"

// Slack is how far past its bound a lazily kept deadline may lie: an eighth
// of the bound, at most a second.
func Slack(bound time.Duration) time.Duration {
	return min(bound/8, time.Second)
}

// base anchors the offsets: time.Since(base) reads the monotonic clock only,
// where time.Now also reads the wall clock.
var base = time.Now()

// Lazy is the deadline last set on one direction of one connection. The zero
// value has none set. It is not safe for concurrent use: it belongs to the
// goroutine (or the lock) that sets that direction's deadline.
type Lazy struct {
	at time.Duration // since base; 0: none set
}

// Next returns the deadline to set for a wait of at least bound from now that
// must end by limit (zero: no limit), and false when the deadline already set
// serves the wait and nothing is to be set.
func (l *Lazy) Next(bound time.Duration, limit time.Time) (time.Time, bool) {
	need := time.Since(base) + bound
	lim := time.Duration(1<<63 - 1)
	if !limit.IsZero() {
		lim = limit.Sub(base)
	}
	if l.at >= need && l.at <= lim {
		return time.Time{}, false
	}
	l.at = min(need+Slack(bound), lim)
	return base.Add(l.at), true
}

// Forget records that the connection's deadline was set by other means: the
// next wait sets its own.
func (l *Lazy) Forget() { l.at = 0 }

package wire

import (
	"encoding/binary"
	"time"
)

// Window accounting of the "credit" extension (spec/reach.md, last
// section). Each direction of each stream has a window of DATA payload
// bytes: the sender keeps a Window and never sends more than Avail; the
// receiver keeps a RecvWindow, refuses DATA beyond what it granted, and
// grants more (a WINDOW frame) as its reader drains.

// GrantThreshold is the smallest increment a receiver sends, so WINDOW
// frames stay few: a quarter of the initial window.
const GrantThreshold = InitialWindow / 4

// Window is a sender's credit for one stream and direction. The zero value
// has no credit; NewWindow starts at InitialWindow.
type Window struct {
	avail int64 // 0..MaxWindow: payload bytes that may still be sent
	// debt is what was sent beyond InitialWindow before the window applied
	// (NewWindowAfter); grants pay it before they add credit.
	debt int64
}

// NewWindow is the window of a stream opened under credit.
func NewWindow() Window { return Window{avail: InitialWindow} }

// NewWindowAfter is the window of a stream on which sent payload bytes
// already went out before the window applied: those count against it, and
// what exceeds the initial window is owed (never a negative window).
func NewWindowAfter(sent int64) Window {
	if sent < 0 {
		sent = 0
	}
	if sent <= InitialWindow {
		return Window{avail: InitialWindow - sent}
	}
	return Window{debt: sent - InitialWindow}
}

// Avail is the payload bytes that may be sent now, 0..MaxWindow.
func (w *Window) Avail() int { return int(w.avail) }

// Take records n payload bytes as sent (or, for a receiver, received). It
// refuses n outside 0..Avail and then changes nothing.
func (w *Window) Take(n int) bool {
	if n < 0 || int64(n) > w.avail {
		return false
	}
	w.avail -= int64(n)
	return true
}

// Grant adds a WINDOW increment. An increment outside 1..MaxWindow, or one
// that would take the window above MaxWindow, is a protocol violation and
// changes nothing.
func (w *Window) Grant(inc uint32) error {
	if inc == 0 || inc > MaxWindow {
		return violation("WINDOW increment outside 1..2^31-1")
	}
	n := int64(inc)
	if w.avail+n-min(n, w.debt) > MaxWindow {
		return violation("WINDOW takes the window above 2^31-1")
	}
	w.add(n)
	return nil
}

// add credits n granted bytes: they pay the debt first, and the rest is
// new credit. The caller keeps the window within MaxWindow.
func (w *Window) add(n int64) {
	pay := min(n, w.debt)
	w.debt -= pay
	w.avail += n - pay
}

// RecvWindow is a receiver's view of one stream and direction: the credit
// the sender still has and the bytes drained but not yet granted back;
// and, for auto-tuning (Grow), the window it keeps open, the grant round
// trip it measured and the current tuning epoch.
type RecvWindow struct {
	win       Window
	unGranted int64
	size      int64 // the window kept open: InitialWindow plus what Widen and Grow added
	received  int64 // payload bytes received, Overrun's included
	consumed  int64 // payload bytes drained
	// The grant round trip: markAt (monoNow, 0 for none) is when a grant
	// was made while the sender could send at most markLimit bytes in
	// all; the first byte beyond markLimit ends the sample. rtt is the
	// smallest of the samples so far.
	markAt, markLimit int64
	rtt               int64
	samples           int64
	// The tuning epoch: since epochAt (monoNow), epochFrom bytes were
	// drained in all before it.
	epochAt, epochFrom int64
}

// minRTTSamples is how many grant round trips a receiver measures before
// Grow trusts the smallest: the first ones also time the sender still
// sending its initial window (its credit not yet used up), so they can be
// several times the round trip, and with one of them a reader taking
// 20 ms per 256 KiB message looked fast enough to grow.
const minRTTSamples = 3

// monoNow is the receivers' clock, in nanoseconds (tests replace it).
var monoNow = func() int64 { return int64(time.Since(monoStart)) + 1 }

var monoStart = time.Now()

// NewRecvWindow starts at InitialWindow.
func NewRecvWindow() RecvWindow {
	return RecvWindow{win: NewWindow(), size: InitialWindow, epochAt: monoNow()}
}

// limit is the payload bytes the sender may have sent in all, as granted.
func (r *RecvWindow) limit() int64 { return r.received + r.win.avail - r.win.debt }

// grant counts g granted bytes, and starts timing a grant round trip
// unless one is being timed.
func (r *RecvWindow) grant(g int64) {
	if r.markAt == 0 {
		r.markAt, r.markLimit = monoNow(), r.limit()
	}
	r.win.add(g)
}

// arrived counts n received bytes and ends the round-trip sample when they
// go beyond what the sender could send before the timed grant: the sender
// cannot send them before that grant reaches it, so a sample is never
// shorter than the round trip, and it is about the round trip when the
// sender was waiting for the grant (the case that matters); the smallest
// sample is kept.
func (r *RecvWindow) arrived(n int) {
	r.received += int64(n)
	if r.markAt != 0 && r.received > r.markLimit {
		if d := monoNow() - r.markAt; r.samples == 0 || d < r.rtt {
			r.rtt = max(d, 1)
		}
		r.samples++
		r.markAt = 0
	}
}

// Receive records n received payload bytes; false means the sender
// exceeded its credit (a protocol violation).
func (r *RecvWindow) Receive(n int) bool {
	if !r.win.Take(n) {
		return false
	}
	r.arrived(n)
	return true
}

// Overrun records n received payload bytes beyond the credit, for a
// receiver that tolerates them (bytes a sender sent before the window
// applied): the credit drops to 0 and the excess is owed, exactly as
// NewWindowAfter counts it on the sender's side.
func (r *RecvWindow) Overrun(n int) {
	if n <= 0 {
		return
	}
	over := int64(n) - r.win.avail
	r.win.avail = 0
	if over > 0 {
		r.win.debt += over
	}
	r.arrived(n)
}

// Consumed records n bytes the reader drained; they become grantable.
func (r *RecvWindow) Consumed(n int) {
	if n > 0 {
		r.unGranted += int64(n)
		r.consumed += int64(n)
	}
}

// Due returns the increment to send now, at most limit bytes (the caller's
// memory cap; at most 0: nothing), and counts it as granted. It waits
// until GrantThreshold bytes are grantable unless the sender has no credit
// left, so WINDOW frames stay few and the sender never waits on a small
// remainder.
func (r *RecvWindow) Due(limit int64) uint32 {
	g := min(r.unGranted, limit, MaxWindow-r.win.avail)
	if g <= 0 || (g < GrantThreshold && r.win.avail > 0) {
		return 0
	}
	r.unGranted -= g
	r.grant(g)
	return uint32(g)
}

// DueEvery is Due for a receiver that grants in steps of step bytes
// (at least GrantThreshold): nothing while fewer are grantable and the
// sender still holds at least step of credit, so a fast stream costs one
// WINDOW per step, not per GrantThreshold, and a sender running low is
// never left waiting on a step.
func (r *RecvWindow) DueEvery(step int, limit int64) uint32 {
	if r.unGranted < int64(step) && r.win.avail >= int64(step) {
		return 0
	}
	return r.Due(limit)
}

// Widen grants n bytes of credit beyond what was drained, at once: for a
// receiver whose buffer is larger than the initial window, so one stream
// is not held to 256 KiB in flight (a bulk stream over a link with a few
// milliseconds of round trip). It returns the increment to send, capped so
// the window stays at most MaxWindow, and counts it as granted.
func (r *RecvWindow) Widen(n int64) uint32 {
	g := min(n, MaxWindow-r.win.avail)
	if g <= 0 {
		return 0
	}
	r.grant(g)
	r.size += g
	return uint32(g)
}

// Grow is the window's auto-tuning (quic-go's rule, its
// flow_controller_base.go), for a receiver that calls it where it grants,
// after Consumed: once more than half the window it keeps open was
// drained in the current epoch, it looks at how long that took, and when
// it took less than about two grant round trips per window (4 × the
// drained fraction × the round trip), the window, not the reader, is what
// holds the stream back: the sender waits out a grant's round trip for
// every window. Then Grow doubles the window it keeps open, up to bound
// bytes (what the receiver can buffer for the stream, at most MaxWindow),
// and returns the difference to grant at once, beyond what was drained;
// at most limit (what the receiver may still commit, e.g. a per-host cap;
// at most 0: nothing), counted as granted; 0 is no growth. Either way a
// new epoch starts. A window never shrinks, and a slow reader's never
// grows: its window takes many round trips to drain.
//
// The round trip is the smallest measured from a grant to the first byte
// the sender could send only after receiving it (never shorter than the
// real one; this protocol has no RTT estimate of its own): until
// minRTTSamples of them are in, nothing grows.
func (r *RecvWindow) Grow(bound, limit int64) uint32 {
	drained := r.consumed - r.epochFrom
	if drained <= r.size/2 {
		return 0
	}
	now := monoNow()
	fast := r.samples >= minRTTSamples && float64(now-r.epochAt) < 4*float64(drained)/float64(r.size)*float64(r.rtt)
	r.epochAt, r.epochFrom = now, r.consumed
	if !fast || r.size >= min(bound, MaxWindow) {
		return 0
	}
	return r.Widen(min(r.size, min(bound, MaxWindow)-r.size, limit))
}

// Size is the window the receiver keeps open: InitialWindow plus what
// Widen and Grow added.
func (r *RecvWindow) Size() int64 { return r.size }

// Credit is what the sender may still send, as the receiver sees it.
func (r *RecvWindow) Credit() int { return r.win.Avail() }

// Pending is the bytes drained and not yet granted back.
func (r *RecvWindow) Pending() int64 { return r.unGranted }

// AppendWindow appends a WINDOW frame granting inc bytes for stream id.
func AppendWindow(dst []byte, id ID, inc uint32) ([]byte, error) {
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], inc)
	return AppendFrame(dst, Frame{Flags: FlagWindow, StreamID: id, Payload: p[:]})
}

// Increment is the increment of a parsed WINDOW frame.
func (f Frame) Increment() uint32 {
	if f.Flags != FlagWindow || len(f.Payload) != 4 {
		return 0
	}
	return binary.BigEndian.Uint32(f.Payload)
}

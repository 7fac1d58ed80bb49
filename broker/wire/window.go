package wire

import "encoding/binary"

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
// the sender still has and the bytes drained but not yet granted back.
type RecvWindow struct {
	win       Window
	unGranted int64
}

// NewRecvWindow starts at InitialWindow.
func NewRecvWindow() RecvWindow { return RecvWindow{win: NewWindow()} }

// Receive records n received payload bytes; false means the sender
// exceeded its credit (a protocol violation).
func (r *RecvWindow) Receive(n int) bool { return r.win.Take(n) }

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
}

// Consumed records n bytes the reader drained; they become grantable.
func (r *RecvWindow) Consumed(n int) {
	if n > 0 {
		r.unGranted += int64(n)
	}
}

// Due returns the increment to send now, at most limit bytes (the caller's
// memory cap; negative means none), and counts it as granted. It waits
// until GrantThreshold bytes are grantable unless the sender has no credit
// left, so WINDOW frames stay few and the sender never waits on a small
// remainder.
func (r *RecvWindow) Due(limit int64) uint32 {
	g := min(r.unGranted, limit, MaxWindow-r.win.avail)
	if g <= 0 || (g < GrantThreshold && r.win.avail > 0) {
		return 0
	}
	r.unGranted -= g
	r.win.add(g)
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
	r.win.add(g)
	return uint32(g)
}

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

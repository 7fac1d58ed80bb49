package wire

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
	"time"
)

func TestWindowFrameGolden(t *testing.T) {
	id, _ := ParseID("U3RyZWFtSWRlbnRpZmllcg")
	b, err := AppendWindow(nil, id, 0x40000)
	if err != nil {
		t.Fatal(err)
	}
	want := mustHex("0108" + "53747265616d4964656e746966696572" + "00040000")
	if !bytes.Equal(b, want) {
		t.Fatalf("WINDOW frame %x, want %x", b, want)
	}
	if _, err := ParseFrame(b); err == nil {
		t.Fatal("plain v1 accepted a WINDOW frame")
	}
	f, err := Dialect{Credit: true}.ParseFrame(b)
	if err != nil || f.Increment() != 0x40000 || f.StreamID != id {
		t.Fatalf("parse: %+v %v", f, err)
	}
	for _, inc := range []uint32{0, MaxWindow + 1, 1<<32 - 1} {
		if _, err := AppendWindow(nil, id, inc); err == nil {
			t.Errorf("increment %d encoded", inc)
		}
		var p [4]byte
		binary.BigEndian.PutUint32(p[:], inc)
		if _, err := (Dialect{Credit: true}).ParseFrame(append(header(1, FlagWindow), p[:]...)); err == nil {
			t.Errorf("increment %d parsed", inc)
		}
	}
	for _, n := range []int{0, 3, 5} {
		if _, err := (Dialect{Credit: true}).ParseFrame(append(header(1, FlagWindow), make([]byte, n)...)); err == nil {
			t.Errorf("%d-byte WINDOW payload parsed", n)
		}
	}
}

func TestWindowAccounting(t *testing.T) {
	w := NewWindow()
	if w.Avail() != InitialWindow {
		t.Fatalf("initial %d", w.Avail())
	}
	if w.Take(InitialWindow+1) || !w.Take(InitialWindow) || w.Avail() != 0 || w.Take(1) {
		t.Fatal("take beyond the window")
	}
	if err := w.Grant(MaxWindow); err != nil || w.Avail() != MaxWindow {
		t.Fatalf("grant to the maximum: %v %d", err, w.Avail())
	}
	if err := w.Grant(1); err == nil || w.Avail() != MaxWindow {
		t.Fatalf("a window above 2^31-1 was accepted: %d", w.Avail())
	}
	// A window that applies after bytes already went out owes the excess.
	d := NewWindowAfter(InitialWindow + 100)
	if d.Avail() != 0 {
		t.Fatalf("after overshoot: %d", d.Avail())
	}
	if err := d.Grant(60); err != nil || d.Avail() != 0 {
		t.Fatalf("grant paying debt: %v %d", err, d.Avail())
	}
	if err := d.Grant(50); err != nil || d.Avail() != 10 {
		t.Fatalf("grant past debt: %v %d", err, d.Avail())
	}
	if a := NewWindowAfter(10); a.Avail() != InitialWindow-10 {
		t.Fatalf("after 10: %d", a.Avail())
	}
}

func TestRecvWindowOverrunMatchesWindowAfter(t *testing.T) {
	const sent = InitialWindow + 1000
	r := NewRecvWindow()
	r.Overrun(sent)
	w := NewWindowAfter(sent)
	r.Consumed(sent)
	g := r.Due(1 << 40)
	if err := w.Grant(g); err != nil || g != sent || w.Avail() != r.Credit() || w.Avail() != InitialWindow {
		t.Fatalf("grant %d: sender %d, receiver %d (%v)", g, w.Avail(), r.Credit(), err)
	}
}

func TestRecvWindowGrantsAsItDrains(t *testing.T) {
	r := NewRecvWindow()
	if !r.Receive(InitialWindow) || r.Receive(1) {
		t.Fatal("receive beyond the credit")
	}
	r.Consumed(GrantThreshold - 1)
	// The sender has no credit: even a small remainder is granted.
	if g := r.Due(1 << 40); g != GrantThreshold-1 {
		t.Fatalf("due with a blocked sender: %d", g)
	}
	r.Consumed(10)
	if g := r.Due(1 << 40); g != 0 {
		t.Fatalf("small grant with credit left: %d", g)
	}
	r.Consumed(GrantThreshold)
	if g := r.Due(100); g != 0 {
		t.Fatalf("grant above the limit: %d", g)
	}
	if g := r.Due(1 << 40); g != GrantThreshold+10 {
		t.Fatalf("due: %d", g)
	}
	if r.Credit() != 2*GrantThreshold+9 {
		t.Fatalf("credit %d", r.Credit())
	}
}

// A receiver granting in steps waits for a whole step while the sender
// holds at least a step of credit, and grants what it has once the
// sender runs lower.
func TestRecvWindowDueEvery(t *testing.T) {
	const step = 2 * GrantThreshold
	r := NewRecvWindow()
	if !r.Receive(InitialWindow - step - GrantThreshold) {
		t.Fatal("receive")
	}
	r.Consumed(GrantThreshold)
	if g := r.DueEvery(step, MaxWindow); g != 0 {
		t.Fatalf("granted %d before a step drained, the sender holding %d", g, r.Credit())
	}
	r.Consumed(GrantThreshold)
	if g := r.DueEvery(step, MaxWindow); g != step {
		t.Fatalf("a drained step granted %d, want %d", g, step)
	}
	if !r.Receive(r.Credit() - step + 1) {
		t.Fatal("receive")
	}
	r.Consumed(GrantThreshold)
	if g := r.DueEvery(step, MaxWindow); g != GrantThreshold {
		t.Fatalf("with the sender below a step, granted %d, want %d", g, GrantThreshold)
	}
}

// FuzzWindow drives a sender's Window and the receiver's RecvWindow through
// arbitrary sends, drains and grants (including raw increments a hostile
// peer could send): neither window is ever negative or above 2^31-1, the
// sender never has more credit than the receiver believes, and a grant that
// would exceed 2^31-1 is refused without effect.
func FuzzWindow(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5}, uint64(0))
	f.Add([]byte{3, 3, 3, 3, 3, 3, 3}, uint64(InitialWindow+1))
	f.Add([]byte{2, 2, 2, 2}, uint64(1<<40))
	f.Add([]byte(".*"), uint64(262287)) // a raw grant to the brim, then a due one
	f.Fuzz(func(t *testing.T, ops []byte, pre uint64) {
		send := NewWindowAfter(int64(pre % (4 * InitialWindow)))
		recv := NewRecvWindow()
		recv.Receive(InitialWindow - send.Avail()) // same view of what already went out
		inFlight := 0                              // received, not drained
		hostile := false                           // a raw grant was accepted
		for i, op := range ops {
			arg := int(op) * 4099
			switch op % 4 {
			case 0: // send
				n := min(arg, send.Avail())
				if !send.Take(n) {
					t.Fatalf("op %d: send of %d within credit refused", i, n)
				}
				if !recv.Receive(n) {
					if !hostile {
						t.Fatalf("op %d: receiver refused %d bytes within the credit it granted", i, n)
					}
					continue
				}
				inFlight += n
				if g := recv.Grow(int64(pre%(8<<20)), int64(arg)); g > 0 {
					if err := send.Grant(g); err != nil {
						t.Fatalf("op %d: growth %d refused: %v", i, g, err)
					}
				}
				if s := recv.Size(); s > max(int64(pre%(8<<20)), InitialWindow) {
					t.Fatalf("op %d: window grew to %d, bound %d", i, s, pre%(8<<20))
				}
			case 1: // drain, and grant what is due
				n := min(arg, inFlight)
				inFlight -= n
				recv.Consumed(n)
				if g := recv.Due(int64(arg)); g > 0 {
					if err := send.Grant(g); err != nil {
						t.Fatalf("op %d: due grant %d refused: %v", i, g, err)
					}
				}
			case 2: // a hostile raw increment
				inc := uint32(arg)<<(op%31) | uint32(op)
				before := send
				err := send.Grant(inc)
				if err != nil && send != before {
					t.Fatalf("op %d: refused grant changed the window", i)
				}
				if err == nil {
					hostile = true
				} else if before.Avail()+int(inc) <= MaxWindow && before.debt == 0 {
					t.Fatalf("op %d: grant %d to %d refused: %v", i, inc, before.Avail(), err)
				}
			case 3:
				if send.Take(send.Avail() + 1) {
					t.Fatalf("op %d: took beyond the window", i)
				}
			}
			for _, w := range []int{send.Avail(), recv.Credit()} {
				if w < 0 || w > MaxWindow {
					t.Fatalf("op %d: window %d outside 0..2^31-1", i, w)
				}
			}
			if !hostile && send.Avail() > recv.Credit() {
				t.Fatalf("op %d: sender has %d, receiver granted %d", i, send.Avail(), recv.Credit())
			}
		}
	})
}

func TestExtensionsMessage(t *testing.T) {
	b, err := Marshal(Extensions{Names: []string{ExtensionCredit}})
	if err != nil || string(b) != `{"type":"extensions","protocol_version":1,"extensions":["credit"]}` {
		t.Fatalf("%s %v", b, err)
	}
	if _, err := ParseHostControl(b); err == nil {
		t.Fatal("plain v1 parsed extensions")
	}
	m, err := ParseHostControlOffering(b)
	if err != nil || !reflect.DeepEqual(m, Extensions{Names: []string{"credit"}}) || !m.(Extensions).Has(ExtensionCredit) {
		t.Fatalf("%#v %v", m, err)
	}
	if b, _ := Marshal(Extensions{}); string(b) != `{"type":"extensions","protocol_version":1,"extensions":[]}` {
		t.Fatalf("empty: %s", b)
	}
	for _, bad := range []string{
		`{"type":"extensions","protocol_version":1}`,
		`{"type":"extensions","protocol_version":1,"extensions":"credit"}`,
		`{"type":"extensions","protocol_version":1,"extensions":null}`,
		`{"type":"extensions","protocol_version":1,"extensions":["Credit"]}`,
		`{"type":"extensions","protocol_version":1,"extensions":["credit"],"x":1}`,
	} {
		_, err := ParseHostControlOffering([]byte(bad))
		wantErr(t, bad, err, CodeUnauthorized, true)
	}
	_, err = ParseHostControlOffering([]byte(`{"type":"extensions","protocol_version":2,"extensions":["credit"]}`))
	wantErr(t, "version 2", err, CodeUnsupportedVersion, true)
	// Other control messages parse as before.
	pb := kv(hostControlPairs(TypeRevoke)...)
	if _, err := ParseHostControlOffering(pb); err != nil {
		t.Fatalf("revoke: %v", err)
	}
}

func FuzzParseHostControlOffering(f *testing.F) {
	f.Add([]byte(`{"type":"extensions","protocol_version":1,"extensions":["credit"]}`))
	f.Add([]byte(`{"type":"extensions","protocol_version":1,"extensions":[]}`))
	f.Add(kv(hostControlPairs(TypeRevoke)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseHostControlOffering(b)
		if err != nil {
			mustBeWireError(t, err)
			return
		}
		enc, err := Marshal(m)
		if err != nil {
			t.Fatalf("accepted %T does not encode: %v", m, err)
		}
		back, err := ParseHostControlOffering(enc)
		if err != nil || !reflect.DeepEqual(back, m) {
			t.Fatalf("re-parse of %s: %+v %v", enc, back, err)
		}
	})
}

func TestShutdownReason(t *testing.T) {
	if r := ShutdownReason(5 * time.Second); r != "shutdown retry=5" {
		t.Fatal(r)
	}
	if r := ShutdownReason(time.Hour); r != "shutdown retry=600" {
		t.Fatal(r)
	}
	for reason, want := range map[string]time.Duration{
		"shutdown retry=0": 0, "shutdown retry=30": 30 * time.Second, "shutdown retry=999999": MaxAdvisedRetry,
	} {
		if d, ok := ParseShutdownReason(reason); !ok || d != want {
			t.Errorf("%q: %v %v", reason, d, ok)
		}
	}
	for _, reason := range []string{"", "shutting down", "shutdown retry=", "shutdown retry=-1", "shutdown retry=1s",
		"shutdown retry=1234567", "Shutdown retry=1", "shutdown retry= 1"} {
		if _, ok := ParseShutdownReason(reason); ok {
			t.Errorf("%q parsed", reason)
		}
	}
}

// Widen grants credit beyond what was drained, counted like any grant and
// never past MaxWindow.
func TestRecvWindowWiden(t *testing.T) {
	r := NewRecvWindow()
	if g := r.Widen(2<<20 - InitialWindow); g != 2<<20-InitialWindow || r.Credit() != 2<<20 {
		t.Fatalf("widen to 2 MiB: increment %d, credit %d", g, r.Credit())
	}
	if !r.Receive(2<<20) || r.Receive(1) {
		t.Fatal("the widened credit is not exactly what may arrive")
	}
	if g := r.Widen(MaxWindow); g != MaxWindow || r.Credit() != MaxWindow {
		t.Fatalf("widen to the maximum: %d, credit %d", g, r.Credit())
	}
	if g := r.Widen(1); g != 0 || r.Credit() != MaxWindow {
		t.Fatalf("widen past the maximum: %d, credit %d", g, r.Credit())
	}
}

// fakeClock makes monoNow return *now for the test.
func fakeClock(t *testing.T, now *int64) {
	old := monoNow
	monoNow = func() int64 { return *now }
	t.Cleanup(func() { monoNow = old })
}

// measureRTT gives r minRTTSamples grant round trips of d ns (the
// sender out of credit, each grant answered after d), then starts a new
// tuning epoch.
func measureRTT(r *RecvWindow, now *int64, d int64) {
	for i := 0; i < minRTTSamples; i++ {
		c := r.Credit()
		r.Receive(c)
		r.Consumed(c)
		r.Due(1 << 40)
		*now += d
		r.Receive(1)
		r.Consumed(1)
	}
	r.epochAt, r.epochFrom = *now, r.consumed
}

// growLoop models one stream over a link with a grant round trip of rtt
// (ns) for d of test time: the sender sends in 64 KiB frames what its
// credit allows, as fast as the link goes; a grant reaches it rtt after
// the receiver made it; the receiver drains at most rate bytes per ns
// (what arrived, when it arrived) and calls Grow, then Due, as it drains.
// It returns the largest credit the sender ever held plus the bytes the
// receiver held, which is what the receiver may have to buffer.
func growLoop(t *testing.T, r *RecvWindow, rtt, d int64, rate float64, bound int64) (peak int64) {
	t.Helper()
	var now int64 = 1
	fakeClock(t, &now)
	*r = NewRecvWindow()
	type grant struct {
		at  int64
		inc uint32
	}
	var inFlight []grant
	send := NewWindow()
	var held, drainedAt float64
	const step = 10_000 // 10 µs per tick
	for ; now < d; now += step {
		for len(inFlight) > 0 && inFlight[0].at <= now {
			if err := send.Grant(inFlight[0].inc); err != nil {
				t.Fatalf("grant %d refused: %v", inFlight[0].inc, err)
			}
			inFlight = inFlight[1:]
		}
		for send.Avail() > 0 {
			n := min(64<<10, send.Avail())
			send.Take(n)
			if !r.Receive(n) {
				t.Fatalf("receiver refused %d bytes within its credit", n)
			}
			held += float64(n)
		}
		peak = max(peak, int64(send.Avail())+int64(held))
		drainedAt += rate * step
		if n := int(min(held, drainedAt)); n > 0 {
			held -= float64(n)
			drainedAt -= float64(n)
			r.Consumed(n)
			for _, g := range []uint32{r.Grow(bound, 1<<40), r.Due(1 << 40)} {
				if g > 0 {
					inFlight = append(inFlight, grant{now + rtt, g})
				}
			}
		} else {
			drainedAt = min(drainedAt, 1<<20) // an idle reader saves no drain
		}
		if r.Size() > max(bound, InitialWindow) {
			t.Fatalf("window %d above the bound %d", r.Size(), bound)
		}
	}
	return peak
}

// Over a link with a 10 ms grant round trip, a receiver that drains at
// 1 GB/s (the window, not the reader, limits the stream) doubles its window
// up to the bound and never past it; one that drains at 4 MB/s keeps the
// initial window, and the sender never holds more than it. Over 1 ms the
// fast one stops growing at about twice what the round trip needs.
func TestRecvWindowGrowsOnlyForAReaderThatKeepsUp(t *testing.T) {
	const bound = 4<<20 + 1000
	var fast, slow RecvWindow
	if peak := growLoop(t, &fast, 10e6, 300e6, 1.0, bound); fast.Size() != bound || peak > bound {
		t.Fatalf("fast reader: window %d, peak %d, want %d", fast.Size(), peak, bound)
	}
	if peak := growLoop(t, &slow, 1e6, 2e9, 0.004, bound); slow.Size() != InitialWindow || peak > InitialWindow {
		t.Fatalf("slow reader: window %d, peak %d, want %d", slow.Size(), peak, InitialWindow)
	}
	if growLoop(t, &fast, 1e6, 300e6, 1.0, bound); fast.Size() > 4<<20 || fast.Size() < 1<<20 {
		t.Fatalf("1 ms round trip at 1 GB/s: window %d, want 1..4 MiB", fast.Size())
	}
	// Without measured round trips nothing grows; limit caps an
	// increment; the window never passes 2^31-1.
	var now int64 = 1
	fakeClock(t, &now)
	r := NewRecvWindow()
	r.Receive(InitialWindow)
	r.Consumed(InitialWindow)
	if g := r.Grow(1<<40, 1<<40); g != 0 {
		t.Fatalf("growth without a round trip: %d", g)
	}
	lim := NewRecvWindow()
	measureRTT(&lim, &now, 1000)
	c := lim.Credit()
	lim.Receive(c)
	lim.Consumed(c)
	if g := lim.Grow(1<<40, 1000); g != 1000 || lim.Size() != InitialWindow+1000 {
		t.Fatalf("growth within a limit of 1000: %d, window %d", g, lim.Size())
	}
	big := NewRecvWindow()
	measureRTT(&big, &now, 1000)
	big.Widen(MaxWindow - InitialWindow - 5)
	big.epochAt, big.epochFrom = now, big.consumed
	c = big.Credit()
	big.Receive(c)
	big.Consumed(c)
	if g := big.Grow(1<<40, 1<<40); g != 5 || big.Size() != MaxWindow {
		t.Fatalf("growth at the maximum: %d, window %d", g, big.Size())
	}
	big.Consumed(MaxWindow)
	if g := big.Grow(1<<40, 1<<40); g != 0 {
		t.Fatalf("growth past 2^31-1: %d", g)
	}
}

package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/testfake"
)

// creditHost registers host i, checks that registered offers credit and
// agrees to it.
func (e *env) creditHost(i int) *pipeConn {
	e.t.Helper()
	p := e.dial()
	e.register(p, wire.RoleHost, e.hosts[i].id, wire.KindHost, e.hosts[i].token, wire.NewID())
	expectMsg(e.t, p, wire.Registered{Extensions: []string{wire.ExtensionCredit}})
	sendText(e.t, p, `{"type":"extensions","protocol_version":1,"extensions":["credit"]}`)
	return p
}

func windowFrame(id wire.ID, inc uint32) []byte {
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], inc)
	return append(append([]byte{wire.FrameVersion, wire.FlagWindow}, id[:]...), p[:]...)
}

// hostFrame reads the next binary frame the host gets, in dialect d.
func hostFrame(t *testing.T, p *pipeConn, d wire.Dialect) wire.Frame {
	t.Helper()
	f, err := d.ParseFrame(readBinary(t, p))
	if err != nil {
		t.Fatalf("host got an invalid frame: %v", err)
	}
	f.Payload = bytes.Clone(f.Payload)
	return f
}

// quiet reports whether nothing arrives on p for a moment: used only to
// show that the broker holds bytes back (never as a timing bound).
func quiet(p *pipeConn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, _, err := p.Read(ctx)
	return errors.Is(err, context.DeadlineExceeded)
}

func routeClient(e *env, host *pipeConn, cred string) (*pipeConn, wire.ID) {
	e.t.Helper()
	tok := wire.NewToken()
	e.publishRoute(host, cred, tok)
	return e.client(host, 0, wire.KindRoute, tok)
}

func TestRegisteredOffersCreditUnlessDisabled(t *testing.T) {
	e := newEnv(t, nil)
	p := e.dial()
	e.register(p, wire.RoleHost, e.hosts[0].id, wire.KindHost, e.hosts[0].token, wire.NewID())
	_, data, _ := read(t, p)
	if string(data) != `{"type":"registered","protocol_version":1,"extensions":["credit"]}` {
		t.Fatalf("registered: %s", data)
	}
	off := newEnv(t, func(c *Config) { c.DisableCredit = true })
	q := off.dial()
	off.register(q, wire.RoleHost, off.hosts[0].id, wire.KindHost, off.hosts[0].token, wire.NewID())
	_, data, _ = read(t, q)
	if string(data) != `{"type":"registered","protocol_version":1}` {
		t.Fatalf("registered without credit: %s", data)
	}
	// A broker that did not offer it treats extensions as an unknown type.
	sendText(t, q, `{"type":"extensions","protocol_version":1,"extensions":["credit"]}`)
	if code := expectError(t, q); code != wire.CodeUnauthorized {
		t.Fatalf("extensions to a broker that did not offer it: %s", code)
	}
}

// TestPlainV1HostNeverSeesAWindow is our broker with a hand-written host
// that speaks only v1 (it never answers the offer): the bytes flow both
// ways under the plain-v1 rules, no WINDOW frame ever reaches the host, and
// a WINDOW from it is a framing violation.
func TestPlainV1HostNeverSeesAWindow(t *testing.T) {
	e := newEnv(t, nil)
	host := e.host(0)
	c, id := routeClient(e, host, "r1")
	up := bytes.Repeat([]byte{7}, 1<<20)
	for i := 0; i < 2; i++ {
		sendBinary(t, c, up)
	}
	got := 0
	for got < 2<<20 {
		f := hostFrame(t, host, wire.Dialect{})
		if f.Flags != wire.FlagData || f.StreamID != id {
			t.Fatalf("plain host got flags %d", f.Flags)
		}
		got += len(f.Payload)
	}
	// 1 MiB to the client, far beyond a window, without any grant.
	for i := 0; i < 16; i++ {
		sendBinary(t, host, dataFrame(id, bytes.Repeat([]byte{1}, 64<<10)))
	}
	down := 0
	for down < 1<<20 {
		down += len(readBinary(t, c))
	}
	e.alive(host) // nothing but the revoke answer came in between
	sendBinary(t, host, windowFrame(id, 1024))
	if code := expectError(t, host); code != wire.CodeUnauthorized {
		t.Fatalf("WINDOW from a plain host: %s", code)
	}
}

// TestCreditWindowsBothWays: with credit agreed the broker sends the host
// at most the window, more only as the host grants it; it grants the host
// credit as the client drains; DATA beyond the granted credit is a
// violation.
func TestCreditWindowsBothWays(t *testing.T) {
	e := newEnv(t, nil)
	host := e.creditHost(0)
	c, id := routeClient(e, host, "r1")
	credit := wire.Dialect{Credit: true}

	// client → host: 600 KiB offered, exactly 256 KiB arrive.
	sendBinary(t, c, bytes.Repeat([]byte{2}, 600<<10))
	got := 0
	for got < wire.InitialWindow {
		f := hostFrame(t, host, credit)
		if f.Flags != wire.FlagData {
			t.Fatalf("flags %d", f.Flags)
		}
		got += len(f.Payload)
	}
	if got != wire.InitialWindow || !quiet(host) {
		t.Fatalf("broker sent %d bytes (or more) on a %d window", got, wire.InitialWindow)
	}
	sendBinary(t, host, windowFrame(id, 100))
	if f := hostFrame(t, host, credit); len(f.Payload) != 100 {
		t.Fatalf("after a 100-byte grant: %d bytes", len(f.Payload))
	}
	if !quiet(host) {
		t.Fatal("broker sent beyond the grant")
	}
	sendBinary(t, host, windowFrame(id, 1<<20))
	for got += 100; got < 600<<10; {
		got += len(hostFrame(t, host, credit).Payload)
	}
	if got != 600<<10 {
		t.Fatalf("host got %d bytes", got)
	}

	// host → client: the whole window may go at once; the client's reads
	// come back as WINDOW grants.
	for i := 0; i < 4; i++ {
		sendBinary(t, host, dataFrame(id, bytes.Repeat([]byte{3}, 64<<10)))
	}
	drained := 0
	for drained < wire.InitialWindow {
		drained += len(readBinary(t, c))
	}
	granted := 0
	for granted < wire.InitialWindow {
		f := hostFrame(t, host, credit)
		if f.Flags != wire.FlagWindow || f.StreamID != id {
			t.Fatalf("expected WINDOW, got flags %d", f.Flags)
		}
		granted += int(f.Increment())
	}
	if granted != wire.InitialWindow {
		t.Fatalf("granted %d for %d bytes read", granted, drained)
	}
	// A frame beyond the credit is a violation (one frame on a fresh
	// stream, so no grant can overtake it).
	_, id2 := routeClient(e, host, "r2")
	sendBinary(t, host, dataFrame(id2, make([]byte, wire.InitialWindow+1)))
	if code := expectError(t, host); code != wire.CodeUnauthorized {
		t.Fatalf("DATA beyond the window: %s", code)
	}
}

// TestCreditFrameRules: WINDOW for a closed stream is ignored, for a
// stream never opened or above 2^31-1 it ends the registration; extensions
// must be the first frame and name only what was offered.
func TestCreditFrameRules(t *testing.T) {
	t.Run("closed stream ignored, never opened refused", func(t *testing.T) {
		e := newEnv(t, nil)
		host := e.creditHost(0)
		c, id := routeClient(e, host, "r1")
		c.Close(1000, "")
		for f := hostFrame(t, host, wire.Dialect{Credit: true}); f.Flags != wire.FlagClose; f = hostFrame(t, host, wire.Dialect{Credit: true}) {
		}
		sendBinary(t, host, windowFrame(id, 10))
		e.alive(host)
		sendBinary(t, host, windowFrame(wire.NewID(), 10))
		if code := expectError(t, host); code != wire.CodeUnauthorized {
			t.Fatalf("WINDOW for a stream never opened: %s", code)
		}
	})
	t.Run("window above 2^31-1", func(t *testing.T) {
		e := newEnv(t, nil)
		host := e.creditHost(0)
		_, id := routeClient(e, host, "r1")
		sendBinary(t, host, windowFrame(id, wire.MaxWindow-wire.InitialWindow))
		e.alive(host) // exactly 2^31-1 is fine
		sendBinary(t, host, windowFrame(id, 1))
		if code := expectError(t, host); code != wire.CodeUnauthorized {
			t.Fatalf("window above 2^31-1: %s", code)
		}
	})
	for name, second := range map[string]string{
		"extensions twice": `{"type":"extensions","protocol_version":1,"extensions":["credit"]}`,
		"extensions late":  "",
		"not offered":      `{"type":"extensions","protocol_version":1,"extensions":["credit","zstd"]}`,
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil)
			var host *pipeConn
			switch name {
			case "not offered":
				host = e.dial()
				e.register(host, wire.RoleHost, e.hosts[0].id, wire.KindHost, e.hosts[0].token, wire.NewID())
				readMsg(t, host)
			case "extensions late":
				host = e.host(0)
				e.alive(host)
				second = `{"type":"extensions","protocol_version":1,"extensions":["credit"]}`
			default:
				host = e.creditHost(0)
			}
			sendText(t, host, second)
			if code := expectError(t, host); code != wire.CodeUnauthorized {
				t.Fatalf("%s: %s", name, code)
			}
		})
	}
}

// TestStreamOpenedBeforeTheAnswerSwitches: a stream the broker opened
// before it read the host's extensions switches to credit with a window
// net of the bytes it already sent, which is how the host (that answered
// before reading any open) counts them.
func TestStreamOpenedBeforeTheAnswerSwitches(t *testing.T) {
	e := newEnv(t, nil)
	host := e.dial()
	e.register(host, wire.RoleHost, e.hosts[0].id, wire.KindHost, e.hosts[0].token, wire.NewID())
	readMsg(t, host)
	// Published before the answer, only to get a client in: the host's
	// answer then is not its first frame. So the credential is published
	// on a first registration, and the test host registers again.
	tok := wire.NewToken()
	e.publishRoute(host, "r1", tok)
	host.Close(1000, "")
	host = e.dial()
	e.register(host, wire.RoleHost, e.hosts[0].id, wire.KindHost, e.hosts[0].token, wire.NewID())
	readMsg(t, host)
	c, id := e.client(host, 0, wire.KindRoute, tok)
	sendBinary(t, c, bytes.Repeat([]byte{1}, 300<<10))
	got := 0
	for got < 300<<10 {
		got += len(hostFrame(t, host, wire.Dialect{}).Payload)
	}
	sendText(t, host, `{"type":"extensions","protocol_version":1,"extensions":["credit"]}`)
	e.alive(host)
	sendBinary(t, c, []byte("more"))
	if !quiet(host) {
		t.Fatal("broker sent beyond the window after the switch")
	}
	owed := 300<<10 - wire.InitialWindow
	sendBinary(t, host, windowFrame(id, uint32(owed)+2))
	if f := hostFrame(t, host, wire.Dialect{Credit: true}); string(f.Payload) != "mo" {
		t.Fatalf("after paying the debt: %q", f.Payload)
	}
}

// TestStalledClientUnderCreditStallsNobody: one client reads nothing; the
// host keeps sending to another stream, whose client gets every byte, and
// the broker never stops reading the host socket. The stalled stream holds
// at most its window in the broker, is closed after the idle timeout, and
// its memory is released.
func TestStalledClientUnderCreditStallsNobody(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.IdleTimeout = 2 * time.Second })
	host := e.creditHost(0)
	tok := wire.NewToken()
	e.publishRoute(host, "r1", tok)
	e.pipeN = 1 // the stalled client's socket holds one message
	stalled, sid := e.client(host, 0, wire.KindRoute, tok)
	e.pipeN = 16
	live, lid := e.client(host, 0, wire.KindRoute, tok)
	// One message fills the stalled client's socket; the broker holds the
	// rest. The first frame is in that socket before the others are sent:
	// queued together, the four could leave as that one message
	// (ClientWriteChunk), leaving nothing held.
	sendBinary(t, host, dataFrame(sid, bytes.Repeat([]byte{9}, 64<<10)))
	waitFor(t, "the stalled client's socket full", func() bool { n, _ := stalled.Unread(); return n == 1 })
	for i := 1; i < 4; i++ {
		sendBinary(t, host, dataFrame(sid, bytes.Repeat([]byte{9}, 64<<10)))
	}
	h := e.session(0)
	held := func() int { return downHeld(h) }
	waitFor(t, "bytes held for the stalled client", func() bool { return held() > 0 })
	const total = 8 << 20
	sent, got, credit := 0, 0, wire.InitialWindow
	var peak int64
	for got < total {
		for sent < total && credit > 0 {
			n := min(64<<10, credit, total-sent)
			sendBinary(t, host, dataFrame(lid, bytes.Repeat([]byte{byte(sent)}, n)))
			sent += n
			credit -= n
		}
		got += len(readBinary(t, live))
		peak = max(peak, e.b.Stats().QueuedBytes)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			typ, data, err := host.Read(ctx)
			cancel()
			if err != nil {
				break
			}
			f, perr := wire.Dialect{Credit: true}.ParseFrame(data)
			if perr == nil && f.Flags == wire.FlagClose && f.StreamID == sid {
				continue // the stalled stream's idle close
			}
			if typ != Binary || perr != nil || f.Flags != wire.FlagWindow {
				t.Fatalf("host got %v %v flags %d", typ, perr, f.Flags)
			}
			if f.StreamID == lid {
				credit += int(f.Increment())
			}
		}
	}
	if got != total {
		t.Fatalf("live stream got %d of %d", got, total)
	}
	st := e.b.Stats()
	if st.Counts["paused:host"] != 0 || st.Counts["stream:slow_consumer"] != 0 {
		t.Fatalf("the host socket was paused or a stream cut: %v", st.Counts)
	}
	// The stalled stream's window, the live one's (which may grow, its
	// client keeping up), and one client message in flight.
	if bound := int64(wire.InitialWindow + e.b.cfg.MaxStreamWindow() + 256<<10); peak > bound {
		t.Fatalf("broker queued %d bytes, bound %d", peak, bound)
	}
	// The stalled client: closed after the idle timeout while it still
	// reads nothing, and what the broker held for it is released then (the
	// live stream has taken every byte, so all the broker holds is its).
	waitFor(t, "the idle close", func() bool { return e.b.Stats().Counts["stream:idle"] == 1 })
	waitFor(t, "the stalled stream's memory released", func() bool {
		return e.b.Stats().QueuedBytes == 0 && held() == 0
	})
	for {
		_, _, err := read(t, stalled)
		if err != nil {
			if code := msgconnCode(err); code != wire.CloseTryAgain {
				t.Fatalf("stalled client closed with %d (%v)", code, err)
			}
			break
		}
	}
	live.Close(1000, "")
	waitFor(t, "queues released", func() bool { return e.b.Stats().QueuedBytes == 0 })
	t.Logf("peak broker queue %d bytes; counts %v", peak, e.b.Stats().Counts)
}

// TestCreditWindowGrowsOnlyForAClientThatKeepsUp: the host sends two
// streams as fast as its credit allows, its grants arriving 20 ms late.
// The stream whose client reads everything at once has its window widened
// (auto-tuning, counted as credit:grow) beyond the initial 256 KiB and
// never beyond MaxStreamWindow; the one whose client reads a message every
// 300 ms (at most 0.9 MB/s, where its 256 KiB window allows 12.8 MB/s)
// keeps the initial window throughout. Both get every byte.
func TestCreditWindowGrowsOnlyForAClientThatKeepsUp(t *testing.T) {
	e := newEnv(t, nil)
	host := e.creditHost(0)
	tok := wire.NewToken()
	e.publishRoute(host, "r1", tok)
	fast, fid := e.client(host, 0, wire.KindRoute, tok)
	e.pipeN = 1 // the slow client's socket holds one message
	slow, sid := e.client(host, 0, wire.KindRoute, tok)
	const fastTotal, slowTotal = 16 << 20, 1 << 20

	cs := testfake.NewCreditSender(fid, sid)
	go func() { // the host's reader: WINDOW frames only
		for {
			typ, data, err := host.Read(context.Background())
			if err != nil {
				return
			}
			f, perr := wire.Dialect{Credit: true}.ParseFrame(data)
			if typ != Binary || perr != nil || f.Flags != wire.FlagWindow {
				t.Errorf("host got %v %v flags %d", typ, perr, f.Flags)
				return
			}
			// The grant reaches the sender 20 ms later: a link with a
			// 20 ms round trip, so the 256 KiB window holds the stream to
			// 12.8 MB/s, well below what the broker moves even under
			// the race detector.
			cs.Grant(f.StreamID, f.Increment(), 20*time.Millisecond)
		}
	}()
	got := make(chan int, 2)
	drain := func(c *pipeConn, pause time.Duration) {
		n := 0
		for {
			time.Sleep(pause)
			_, data, err := c.Read(context.Background())
			if err != nil {
				got <- n
				return
			}
			n += len(data)
		}
	}
	go drain(fast, 0)
	go drain(slow, 300*time.Millisecond)
	cs.Send(t, map[wire.ID]int{fid: fastTotal, sid: slowTotal}, func(id wire.ID, n int) {
		sendBinary(t, host, dataFrame(id, make([]byte, n)))
	})
	sendBinary(t, host, closeFrame(fid))
	sendBinary(t, host, closeFrame(sid))
	for i := 0; i < 2; i++ {
		if n := <-got; n != fastTotal && n != slowTotal {
			t.Fatalf("a client got %d bytes", n)
		}
	}
	bound := e.b.cfg.MaxStreamWindow()
	st := e.b.Stats()
	pf, ps := cs.Peak(fid), cs.Peak(sid)
	t.Logf("peak credit: fast stream %d, slow stream %d (bound %d); counts %v", pf, ps, bound, st.Counts)
	if pf <= wire.InitialWindow || pf > bound || st.Counts["credit:grow"] == 0 {
		t.Fatalf("fast stream: peak credit %d after %d growths, want above %d and at most %d",
			pf, st.Counts["credit:grow"], wire.InitialWindow, bound)
	}
	if ps > wire.InitialWindow {
		t.Fatalf("slow stream: peak credit %d, above the initial window", ps)
	}
}

func msgconnCode(err error) int {
	var ce *closeError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return -1
}

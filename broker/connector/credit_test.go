package connector

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/testfake"
)

// TestBrokerWithoutOfferGetsPlainV1: the fake broker never offers an
// extension. Bytes flow both ways far beyond a window, and everything the
// connector sends parses as plain v1 (Host.Read fails the test on an
// extensions message or a WINDOW frame).
func TestBrokerWithoutOfferGetsPlainV1(t *testing.T) {
	_, c, h := startFake(t, nil)
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	echo(st)
	payload := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	go func() {
		for i := 0; i < len(payload); i += 64 << 10 {
			h.Data(id, payload[i:i+64<<10])
		}
	}()
	var got []byte
	for len(got) < len(payload) {
		m, f := h.Read()
		if f == nil || f.Flags != wire.FlagData {
			t.Fatalf("connector sent %#v %+v", m, f)
		}
		got = append(got, f.Payload...)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("echo mismatch")
	}
	if n := c.Counts()["credit"]; n != 0 {
		t.Fatalf("credit counted %d times without an offer", n)
	}
}

// creditFake is a fake broker that offers credit; the test reads the raw
// socket, since the fake's own reader speaks plain v1.
func creditFake(t *testing.T, mutate func(*Config)) (*Connector, *testfake.Host) {
	t.Helper()
	offer, _ := wire.Marshal(wire.Registered{Extensions: []string{wire.ExtensionCredit}})
	fb := testfake.NewBroker(t, func(b *testfake.Broker) { b.Answer = func() []byte { return offer } })
	cfg := fakeConfig(t, fb)
	if mutate != nil {
		mutate(&cfg)
	}
	c := newConnector(t, cfg)
	run(t, c)
	h := fb.Host()
	waitConnected(t, c)
	return c, h
}

func rawRead(t *testing.T, h *testfake.Host, wait time.Duration) (websocket.MessageType, []byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return h.WS.Read(ctx)
}

func rawFrame(t *testing.T, h *testfake.Host) wire.Frame {
	t.Helper()
	typ, data, err := rawRead(t, h, step)
	if err != nil || typ != websocket.MessageBinary {
		t.Fatalf("expected a frame: %v %v %q", typ, err, data)
	}
	f, err := wire.Dialect{Credit: true}.ParseFrame(data)
	if err != nil {
		t.Fatalf("invalid frame: %v", err)
	}
	f.Payload = bytes.Clone(f.Payload)
	return f
}

func sendWindow(t *testing.T, h *testfake.Host, id wire.ID, inc uint32) {
	t.Helper()
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], inc)
	h.SendRaw(websocket.MessageBinary, append(append([]byte{1, wire.FlagWindow}, id[:]...), p[:]...))
}

// TestCreditOfferIsAnsweredAndWindowsKept: the answer is the connector's
// first message; it sends at most the granted credit and grants the
// broker's credit back as the front reads.
func TestCreditOfferIsAnsweredAndWindowsKept(t *testing.T) {
	c, h := creditFake(t, nil)
	typ, data, err := rawRead(t, h, step)
	if err != nil || typ != websocket.MessageText || string(data) != `{"type":"extensions","protocol_version":1,"extensions":["credit"]}` {
		t.Fatalf("first message %v %q %v", typ, data, err)
	}
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	// openWindow (2 MiB), not the initial 256 KiB, is the broker's window
	// for it: the rest is granted at open.
	if f := rawFrame(t, h); f.Flags != wire.FlagWindow || f.StreamID != id || int(f.Increment()) != 2<<20-wire.InitialWindow {
		t.Fatalf("at open: flags %d, increment %d, want a WINDOW of %d", f.Flags, f.Increment(), 2<<20-wire.InitialWindow)
	}
	go st.Write(make([]byte, 600<<10))
	got := 0
	for got < wire.InitialWindow {
		f := rawFrame(t, h)
		if f.Flags != wire.FlagData || len(f.Payload) > wire.MaxConnectorChunk {
			t.Fatalf("flags %d, %d bytes", f.Flags, len(f.Payload))
		}
		got += len(f.Payload)
	}
	sendWindow(t, h, id, 1000)
	if f := rawFrame(t, h); f.Flags != wire.FlagData || len(f.Payload) != 1000 || got != wire.InitialWindow {
		t.Fatalf("after %d bytes and a 1000-byte grant: %d bytes", got, len(f.Payload))
	}
	// From here on any DATA frame would be beyond the credit: only
	// WINDOW frames may come.
	// The broker's DATA comes back as grants once the front reads a
	// grant step of it (an eighth of the stream buffer).
	drained := c.cfg.StreamBufferBytes / 8
	for i := 0; i < drained/(64<<10); i++ {
		h.Data(id, make([]byte, 64<<10))
	}
	if _, err := io.ReadFull(st, make([]byte, drained)); err != nil {
		t.Fatal(err)
	}
	granted := 0
	for granted < drained {
		f := rawFrame(t, h)
		if f.Flags != wire.FlagWindow || f.StreamID != id {
			t.Fatalf("expected WINDOW, got flags %d (%d bytes): beyond the credit", f.Flags, len(f.Payload))
		}
		granted += int(f.Increment())
	}
	if granted != drained {
		t.Fatalf("granted %d for %d read", granted, drained)
	}
	// A window above 2^31-1 ends the registration.
	sendWindow(t, h, id, wire.MaxWindow) // exactly 2^31-1 is allowed
	sendWindow(t, h, id, wire.MaxWindow)
	if err := h.ReadErr(); err == nil {
		t.Fatal("registration survived a window above 2^31-1")
	}
	waitLastError(t, c, codeProtocol)
}

// TestCreditOfferDeclinedWhenDisabled: a connector with credit off says
// nothing and stays plain v1.
func TestCreditOfferDeclinedWhenDisabled(t *testing.T) {
	c, h := creditFake(t, func(cfg *Config) { cfg.DisableCredit = true })
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	go st.Write(make([]byte, 600<<10))
	got := 0
	for got < 600<<10 {
		typ, data, err := rawRead(t, h, step)
		if err != nil || typ != websocket.MessageBinary {
			t.Fatalf("got %v %q %v", typ, data, err)
		}
		f, err := wire.ParseFrame(data) // plain v1
		if err != nil || f.Flags != wire.FlagData {
			t.Fatalf("frame %+v %v", f, err)
		}
		got += len(f.Payload)
	}
}

func waitLastError(t *testing.T, c *Connector, code string) {
	t.Helper()
	deadline := time.Now().Add(step)
	for c.Status().LastError != code {
		if time.Now().After(deadline) {
			t.Fatalf("last error %q, want %q", c.Status().LastError, code)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// batchRecorder passes the connector's real socket through and records,
// for every batch the writer held (msgconn.Batcher), the DATA payload
// bytes gathered in it.
type batchRecorder struct {
	msgconn.Conn
	batch msgconn.Batcher

	mu      sync.Mutex
	cur     int
	batches []int
}

func (r *batchRecorder) Write(ctx context.Context, typ msgconn.MessageType, data []byte) error {
	if f, err := (wire.Dialect{Credit: true}).ParseFrame(data); typ == msgconn.Binary && err == nil && f.Flags == wire.FlagData {
		r.mu.Lock()
		r.cur += len(f.Payload)
		r.mu.Unlock()
	}
	return r.Conn.Write(ctx, typ, data)
}

func (r *batchRecorder) HoldWrites() { r.batch.HoldWrites() }

func (r *batchRecorder) SendHeld(ctx context.Context) error {
	r.mu.Lock()
	r.batches = append(r.batches, r.cur)
	r.cur = 0
	r.mu.Unlock()
	return r.batch.SendHeld(ctx)
}

// TestCreditDataLeavesBeforeTheWindowIsUsedUp: under credit the writer
// sends its held batch once it carries half the window of DATA, so the
// broker can drain and grant the first part of a stream's window while the
// rest is still being framed. Held until the window was used up, the whole
// 256 KiB left in one write and every grant came a round trip after the
// stream had stopped (stop-and-wait).
func TestCreditDataLeavesBeforeTheWindowIsUsedUp(t *testing.T) {
	offer, _ := wire.Marshal(wire.Registered{Extensions: []string{wire.ExtensionCredit}})
	fb := testfake.NewBroker(t, func(b *testfake.Broker) { b.Answer = func() []byte { return offer } })
	c := newConnector(t, fakeConfig(t, fb))
	var rec *batchRecorder
	dial := c.dial
	c.dial = func(ctx context.Context) (msgconn.Conn, *http.Response, error) {
		ws, resp, err := dial(ctx)
		if err != nil {
			return ws, resp, err
		}
		b, ok := ws.(msgconn.Batcher)
		if !ok {
			t.Error("the connector's transport gathers no batches")
			return ws, resp, err
		}
		rec = &batchRecorder{Conn: ws, batch: b}
		return rec, resp, nil
	}
	run(t, c)
	h := fb.Host()
	waitConnected(t, c)
	if typ, data, err := rawRead(t, h, step); err != nil || typ != websocket.MessageText {
		t.Fatalf("first message %v %q %v", typ, data, err)
	}
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	if f := rawFrame(t, h); f.Flags != wire.FlagWindow {
		t.Fatalf("at open: flags %d, want the WINDOW for the stream's buffer", f.Flags)
	}
	// The front writes more than the window: 256 KiB reach the stream's
	// send buffer at once, and the writer frames them until the credit is
	// gone.
	go st.Write(make([]byte, 600<<10))
	got := 0
	for got < wire.InitialWindow {
		f := rawFrame(t, h)
		if f.Flags != wire.FlagData {
			t.Fatalf("flags %d", f.Flags)
		}
		got += len(f.Payload)
	}
	rec.mu.Lock()
	batches := slices.Clone(rec.batches)
	rec.mu.Unlock()
	sum := 0
	for _, n := range batches {
		sum += n
		if n > creditBatchBytes {
			t.Errorf("one write carried %d bytes of DATA (batches %v): more than %d, the broker could grant none of it before all of it arrived", n, batches, creditBatchBytes)
		}
	}
	if sum != wire.InitialWindow {
		t.Fatalf("batches %v carry %d bytes of DATA, want the window, %d", batches, sum, wire.InitialWindow)
	}
}

// TestCreditGrantsInLargeSteps: a front reading a bulk stream in small
// pieces grants the broker's credit back in eighths of its stream buffer
// (512 KiB by default), not in the protocol's 64 KiB minimum steps: a
// WINDOW per 64 KiB was a message and a write(2) for the front and the
// broker on every 64 KiB of an upload.
func TestCreditGrantsInLargeSteps(t *testing.T) {
	c, h := creditFake(t, nil)
	if typ, _, err := rawRead(t, h, step); err != nil || typ != websocket.MessageText {
		t.Fatalf("first message %v %v", typ, err)
	}
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	if f := rawFrame(t, h); f.Flags != wire.FlagWindow || int(f.Increment()) != 2<<20-wire.InitialWindow {
		t.Fatalf("at open: flags %d, increment %d", f.Flags, f.Increment())
	}
	const total = 1 << 20
	for i := 0; i < total/(64<<10); i++ {
		h.Data(id, make([]byte, 64<<10))
	}
	buf := make([]byte, 64<<10)
	for read := 0; read < total; read += len(buf) {
		if _, err := io.ReadFull(st, buf); err != nil {
			t.Fatal(err)
		}
	}
	granted, windows := 0, 0
	for granted < total {
		f := rawFrame(t, h)
		if f.Flags != wire.FlagWindow || f.StreamID != id {
			t.Fatalf("expected WINDOW, got flags %d", f.Flags)
		}
		granted += int(f.Increment())
		windows++
	}
	if granted != total || windows > total/(256<<10) {
		t.Fatalf("1 MiB read in 64 KiB pieces came back as %d WINDOW frames granting %d bytes; want at most %d", windows, granted, total/(256<<10))
	}
}

// TestCreditWindowGrowsToTheStreamBuffer: the broker sends two streams as
// fast as its credit allows, the connector's grants reaching it 200 ms
// late. Each stream starts with 2 MiB of its 4 MiB buffer granted. The
// one whose front reads everything at once has its window grown
// (auto-tuning) beyond 2 MiB and never beyond the buffer; the one whose
// front reads 256 KiB every 250 ms (1 MB/s) never gets more than the 2 MiB.
// Both arrive whole. The round trip is long so that 2 MiB per round trip
// (10 MB/s) is what holds the fast stream back even under -race on a
// loaded machine: at 50 ms it needed 40 MB/s, and a run that could not
// send that fast was not window-bound and rightly did not grow. Growth
// needs a window drained in under four round trips (2.6 MB/s here).
func TestCreditWindowGrowsToTheStreamBuffer(t *testing.T) {
	c, h := creditFake(t, nil)
	if typ, _, err := rawRead(t, h, step); err != nil || typ != websocket.MessageText {
		t.Fatalf("first message %v %v", typ, err)
	}
	const open = openWindow
	buffer := c.cfg.StreamBufferBytes
	fid, sid := wire.NewID(), wire.NewID()
	h.Open(fid)
	fast := accept(t, c)
	h.Open(sid)
	slow := accept(t, c)

	cs := testfake.NewCreditSender(fid, sid)
	// The test's end closes both streams: a CLOSE after both fronts have
	// read everything is the connector's, not a failure.
	var read atomic.Bool
	go func() {
		for {
			typ, data, err := h.WS.Read(context.Background())
			if err != nil {
				return
			}
			f, perr := wire.Dialect{Credit: true}.ParseFrame(data)
			if perr == nil && f.Flags == wire.FlagClose && read.Load() {
				return
			}
			if typ != websocket.MessageBinary || perr != nil || f.Flags != wire.FlagWindow {
				t.Errorf("broker got %v %v flags %d", typ, perr, f.Flags)
				return
			}
			cs.Grant(f.StreamID, f.Increment(), 200*time.Millisecond)
		}
	}()
	const fastTotal, slowTotal = 24 << 20, 5 << 19
	got := make(chan int64, 2)
	go func() { n, _ := io.Copy(io.Discard, io.LimitReader(fast, fastTotal)); got <- n }()
	go func() {
		var n int64
		buf := make([]byte, 256<<10)
		for n < slowTotal {
			time.Sleep(250 * time.Millisecond)
			k, err := io.ReadFull(slow, buf[:min(len(buf), slowTotal-int(n))])
			n += int64(k)
			if err != nil {
				break
			}
		}
		got <- n
	}()

	cs.Send(t, map[wire.ID]int{fid: fastTotal, sid: slowTotal}, func(id wire.ID, n int) { h.Data(id, make([]byte, n)) })
	for i := 0; i < 2; i++ {
		if n := <-got; n != fastTotal && n != slowTotal {
			t.Fatalf("a front read %d bytes", n)
		}
	}
	read.Store(true)
	// The window each stream's receiver keeps open is what auto-tuning
	// grows; the most credit the sender held at once bounds it from the
	// other side (a sender spending each grant as it lands never holds
	// much, so that peak alone cannot show the growth).
	size := func(st *stream) int64 {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.recv.Size()
	}
	wf, ws := size(fast), size(slow)
	pf, ps := cs.Peak(fid), cs.Peak(sid)
	t.Logf("window: fast stream %d, slow stream %d; peak credit %d, %d (buffer %d)", wf, ws, pf, ps, buffer)
	if wf <= open || wf > int64(buffer) || pf > buffer {
		t.Fatalf("fast stream: window %d, peak credit %d, want a window above %d and both at most the %d buffer", wf, pf, open, buffer)
	}
	if ws != open || ps > open {
		t.Fatalf("slow stream: window %d, peak credit %d, want the %d granted at open", ws, ps, open)
	}
}

// TestCreditOverrunOnlyBeforeTheBrokersFirstWindow: a broker that ignores
// credit. DATA beyond a stream's credit is owed while the broker may not
// yet have read our extensions answer (it sent no WINDOW yet: a stream it
// opened before reading the answer carries plain-v1 bytes); once it sent a
// WINDOW, every later frame was sent under credit, and DATA beyond the
// credit ends the registration as a protocol error (spec/reach.md: a
// sender never exceeds the credit it was granted).
func TestCreditOverrunOnlyBeforeTheBrokersFirstWindow(t *testing.T) {
	c, h := creditFake(t, nil)
	if typ, data, err := rawRead(t, h, step); err != nil || typ != websocket.MessageText {
		t.Fatalf("first message %v %q %v", typ, data, err)
	}
	id := wire.NewID()
	h.Open(id)
	accept(t, c)
	if f := rawFrame(t, h); f.Flags != wire.FlagWindow || f.StreamID != id {
		t.Fatalf("at open: flags %d, want a WINDOW", f.Flags)
	}
	// The broker's credit is openWindow (2 MiB); send 64 KiB more before
	// any WINDOW of ours: tolerated and counted. The front does not read,
	// so no grant comes meanwhile (the bytes fit its buffer).
	chunk := make([]byte, 64<<10)
	for range (openWindow + len(chunk)) / len(chunk) {
		h.Data(id, chunk)
	}
	testenv.WaitFor(t, "the overrun counted", func() bool { return c.Counts()["window_overrun"] == 1 })
	if n := c.Counts()["protocol_error"]; n != 0 {
		t.Fatalf("an overrun before the broker's first WINDOW was a protocol error (%d)", n)
	}
	// The broker's first WINDOW (for our direction); then one more DATA
	// frame: the stream still owes 64 KiB, so it is beyond the credit.
	sendWindow(t, h, id, 1000)
	h.Data(id, []byte("beyond the credit"))
	if err := h.ReadErr(); err == nil {
		t.Fatal("registration survived DATA beyond the credit after a WINDOW")
	}
	waitLastError(t, c, codeProtocol)
	if n := c.Counts()["window_overrun"]; n != 1 {
		t.Fatalf("window_overrun counted %d times, want the one before the WINDOW", n)
	}
}

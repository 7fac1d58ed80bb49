package proxy

// HTTP/2 abuse against the front, over raw frames (x/net/http2 Framer) on
// a pinned TLS connection: rapid reset (CVE-2023-44487), CONTINUATION
// floods (CVE-2023-45288 / CVE-2024-27316 style), SETTINGS and PING floods
// from a peer that never reads, and streams opened up to and beyond
// MaxConcurrentStreams. Each test asserts that the abusive connection is
// closed or its work bounded, that the server's goroutines and heap stay
// bounded (sampled in-process during the attack) and return to the
// baseline afterwards, and that a well-behaved HTTP/2 client on another
// connection is served throughout. Bounds are on counts and bytes only; no
// test asserts a speed. Run with -v to see the figures (README "Reliability").

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// maxStreams is the front's advertised SETTINGS_MAX_CONCURRENT_STREAMS.
const maxStreams = 250

// Bounds the attacks must stay within. They are generous multiples of what
// one connection legitimately costs (maxStreams handlers, each with an
// upstream request and the fake upstream's goroutines, all in this process),
// and far below what the attacks would cost unbounded (one goroutine and
// request per stream sent, or one queued frame per frame sent).
const (
	maxExtraGoroutines = 8 * maxStreams // over the baseline, at the peak
	maxExtraHeap       = 256 << 20      // HeapInuse over the baseline, at the peak
	settleGoroutines   = 40             // over the baseline, after the attack
)

// resources samples the process's goroutines and heap while an attack runs.
type resources struct {
	baseG    int
	baseHeap uint64
	peakG    atomic.Int64
	peakHeap atomic.Uint64
	stop     chan struct{}
	done     chan struct{}
}

func sampleResources() *resources {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r := &resources{baseG: runtime.NumGoroutine(), baseHeap: ms.HeapInuse, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			if g := int64(runtime.NumGoroutine()); g > r.peakG.Load() {
				r.peakG.Store(g)
			}
			if n%10 == 0 { // ReadMemStats stops the world; not every tick
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > r.peakHeap.Load() {
					r.peakHeap.Store(ms.HeapInuse)
				}
			}
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return r
}

// finish stops sampling, asserts the peaks, waits for the goroutines to
// come back to the baseline, and logs the figures.
func (r *resources) finish(t *testing.T, what string) {
	t.Helper()
	close(r.stop)
	<-r.done
	peakG, peakHeap := int(r.peakG.Load()), r.peakHeap.Load()
	extraHeap := int64(peakHeap) - int64(r.baseHeap)
	if peakG-r.baseG > maxExtraGoroutines {
		t.Errorf("%s: goroutines peaked at %d, %d over the baseline %d (bound %d)", what, peakG, peakG-r.baseG, r.baseG, maxExtraGoroutines)
	}
	if extraHeap > maxExtraHeap {
		t.Errorf("%s: heap in use peaked at %d MiB, %d MiB over the baseline (bound %d MiB)", what, peakHeap>>20, extraHeap>>20, maxExtraHeap>>20)
	}
	deadline := time.Now().Add(testTimeout)
	g := runtime.NumGoroutine()
	for ; g > r.baseG+settleGoroutines && time.Now().Before(deadline); g = runtime.NumGoroutine() {
		time.Sleep(20 * time.Millisecond)
	}
	if g > r.baseG+settleGoroutines {
		t.Errorf("%s: %d goroutines after the attack, baseline %d: something leaked", what, g, r.baseG)
	}
	t.Logf("%s: goroutines baseline %d, peak %d, after %d; heap in use baseline %.1f MiB, peak %.1f MiB",
		what, r.baseG, peakG, g, float64(r.baseHeap)/(1<<20), float64(peakHeap)/(1<<20))
}

// goodClient is a well-behaved HTTP/2 client on its own connection that
// keeps sending GETs until stopped.
type goodClient struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value
	stop       chan struct{}
	done       chan struct{}
}

func (h *harness) startGoodClient() *goodClient {
	tr := &http.Transport{TLSClientConfig: h.tlsConfig(), ForceAttemptHTTP2: true, DisableCompression: true}
	cl := &http.Client{Transport: tr, Timeout: testTimeout}
	g := &goodClient{stop: make(chan struct{}), done: make(chan struct{})}
	get := func() error {
		resp, err := cl.Get(h.url("/api/good"))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.ProtoMajor != 2 || resp.StatusCode != 200 || string(b) != "upstream ok" {
			return errors.New(resp.Proto + " " + resp.Status + ": " + string(b))
		}
		return nil
	}
	if err := get(); err != nil { // connected and served before the attack
		h.t.Fatalf("well-behaved client before the attack: %v", err)
	}
	go func() {
		defer close(g.done)
		defer tr.CloseIdleConnections()
		for {
			select {
			case <-g.stop:
				return
			default:
			}
			if err := get(); err != nil {
				g.failed.Add(1)
				g.firstErr.CompareAndSwap(nil, err.Error())
			} else {
				g.ok.Add(1)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return g
}

// finish stops the client and asserts it was served during the attack.
func (g *goodClient) finish(t *testing.T, what string) {
	t.Helper()
	close(g.stop)
	<-g.done
	if n := g.failed.Load(); n > 0 {
		t.Errorf("%s: the well-behaved client failed %d of %d requests during the attack: %v", what, n, n+g.ok.Load(), g.firstErr.Load())
	}
	if g.ok.Load() == 0 {
		t.Errorf("%s: the well-behaved client completed no request during the attack", what)
	}
	t.Logf("%s: well-behaved client: %d requests served, %d failed", what, g.ok.Load(), g.failed.Load())
}

// h2Peer is the attacker: a raw HTTP/2 connection over pinned TLS.
type h2Peer struct {
	t    *testing.T
	h    *harness
	c    *tls.Conn
	bw   *bufio.Writer
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder

	// Filled by readAll.
	mu        sync.Mutex
	frames    map[http2.FrameType]int
	goAway    *http2.ErrCode
	ended     map[uint32]bool // END_STREAM or RST_STREAM seen
	resets    map[uint32]http2.ErrCode
	readErr   error
	readDone  chan struct{}
	sentBytes atomic.Int64
}

// countingWriter counts what the attacker managed to hand to the socket.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// dialH2 opens the attacker's connection and completes the SETTINGS
// exchange. rcvBuf > 0 shrinks the socket's receive buffer, so a peer that
// stops reading stalls the server's writes early.
func (h *harness) dialH2(rcvBuf int) *h2Peer {
	h.t.Helper()
	cfg := h.tlsConfig()
	cfg.NextProtos = []string{"h2"}
	c, err := h.dialTLS(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		h.t.Fatalf("negotiated %q, want h2", p)
	}
	if rcvBuf > 0 {
		if err := c.NetConn().(*net.TCPConn).SetReadBuffer(rcvBuf); err != nil {
			h.t.Fatal(err)
		}
	}
	c.SetDeadline(time.Now().Add(4 * testTimeout))
	p := &h2Peer{t: h.t, h: h, c: c, frames: map[http2.FrameType]int{}, ended: map[uint32]bool{}, resets: map[uint32]http2.ErrCode{}, readDone: make(chan struct{})}
	p.bw = bufio.NewWriterSize(countingWriter{c, &p.sentBytes}, 64<<10)
	p.fr = http2.NewFramer(p.bw, c)
	p.henc = hpack.NewEncoder(&p.hbuf)
	if _, err := io.WriteString(p.bw, http2.ClientPreface); err != nil {
		h.t.Fatal(err)
	}
	if err := p.fr.WriteSettings(); err != nil {
		h.t.Fatal(err)
	}
	p.flush()
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			h.t.Fatalf("reading the server's SETTINGS: %v", err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			if v, ok := sf.Value(http2.SettingMaxConcurrentStreams); !ok || v != maxStreams {
				h.t.Fatalf("server SETTINGS_MAX_CONCURRENT_STREAMS = %d (%v), want %d", v, ok, maxStreams)
			}
			break
		}
	}
	if err := p.fr.WriteSettingsAck(); err != nil {
		h.t.Fatal(err)
	}
	p.flush()
	return p
}

func (p *h2Peer) flush() error { return p.bw.Flush() }

// block encodes a request header block; extra fields are appended.
func (p *h2Peer) block(method, path string, extra ...hpack.HeaderField) []byte {
	p.hbuf.Reset()
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: method}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: p.h.addr}, {Name: ":path", Value: path},
	}, extra...) {
		p.henc.WriteField(f)
	}
	return bytes.Clone(p.hbuf.Bytes())
}

// readAll reads the server's frames in the background until the connection
// ends, recording what came.
func (p *h2Peer) readAll() {
	go func() {
		defer close(p.readDone)
		for {
			f, err := p.fr.ReadFrame()
			p.mu.Lock()
			if err != nil {
				p.readErr = err
				p.mu.Unlock()
				return
			}
			p.frames[f.Header().Type]++
			id := f.Header().StreamID
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				code := f.ErrCode
				p.goAway = &code
			case *http2.RSTStreamFrame:
				p.ended[id] = true
				p.resets[id] = f.ErrCode
			case *http2.HeadersFrame:
				if f.StreamEnded() {
					p.ended[id] = true
				}
			case *http2.DataFrame:
				if f.StreamEnded() {
					p.ended[id] = true
				}
			}
			p.mu.Unlock()
		}
	}()
}

// waitClosed waits for the server to end the connection (read error).
func (p *h2Peer) waitClosed(what string) {
	p.t.Helper()
	select {
	case <-p.readDone:
	case <-time.After(2 * testTimeout):
		p.t.Fatalf("%s: the server did not close the abusive connection", what)
	}
	var ne net.Error
	if errors.As(p.readErr, &ne) && ne.Timeout() {
		p.t.Fatalf("%s: the connection only ended by the client's own deadline", what)
	}
}

// ping sends a PING and waits for its ACK: everything sent before it has
// been processed. It reports false when the connection ended instead.
func (p *h2Peer) ping() bool {
	before := p.count(http2.FramePing)
	if p.fr.WritePing(false, [8]byte{'s', 'y', 'n', 'c'}) != nil || p.flush() != nil {
		return false
	}
	deadline := time.Now().Add(2 * testTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-p.readDone:
			return false
		default:
		}
		if p.count(http2.FramePing) > before {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.t.Fatal("no PING ACK and no close")
	return false
}

func (p *h2Peer) count(t http2.FrameType) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.frames[t]
}

func (p *h2Peer) goAwayCode() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.goAway == nil {
		return "none"
	}
	return p.goAway.String()
}

// hitsOn counts the requests the fake API received for one path (the
// well-behaved client uses another).
func (u *upstream) hitsOn(path string) int {
	n := 0
	for _, r := range u.requests() {
		if r.RequestURI == path {
			n++
		}
	}
	return n
}

// attack is one abuse test's set-up: a front, a well-behaved client on its
// own connection, the resource sampler, and the attacker's connection.
type attack struct {
	h    *harness
	good *goodClient
	res  *resources
	p    *h2Peer
}

// startAttack sets up an attack; the attacker reads the server's frames in
// the background unless rcvBuf > 0 (a peer that does not read, see dialH2).
func startAttack(t *testing.T, rcvBuf int, opts ...option) *attack {
	h := newHarness(t, opts...)
	a := &attack{h: h, good: h.startGoodClient(), res: sampleResources(), p: h.dialH2(rcvBuf)}
	if rcvBuf == 0 {
		a.p.readAll()
	}
	return a
}

// finish asserts the well-behaved client was served and the resources
// stayed bounded.
func (a *attack) finish(t *testing.T, what string) {
	t.Helper()
	a.good.finish(t, what)
	a.res.finish(t, what)
}

// CVE-2023-44487: HEADERS immediately followed by RST_STREAM, as fast as
// the socket takes them. The server must not run a handler (and an upstream
// request) per stream sent, nor queue them without bound.
func TestHTTP2RapidResetIsBounded(t *testing.T) {
	a := startAttack(t, 0)
	h, p := a.h, a.p
	// 6,000 pairs keep it well inside the PING deadline under -race on 2
	// loaded cores; the bound it checks does not depend on the count.
	const streams = 6000
	sent := 0
	for i := 0; i < streams; i++ {
		id := uint32(2*i + 1)
		if p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block("GET", "/api/rapid-reset"), EndStream: true, EndHeaders: true}) != nil ||
			p.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			break
		}
		sent++
		if i%64 == 63 && p.flush() != nil {
			break
		}
	}
	p.flush()
	alive := p.ping()
	a.finish(t, "rapid reset")
	hits := h.api.hitsOn("/rapid-reset")
	if hits > sent {
		t.Errorf("upstream received %d attack requests for %d streams", hits, sent)
	}
	t.Logf("rapid reset: %d HEADERS+RST_STREAM pairs sent (%d KiB), %d reached the upstream, GOAWAY %s, connection open after: %v",
		sent, p.sentBytes.Load()>>10, hits, p.goAwayCode(), alive)
}

// CONTINUATION frames carrying header data without END_HEADERS: the server
// must stop at its header-list limit (MaxHeaderBytes) and close the
// connection, not buffer or decode without end.
func TestHTTP2ContinuationFloodIsCut(t *testing.T) {
	a := startAttack(t, 0)
	p := a.p
	const maxFlood = 64 << 20
	var frag bytes.Buffer
	enc := hpack.NewEncoder(&frag)
	enc.SetMaxDynamicTableSizeLimit(0)
	val := string(bytes.Repeat([]byte("v"), 1000))
	for frag.Len() < 16000 {
		enc.WriteField(hpack.HeaderField{Name: "x-flood", Value: val, Sensitive: true})
	}
	frames, cut := 0, false
	if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: p.block("GET", "/api/continuation"), EndHeaders: false}); err != nil {
		t.Fatal(err)
	}
	for p.sentBytes.Load() < maxFlood {
		if p.fr.WriteContinuation(1, false, frag.Bytes()) != nil {
			cut = true
			break
		}
		frames++
		select {
		case <-p.readDone:
			cut = true
		default:
		}
		if cut {
			break
		}
	}
	p.flush()
	p.waitClosed("CONTINUATION flood")
	a.finish(t, "CONTINUATION flood")
	if !cut {
		t.Errorf("CONTINUATION flood: the server took %d MiB of one header block", maxFlood>>20)
	}
	if got := p.goAwayCode(); got == "none" {
		t.Errorf("CONTINUATION flood: no GOAWAY before the close")
	}
	t.Logf("CONTINUATION flood: %d CONTINUATION frames of %d bytes written (%d KiB handed to the socket) before the server closed; GOAWAY %s",
		frames, frag.Len(), p.sentBytes.Load()>>10, p.goAwayCode())
}

// Empty CONTINUATION frames never grow the header block, so the size limit
// never trips; they cost the server a frame read each. The connection has
// no open stream meanwhile, so IdleTimeout ends it.
func TestHTTP2EmptyContinuationFloodEndsAtIdleTimeout(t *testing.T) {
	a := startAttack(t, 0, withLimits(func(l *Limits) { l.IdleTimeout = time.Second }))
	p := a.p
	const maxFrames = 50_000_000 // ~430 MiB: far more than the idle timeout lets through
	if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: p.block("GET", "/api/empty-continuation"), EndHeaders: false}); err != nil {
		t.Fatal(err)
	}
	frames, cut := 0, false
	for frames < maxFrames && !cut {
		if p.fr.WriteContinuation(1, false, nil) != nil {
			cut = true
			break
		}
		frames++
		if frames%4096 == 0 {
			select {
			case <-p.readDone:
				cut = true
			default:
			}
		}
	}
	p.flush()
	p.waitClosed("empty CONTINUATION flood")
	a.finish(t, "empty CONTINUATION flood")
	if !cut {
		t.Errorf("empty CONTINUATION flood: %d frames went through without the connection ending", frames)
	}
	t.Logf("empty CONTINUATION flood: %d empty CONTINUATION frames (%d KiB) before the close (IdleTimeout 1s); GOAWAY %s",
		frames, p.sentBytes.Load()>>10, p.goAwayCode())
}

// floodUnread sends frames that each ask for an answer (an ACK) from a peer
// that does not read them, with a small receive buffer. The server must
// either coalesce the answers (SETTINGS ACKs: one pending at a time) or
// close the connection once its queue of control frames is full (PING
// ACKs); it must never queue one answer per frame without end. The flood
// stops at maxFrames, when the server closes, or when the socket takes
// nothing for a few seconds (TCP itself stalls a peer that does not read).
// Then the peer reads until the server closes the connection, which
// waitClosed bounds at 2*testTimeout, well under the default IdleTimeout.
func floodUnread(t *testing.T, what string, opts []option, write func(*http2.Framer) error) {
	a := startAttack(t, 4096, opts...)
	p := a.p
	const (
		maxFrames = 2_000_000
		stall     = 3 * time.Second // no progress for this long: the flood is stalled
	)
	frames := 0
	var werr error
	for ; frames < maxFrames && werr == nil; frames++ {
		if frames%1024 == 0 {
			p.c.SetWriteDeadline(time.Now().Add(stall))
		}
		werr = write(p.fr)
	}
	if werr == nil {
		werr = p.flush()
	}
	var ne net.Error
	how := "all sent"
	switch {
	case errors.As(werr, &ne) && ne.Timeout():
		how = "the socket stalled"
	case werr != nil:
		how = "the server closed the connection during the flood"
	}
	p.readAll() // now read what the server wrote, until it closes
	p.waitClosed(what)
	a.finish(t, what)
	answers := p.count(http2.FrameSettings) + p.count(http2.FramePing)
	if answers > frames/2 {
		t.Errorf("%s: the server answered %d of %d frames of a peer that was not reading", what, answers, frames)
	}
	t.Logf("%s: %d frames written (%d KiB), %s; %d answers read afterwards, then the server closed the connection; GOAWAY %s",
		what, frames, p.sentBytes.Load()>>10, how, answers, p.goAwayCode())
}

// SETTINGS ACKs are coalesced (net/http keeps one pending), so the flood
// queues nothing; the connection has no stream, so IdleTimeout ends it.
func TestHTTP2SettingsFloodIsBounded(t *testing.T) {
	floodUnread(t, "SETTINGS flood", []option{withLimits(func(l *Limits) { l.IdleTimeout = 2 * time.Second })},
		func(fr *http2.Framer) error { return fr.WriteSettings() })
}

// PING ACKs are queued one per PING: the server must close the connection
// once the queue is full (net/http: 10,000 control frames), long before
// its default idle timeout.
func TestHTTP2PingFloodIsCut(t *testing.T) {
	floodUnread(t, "PING flood", nil, func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{'f', 'l', 'o', 'o', 'd'}) })
}

// Streams that never send their body hold a handler (and an upstream
// request) each: up to MaxConcurrentStreams are accepted, every stream
// beyond is refused with RST_STREAM, and closing the connection releases
// them all. (BodyReadTimeout ending a stalled body is
// TestStalledUploadIsAborted's; here it stays long, so no held stream ends
// and frees a slot while the extra streams arrive.)
func TestHTTP2IdleStreamsAreBounded(t *testing.T) {
	a := startAttack(t, 0)
	h, p := a.h, a.p
	const extra = 50
	for i := 0; i < maxStreams+extra; i++ {
		id := uint32(2*i + 1)
		if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block("POST", "/api/idle-stream"), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.flush(); err != nil {
		t.Fatal(err)
	}
	if !p.ping() {
		t.Fatalf("idle streams: the server closed the connection (GOAWAY %s)", p.goAwayCode())
	}
	refused, heldEnded := 0, 0
	p.mu.Lock()
	for i := 0; i < maxStreams+extra; i++ {
		_, reset := p.resets[uint32(2*i+1)]
		switch {
		case i >= maxStreams && reset:
			refused++
		case i < maxStreams && p.ended[uint32(2*i+1)]:
			heldEnded++
		}
	}
	p.mu.Unlock()
	if refused != extra {
		t.Errorf("idle streams: %d of the %d streams beyond MaxConcurrentStreams were refused", refused, extra)
	}
	if heldEnded != 0 {
		t.Errorf("idle streams: %d of the first %d streams ended early", heldEnded, maxStreams)
	}
	waitFor(t, "the held streams to reach the upstream", func() bool { return h.api.hitsOn("/idle-stream") >= maxStreams })
	held := h.api.hitsOn("/idle-stream")
	peakG := int(a.res.peakG.Load())
	p.c.Close() // the attacker leaves: every held stream must be released
	a.finish(t, "idle streams")
	if held > maxStreams {
		t.Errorf("idle streams: %d requests reached the upstream, more than MaxConcurrentStreams (%d)", held, maxStreams)
	}
	t.Logf("idle streams: %d opened, %d refused with RST_STREAM, %d held (reached the upstream; %d goroutines in the process while held), all released when the attacker closed; GOAWAY %s",
		maxStreams+extra, refused, held, peakG, p.goAwayCode())
}

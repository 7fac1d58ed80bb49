package server

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/testfake"
)

// committed is what host h has committed to the broker over its credit
// streams, counted from the streams themselves: the client-bound bytes
// queued for them plus the credit the host still holds.
func committed(h *hostSession) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.downHeld
	for _, s := range h.streams {
		if s.credit {
			n += s.downWin.Credit()
		}
	}
	return n
}

// capPattern is the byte at offset off of stream i's download.
func capPattern(i, off int) byte { return byte(i*31 + off/7) }

// TestHostCreditCapHoldsWithManyBulkStreams: four bulk downloads to slow
// readers on one host whose cap is exactly its four initial windows. The
// host's queued bytes plus the credit it holds never pass the cap, as the
// broker's own counters show; every stream completes byte-exact (none
// starves), and once the clients are gone the broker holds nothing.
func TestHostCreditCapHoldsWithManyBulkStreams(t *testing.T) {
	const (
		streams  = 4
		capBytes = streams * wire.InitialWindow
		total    = 3 << 20 // per stream
	)
	e := newEnv(t, func(c *Config) { c.HostCreditBytes, c.MaxStreamsPerHost = capBytes, streams })
	host := e.creditHost(0)
	tok := wire.NewToken()
	e.publishRoute(host, "r1", tok)
	e.pipeN = 1 // each client's socket holds one message: slow readers
	var clients [streams]*pipeConn
	var ids [streams]wire.ID
	index := map[wire.ID]int{}
	for i := range clients {
		clients[i], ids[i] = e.client(host, 0, wire.KindRoute, tok)
		index[ids[i]] = i
	}
	h := e.session(0)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make(chan error, 2*streams+3)
	var wg sync.WaitGroup

	// The host: sends each stream's bytes within the credit it holds, and
	// reads the broker's grants.
	var credit [streams]atomic.Int64
	for i := range credit {
		credit[i].Store(wire.InitialWindow)
	}
	more := make(chan struct{}, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			typ, data, err := host.Read(ctx)
			if err != nil {
				return
			}
			f, err := wire.Dialect{Credit: true}.ParseFrame(data)
			if typ != Binary || err != nil || f.Flags != wire.FlagWindow {
				errs <- fmt.Errorf("host got %v %v flags %d", typ, err, f.Flags)
				return
			}
			credit[index[f.StreamID]].Add(int64(f.Increment()))
			signal(more)
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		var sent [streams]int
		for {
			done := true
			for i := range sent {
				n := min(64<<10, int(credit[i].Load()), total-sent[i])
				if sent[i] < total {
					done = false
				}
				if n <= 0 {
					continue
				}
				p := make([]byte, n)
				for k := range p {
					p[k] = capPattern(i, sent[i]+k)
				}
				if err := host.Write(ctx, Binary, dataFrame(ids[i], p)); err != nil {
					errs <- fmt.Errorf("host write: %v", err)
					return
				}
				credit[i].Add(-int64(n))
				sent[i] += n
			}
			if done {
				return
			}
			select {
			case <-more:
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				errs <- fmt.Errorf("host sent %v of %d each", sent, total)
				return
			}
		}
	}()
	// The slow readers.
	var readers sync.WaitGroup
	for i, c := range clients {
		readers.Add(1)
		go func() {
			defer readers.Done()
			got := 0
			for got < total {
				typ, data, err := c.Read(ctx)
				if err != nil || typ != Binary {
					errs <- fmt.Errorf("stream %d after %d bytes: %v", i, got, err)
					return
				}
				for k, b := range data {
					if b != capPattern(i, got+k) {
						errs <- fmt.Errorf("stream %d: wrong byte at %d", i, got+k)
						return
					}
				}
				got += len(data)
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	// The broker's counters, sampled until the readers are done.
	var peak, peakHeld, samples atomic.Int64
	stopSampling := sample(200*time.Microsecond, func() {
		n := committed(h)
		h.mu.Lock()
		held := h.downHeld
		h.mu.Unlock()
		samples.Add(1)
		peak.Store(max(peak.Load(), int64(n)))
		peakHeld.Store(max(peakHeld.Load(), int64(held)))
	})
	readers.Wait()
	stopSampling()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if samples.Load() == 0 {
		t.Fatal("no sample")
	}
	if peak.Load() > capBytes || peakHeld.Load() > capBytes {
		t.Fatalf("the host had %d bytes committed (%d queued), cap %d", peak.Load(), peakHeld.Load(), capBytes)
	}
	for _, c := range clients {
		c.Close(1000, "")
	}
	cancel()
	wg.Wait()
	waitFor(t, "queues released", func() bool {
		h.mu.Lock()
		out := h.creditOut // the broker's own sum, checked against the streams'
		h.mu.Unlock()
		return e.b.Stats().QueuedBytes == 0 && committed(h) == 0 && out == 0
	})
	t.Logf("peak committed %d, queued %d bytes (cap %d) over %d samples", peak.Load(), peakHeld.Load(), capBytes, samples.Load())
}

// TestHostCreditCapWithholdsGrantsWhileEndedStreamsFlush: a stream the host
// closed still holds 256 KiB for its stalled client, so the initial windows
// of two new streams put the host over its cap (2 streams × 256 KiB). A
// client that drains its stream then gets no grant that would pass the cap;
// once the stalled client reads, the room goes to the stream waiting.
func TestHostCreditCapWithholdsGrantsWhileEndedStreamsFlush(t *testing.T) {
	const capBytes = 2 * wire.InitialWindow
	e := newEnv(t, func(c *Config) { c.HostCreditBytes, c.MaxStreamsPerHost = capBytes, 2 })
	host := e.creditHost(0)
	tok := wire.NewToken()
	e.publishRoute(host, "r1", tok)
	credit := wire.Dialect{Credit: true}
	e.pipeN = 1 // A's socket holds one message
	a, aid := e.client(host, 0, wire.KindRoute, tok)
	e.pipeN = 16
	h := e.session(0)
	held := func() int { return downHeld(h) }

	// 64 KiB fill A's socket and come back as a grant; 256 KiB more stay
	// queued at the broker; then the host closes A.
	sendBinary(t, host, dataFrame(aid, make([]byte, wire.GrantThreshold)))
	if f := hostFrame(t, host, credit); f.Flags != wire.FlagWindow || f.StreamID != aid || f.Increment() != wire.GrantThreshold {
		t.Fatalf("first grant: %+v", f)
	}
	for i := 0; i < 4; i++ {
		sendBinary(t, host, dataFrame(aid, bytes.Repeat([]byte{1}, 64<<10)))
	}
	waitFor(t, "A's bytes queued", func() bool { return held() == wire.InitialWindow })
	sendBinary(t, host, closeFrame(aid))
	waitFor(t, "A ended", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.streams) == 0
	})

	b, bid := e.client(host, 0, wire.KindRoute, tok)
	_, _ = e.client(host, 0, wire.KindRoute, tok) // holds its initial window
	if n := committed(h); n != 3*wire.InitialWindow {
		t.Fatalf("committed %d, want A's queue and two initial windows", n)
	}
	for i := 0; i < 4; i++ {
		sendBinary(t, host, dataFrame(bid, bytes.Repeat([]byte{2}, 64<<10)))
	}
	for got := 0; got < wire.InitialWindow; {
		got += len(readBinary(t, b))
	}
	if !quiet(host) {
		t.Fatalf("a grant went out with %d bytes committed, cap %d", committed(h), capBytes)
	}
	// A's client reads: its bytes leave the broker, and B gets the room.
	for got := 0; got < wire.GrantThreshold+wire.InitialWindow; {
		got += len(readBinary(t, a))
	}
	for granted := 0; granted < wire.InitialWindow; {
		f := hostFrame(t, host, credit)
		if f.Flags != wire.FlagWindow || f.StreamID != bid {
			t.Fatalf("expected B's grant, got flags %d for %v", f.Flags, f.StreamID)
		}
		granted += int(f.Increment())
	}
	if n := committed(h); n > capBytes {
		t.Fatalf("committed %d after the grant, cap %d", n, capBytes)
	}
}

// TestGrownWindowsLeaveTheUnopenedStreamsTheirInitialWindows: two streams
// of a host whose cap is 8 initial windows and which may hold 4 streams
// download with clients that keep up, so their windows grow; then the
// other two streams open. Growth may only take the room beyond the
// initial windows of the streams not yet opened, so with all four open the
// credit the host holds stays within the cap.
func TestGrownWindowsLeaveTheUnopenedStreamsTheirInitialWindows(t *testing.T) {
	const capBytes, streams = 8 * wire.InitialWindow, 4
	e := newEnv(t, func(c *Config) { c.HostCreditBytes, c.MaxStreamsPerHost = capBytes, streams })
	host := e.creditHost(0)
	tok := wire.NewToken()
	e.publishRoute(host, "r1", tok)
	a, aid := e.client(host, 0, wire.KindRoute, tok)
	b, bid := e.client(host, 0, wire.KindRoute, tok)
	cs := testfake.NewCreditSender(aid, bid)
	opened := make(chan struct{}, 2)
	go func() { // the host's reader: WINDOW frames, and the later opens
		for {
			typ, data, err := host.Read(context.Background())
			if err != nil {
				return
			}
			if typ == Text {
				if m, err := wire.ParseBrokerMessage(data); err != nil {
					t.Errorf("host got %q: %v", data, err)
				} else if _, ok := m.(wire.Open); !ok {
					t.Errorf("host got %#v", m)
				}
				opened <- struct{}{}
				continue
			}
			f, perr := wire.Dialect{Credit: true}.ParseFrame(data)
			if perr == nil && f.Flags == wire.FlagClose {
				continue // the streams' ends, as the test closes
			}
			if perr != nil || f.Flags != wire.FlagWindow {
				t.Errorf("host got %v %v flags %d", typ, perr, f.Flags)
				return
			}
			cs.Grant(f.StreamID, f.Increment(), 20*time.Millisecond)
		}
	}()
	const total = 16 << 20
	got := make(chan int, 2)
	for _, c := range []*pipeConn{a, b} {
		go func() {
			n := 0
			for n < total {
				_, data, err := c.Read(context.Background())
				if err != nil {
					break
				}
				n += len(data)
			}
			got <- n
		}()
	}
	cs.Send(t, map[wire.ID]int{aid: total, bid: total}, func(id wire.ID, n int) {
		sendBinary(t, host, dataFrame(id, make([]byte, n)))
	})
	for range 2 {
		if n := <-got; n != total {
			t.Fatalf("a client got %d of %d bytes", n, total)
		}
	}
	h := e.session(0)
	waitFor(t, "the downloads drained", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.downHeld == 0
	})
	if e.b.Stats().Counts["credit:grow"] == 0 {
		t.Fatal("no window grew: the test shows nothing")
	}
	for range 2 { // the other two streams open (the reader takes the opens)
		c := e.dial()
		e.register(c, wire.RoleClient, e.hosts[0].id, wire.KindRoute, tok, wire.NewID())
		if _, ok := readMsg(t, c).(wire.Matched); !ok {
			t.Fatal("a later client was not matched")
		}
		<-opened
	}
	if n := committed(h); n > capBytes {
		t.Fatalf("with all %d streams open the host holds %d bytes of credit, above the cap %d", streams, n, capBytes)
	}
}

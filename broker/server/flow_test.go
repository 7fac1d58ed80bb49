package server

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// drainUntilClose reads c until it closes and returns the bytes and the code.
func drainUntilClose(t *testing.T, c *pipeConn) ([]byte, int) {
	t.Helper()
	var got []byte
	for {
		typ, data, err := read(t, c)
		var ce *closeError
		if errors.As(err, &ce) {
			return got, ce.Code
		}
		if err != nil {
			t.Fatal(err)
		}
		if typ != Binary {
			t.Fatalf("text %q", data)
		}
		got = append(got, data...)
	}
}

func TestSlowConsumerIsClosedAndOthersContinue(t *testing.T) {
	// 1 KiB client messages, so the client's 4-message pipe fills.
	se := newStreamEnv(t, func(c *Config) { c.SlowConsumerTimeout = 300 * time.Millisecond; c.ClientWriteChunk = 1024 })
	se.pipeN = 4
	se.host = se.env.host(0) // re-register with the small pipe
	se.publishRoute(se.host, "r2", se.token2())
	stuck, stuckID := se.client(se.host, 0, wire.KindRoute, se.tok2)
	moving, movingID := se.client(se.host, 0, wire.KindRoute, se.tok2)

	// The host sends far more than the stuck stream's queue holds.
	const frames = 80
	payload := bytes.Repeat([]byte("s"), 1024)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		ctx, cancel := context.WithTimeout(context.Background(), step)
		defer cancel()
		for i := 0; i < frames; i++ {
			if err := se.host.Write(ctx, Binary, dataFrame(stuckID, payload)); err != nil {
				t.Errorf("host write %d: %v", i, err)
				return
			}
		}
		se.host.Write(ctx, Binary, dataFrame(movingID, []byte("for the other stream")))
	}()
	start := time.Now()
	if got := readBinary(t, se.host); !bytes.Equal(got, closeFrame(stuckID)) {
		t.Fatalf("host got %x, want CLOSE for the stuck stream", got)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatal("closed before the slow-consumer timeout")
	}
	if got := readBinary(t, moving); string(got) != "for the other stream" {
		t.Fatalf("other stream got %q", got)
	}
	<-sent
	// The stuck client gets what its pipe held, then 1013.
	got, code := drainUntilClose(t, stuck)
	if code != wire.CloseTryAgain {
		t.Fatalf("stuck client closed %d", code)
	}
	if len(got) >= frames*len(payload) {
		t.Fatalf("stuck client received everything (%d bytes)", len(got))
	}
	if n := se.b.Stats().Counts["stream:slow_consumer"]; n != 1 {
		t.Fatalf("%d slow-consumer closes", n)
	}
	se.alive(se.host)
}

func (se *streamEnv) token2() wire.Secret {
	se.tok2 = wire.NewToken()
	return se.tok2
}

func TestSlowButMovingReaderIsNeverCut(t *testing.T) {
	se := newStreamEnv(t, func(c *Config) {
		c.SlowConsumerTimeout = 400 * time.Millisecond
		c.StreamQueueFrames = 4
		c.ClientWriteChunk = 1024
	})
	se.pipeN = 2
	se.host = se.env.host(0)
	se.publishRoute(se.host, "r2", se.token2())
	c, id := se.client(se.host, 0, wire.KindRoute, se.tok2)

	// 6 frames of 4 KiB = 24 client messages of 1 KiB; the reader takes
	// one every 60 ms, far slower than the host sends, but always moving.
	var want []byte
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*step)
		defer cancel()
		for i := 0; i < 6; i++ {
			p := bytes.Repeat([]byte{byte('a' + i)}, 4096)
			want = append(want, p...)
			if err := se.host.Write(ctx, Binary, dataFrame(id, p)); err != nil {
				t.Errorf("host write: %v", err)
				return
			}
		}
		se.host.Write(ctx, Binary, closeFrame(id))
	}()
	var got []byte
	for {
		time.Sleep(60 * time.Millisecond)
		typ, data, err := read(t, c)
		if err != nil {
			var ce *closeError
			if !errors.As(err, &ce) || ce.Code != wire.CloseNormal {
				t.Fatalf("slow reader ended with %v after %d bytes", err, len(got))
			}
			break
		}
		if typ != Binary || len(data) > 1024 {
			t.Fatalf("got %v of %d bytes", typ, len(data))
		}
		got = append(got, data...)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d", len(got), len(want))
	}
	if n := se.b.Stats().Counts["stream:slow_consumer"]; n != 0 {
		t.Fatal("a moving reader was cut")
	}
	if se.b.Stats().Counts["paused:host"] == 0 {
		t.Fatal("the host socket was never paused: the test did not fill the queue")
	}
}

func TestUploadFasterThanHostIsPausedNotCut(t *testing.T) {
	se := newStreamEnv(t, func(c *Config) {
		c.SlowConsumerTimeout = 100 * time.Millisecond
		c.StreamQueueFrames = 4
		c.IdleTimeout = 2 * time.Second
	})
	se.pipeN = 2
	se.host = se.env.host(0)
	se.publishRoute(se.host, "r2", se.token2())
	c, id := se.client(se.host, 0, wire.KindRoute, se.tok2)

	const n = 40
	var want []byte
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*step)
		defer cancel()
		for i := 0; i < n; i++ {
			p := bytes.Repeat([]byte{byte(i)}, 64<<10)
			want = append(want, p...)
			if err := c.Write(ctx, Binary, p); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	// The host does not read for much longer than any stream timeout.
	waitFor(t, "the client to be paused", func() bool { return se.b.Stats().Counts["paused:client"] > 0 })
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the client wrote everything while the host was not reading (%v)", err)
	default:
	}
	var got []byte
	for len(got) < n*(64<<10) {
		f, err := wire.ParseFrame(readBinary(t, se.host))
		if err != nil || f.Flags != wire.FlagData || f.StreamID != id {
			t.Fatalf("host got %+v %v", f, err)
		}
		got = append(got, f.Payload...)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("payload differs")
	}
	st := se.b.Stats()
	if st.ActiveStreams != 1 || st.Counts["stream:slow_consumer"] != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestHostBoundDataIsRoundRobin(t *testing.T) {
	se := newStreamEnv(t, nil)
	se.pipeN = 2
	se.host = se.env.host(0)
	se.publishRoute(se.host, "r2", se.token2())
	bulk, bulkID := se.client(se.host, 0, wire.KindRoute, se.tok2)
	small, smallID := se.client(se.host, 0, wire.KindRoute, se.tok2)
	const bulkN, bulkFrame = 20, 1000 + wire.HeaderLen
	for i := 0; i < bulkN; i++ {
		sendBinary(t, bulk, bytes.Repeat([]byte("b"), 1000))
	}
	// The host reads nothing yet, so once its two-message buffer is full
	// the broker's writer cannot finish another write, and the budget
	// (queued frames plus the one being written) can only grow: each
	// state waited for below holds until the test reads.
	waitFor(t, "the bulk stream to queue behind the full host socket", func() bool {
		n, capacity := se.host.Unread()
		return n == capacity && se.b.budget.inUse() == (bulkN-2)*bulkFrame
	})
	sendBinary(t, small, []byte("small"))
	waitFor(t, "the small message to queue", func() bool {
		return se.b.budget.inUse() == int64((bulkN-2)*bulkFrame+len("small")+wire.HeaderLen)
	})
	// Two bulk frames sit in the host's buffer and one more may be in the
	// writer's hands; round-robin then sends at most one more bulk frame
	// before the small one's turn (FIFO would send all 20 first).
	pos := -1
	for i := 0; i <= bulkN; i++ {
		f, _ := wire.ParseFrame(readBinary(t, se.host))
		if f.StreamID == smallID {
			pos = i
			break
		}
		if f.StreamID != bulkID {
			t.Fatal("unknown stream")
		}
	}
	if pos < 0 || pos > 4 {
		t.Fatalf("the small message came at position %d behind the bulk stream", pos)
	}
}

func TestQueueCaps(t *testing.T) {
	cases := map[string]func(*Config){
		"broker-wide": func(c *Config) { c.MaxQueueBytes = 4 * wire.MaxHostFrameIn },
		"per host":    func(c *Config) { c.HostQueueBytes = 2 * wire.MaxHostFrameIn },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			se := newStreamEnv(t, mutate)
			se.pipeN = 1
			se.host = se.env.host(0)
			se.publishRoute(se.host, "r2", se.token2())
			const streams, msgs = 3, 6
			type up struct {
				id   wire.ID
				want []byte
			}
			ups := make([]*up, streams)
			errs := make(chan error, streams)
			clients := make([]*pipeConn, streams)
			for i := range ups {
				c, id := se.client(se.host, 0, wire.KindRoute, se.tok2)
				clients[i] = c
				ups[i] = &up{id: id}
			}
			for i, u := range ups {
				c := clients[i]
				for j := 0; j < msgs; j++ {
					u.want = append(u.want, bytes.Repeat([]byte{byte(i*16 + j)}, wire.MaxClientFrame)...)
				}
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 3*step)
					defer cancel()
					for j := 0; j < msgs; j++ {
						if err := c.Write(ctx, Binary, u.want[j*wire.MaxClientFrame:(j+1)*wire.MaxClientFrame]); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			var over atomic.Int64
			stopSampling := sample(time.Millisecond, func() {
				if used := se.b.budget.inUse(); used > se.cfg.MaxQueueBytes {
					over.Store(used)
				}
				se.b.mu.Lock()
				for _, h := range se.b.hosts {
					h.mu.Lock()
					if h.upBytes > se.cfg.HostQueueBytes {
						over.Store(int64(h.upBytes))
					}
					h.mu.Unlock()
				}
				se.b.mu.Unlock()
			})
			waitFor(t, "clients to be paused", func() bool { return se.b.Stats().Counts["paused:client"] >= streams })
			time.Sleep(200 * time.Millisecond)
			got := map[wire.ID][]byte{}
			total := 0
			for total < streams*msgs*wire.MaxClientFrame {
				f, err := wire.ParseFrame(readBinary(t, se.host))
				if err != nil || f.Flags != wire.FlagData {
					t.Fatalf("host got %+v %v", f, err)
				}
				got[f.StreamID] = append(got[f.StreamID], f.Payload...)
				total += len(f.Payload)
			}
			stopSampling()
			for i := 0; i < streams; i++ {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for _, u := range ups {
				if !bytes.Equal(got[u.id], u.want) {
					t.Fatalf("stream %v: %d bytes differ", u.id, len(got[u.id]))
				}
			}
			if v := over.Load(); v != 0 {
				t.Fatalf("a queue held %d bytes, above its cap", v)
			}
		})
	}
}

func TestKeepaliveDropsSilentPeers(t *testing.T) {
	se := newStreamEnv(t, func(c *Config) {
		c.PingInterval = 50 * time.Millisecond
		c.PongTimeout = 400 * time.Millisecond
	})
	// The host answers pings only while it reads: keep it reading.
	hostMsgs := make(chan []byte, 64)
	go func() {
		for {
			_, data, err := se.host.Read(context.Background())
			if err != nil {
				close(hostMsgs)
				return
			}
			hostMsgs <- data
		}
	}()
	c := se.dial()
	se.register(c, wire.RoleClient, se.hosts[0].id, wire.KindRoute, se.token, wire.NewID())
	if _, ok := readMsg(t, c).(wire.Matched); !ok {
		t.Fatal("not matched")
	}
	openMsg := <-hostMsgs
	open, _ := wire.ParseBrokerMessage(openMsg)
	id := open.(wire.Open).StreamID
	c.SetNoPong(true) // the client goes silent (reads, never answers)
	go func() {
		for {
			if _, _, err := c.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	select {
	case f := <-hostMsgs:
		if !bytes.Equal(f, closeFrame(id)) {
			t.Fatalf("host got %x", f)
		}
	case <-time.After(step):
		t.Fatal("silent client was not dropped")
	}
	if n := se.b.Stats().Counts["stream:ping_timeout"]; n != 1 {
		t.Fatalf("%d client ping timeouts", n)
	}
	// The responsive host stayed through many ping intervals.
	time.Sleep(600 * time.Millisecond)
	if se.b.Stats().HostsOnline != 1 {
		t.Fatal("a host that answers pings was dropped")
	}
	// Now the host goes silent too.
	se.host.SetNoPong(true)
	waitFor(t, "the silent host to be dropped", func() bool { return se.b.Stats().HostsOnline == 0 })
	if n := se.b.Stats().Counts["host:ping_timeout"]; n != 1 {
		t.Fatalf("%d host ping timeouts", n)
	}
}

func TestKeepaliveForgivesPausedReaders(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.PingInterval = 20 * time.Millisecond
		c.PongTimeout = 60 * time.Millisecond
	})
	peer, ours := newPipe(4, "x")
	peer.SetNoPong(true)
	var p msgconn.Pause
	dead := make(chan struct{})
	stop := make(chan struct{})
	defer close(stop)
	go e.b.keepalive(ours, &p, stop, func() { close(dead) }).Run(context.Background())
	p.Enter()
	select {
	case <-dead:
		t.Fatal("dropped while the reader was paused by backpressure")
	case <-time.After(300 * time.Millisecond):
	}
	p.Leave()
	select {
	case <-dead:
	case <-time.After(step):
		t.Fatal("not dropped after the pause ended")
	}
}

// queuedDown is the client-bound bytes queued for host i's streams, plain
// and credit: the live ones and those the host closed whose queue still
// drains (a walk of h.streams sees only the live ones).
func (se *streamEnv) queuedDown(i int) int {
	h := se.session(i)
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.downPlain + h.downHeld
}

// In plain v1 all of a host's client-bound queues together hold at most
// host_queue_bytes, as its host-bound ones do: past it the broker stops
// reading the host socket until a client drains (before, only each
// stream's 8 MiB applied, so 16 slow clients of one host kept ~128 MiB
// queued). Once the clients read, everything arrives byte-exact.
func TestPlainClientBoundQueuesAreCappedPerHost(t *testing.T) {
	// The streams' own queues (64 frames, 8 MiB) hold what the host sends
	// them; together they are more than the host's cap plus what the
	// clients' pipes take.
	se := newStreamEnv(t, func(c *Config) { c.HostQueueBytes, c.StreamQueueFrames = 2*wire.MaxHostFrameIn, 64 })
	se.pipeN = 2
	se.host = se.env.host(0)
	se.publishRoute(se.host, "r2", se.token2())
	const streams, frames, size = 4, 40, 64 << 10
	clients := make([]*pipeConn, streams)
	ids := make([]wire.ID, streams)
	want := make([][]byte, streams)
	for i := range clients {
		clients[i], ids[i] = se.client(se.host, 0, wire.KindRoute, se.tok2)
	}
	sent := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*step)
		defer cancel()
		for j := 0; j < frames; j++ {
			for i := range ids {
				if err := se.host.Write(ctx, Binary, dataFrame(ids[i], bytes.Repeat([]byte{byte(16*i + j)}, size))); err != nil {
					sent <- err
					return
				}
			}
		}
		sent <- nil
	}()
	for i := range want {
		for j := 0; j < frames; j++ {
			want[i] = append(want[i], bytes.Repeat([]byte{byte(16*i + j)}, size)...)
		}
	}
	var over atomic.Int64
	stop := sample(time.Millisecond, func() {
		if n := se.queuedDown(0); n > se.cfg.HostQueueBytes {
			over.Store(int64(n))
		}
	})
	allSent := false
	waitFor(t, "the host to be paused or to send everything", func() bool {
		select {
		case err := <-sent:
			if err != nil {
				t.Fatal(err)
			}
			allSent = true
		default:
		}
		return allSent || se.b.Stats().Counts["paused:host"] > 0
	})
	if n := se.queuedDown(0); n > se.cfg.HostQueueBytes || allSent {
		t.Errorf("the host sent everything (%v) with %d client-bound bytes queued, cap %d", allSent, n, se.cfg.HostQueueBytes)
	}
	got := make([][]byte, streams)
	done := make(chan int, streams)
	for i, c := range clients {
		go func() {
			for len(got[i]) < len(want[i]) {
				typ, data, err := read(t, c)
				if err != nil || typ != Binary {
					break
				}
				got[i] = append(got[i], data...)
			}
			done <- i
		}()
	}
	for range clients {
		<-done
	}
	if !allSent {
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
	}
	stop()
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("stream %d: got %d bytes, want %d, or they differ", i, len(got[i]), len(want[i]))
		}
	}
	if v := over.Load(); v != 0 {
		t.Fatalf("the host's client-bound queues held %d bytes, above %d", v, se.cfg.HostQueueBytes)
	}
	if n := se.b.Stats().Counts["stream:slow_consumer"]; n != 0 {
		t.Fatalf("%d slow-consumer closes", n)
	}
}

// capRig is host 0 with a per-host client-bound cap of two client frames
// and a slow-consumer timeout of 300 ms, and two of its route streams:
// stuck, whose client reads nothing, and moving.
type capRig struct {
	*streamEnv
	stuck, moving     *pipeConn
	stuckID, movingID wire.ID
}

const capRigFrame = 64 << 10

func newCapRig(t *testing.T) *capRig {
	se := newStreamEnv(t, func(c *Config) {
		c.HostQueueBytes = 2 * wire.MaxHostFrameIn
		c.StreamQueueFrames = 64
		c.SlowConsumerTimeout = 300 * time.Millisecond
		c.ClientWriteChunk = 1024
	})
	se.pipeN = 4
	se.host = se.env.host(0)
	se.publishRoute(se.host, "r2", se.token2())
	r := &capRig{streamEnv: se}
	r.stuck, r.stuckID = se.client(se.host, 0, wire.KindRoute, se.tok2)
	r.moving, r.movingID = se.client(se.host, 0, wire.KindRoute, se.tok2)
	return r
}

// send has the host send 32 frames for the stuck stream, which fit its own
// queue (64 frames, 8 MiB) and fill the host's cap, then the frames given
// (a CLOSE for the stuck stream), then one frame for the moving stream,
// which must wait for room.
func (r *capRig) send(t *testing.T, then ...[]byte) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), step)
		defer cancel()
		for i := 0; i < 32; i++ {
			if err := r.host.Write(ctx, Binary, dataFrame(r.stuckID, bytes.Repeat([]byte("s"), capRigFrame))); err != nil {
				t.Errorf("host write %d: %v", i, err)
				return
			}
		}
		for _, f := range then {
			if err := r.host.Write(ctx, Binary, f); err != nil {
				t.Errorf("host write: %v", err)
				return
			}
		}
		r.host.Write(ctx, Binary, dataFrame(r.movingID, bytes.Repeat([]byte("m"), capRigFrame)))
	}()
}

// movingGetsItsFrame reads the moving stream's frame, then the stuck
// stream's close, which must be 1013, and returns what the stuck client got.
func (r *capRig) movingGetsItsFrame(t *testing.T) []byte {
	t.Helper()
	var got []byte
	for len(got) < capRigFrame {
		got = append(got, readBinary(t, r.moving)...)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte("m"), capRigFrame)) {
		t.Fatalf("other stream got %d bytes", len(got))
	}
	rest, code := drainUntilClose(t, r.stuck)
	if code != wire.CloseTryAgain {
		t.Fatalf("stuck client closed %d, want 1013", code)
	}
	if n := r.b.Stats().Counts["stream:slow_consumer"]; n != 1 {
		t.Fatalf("%d slow-consumer closes", n)
	}
	return rest
}

// When a host waits on its per-host client-bound cap, the stream holding
// it whose client makes no progress for slow_consumer_timeout is closed
// (1013), as a stream with a full queue of its own is, and the host's
// other streams continue.
func TestHostCapClosesTheStalledStreamAndOthersContinue(t *testing.T) {
	r := newCapRig(t)
	r.send(t)
	start := time.Now()
	if got := readBinary(t, r.host); !bytes.Equal(got, closeFrame(r.stuckID)) {
		t.Fatalf("host got %x, want CLOSE for the stuck stream", got)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatal("closed before the slow-consumer timeout")
	}
	r.movingGetsItsFrame(t)
	r.alive(r.host)
}

// A stream the host closed keeps its queue, which still holds the host's
// plain cap until written: when its client makes no progress for
// slow_consumer_timeout it is closed 1013 as a live one is, and the host's
// other streams and control messages go on. Before, only live streams were
// looked at: with none holding bytes no timer ran, and the host socket
// stayed unread until the closed stream's write failed (write_timeout,
// renewed by every fragment a trickling client takes).
func TestHostCapClosesAStalledStreamTheHostClosed(t *testing.T) {
	r := newCapRig(t)
	r.send(t, closeFrame(r.stuckID))
	waitFor(t, "the host's CLOSE to end the stream", func() bool {
		return r.b.Stats().Counts["stream:host_close"] == 1
	})
	if r.queuedDown(0) == 0 {
		t.Fatal("the closed stream's queue holds nothing")
	}
	if rest := r.movingGetsItsFrame(t); len(rest) >= 32*capRigFrame {
		t.Fatalf("stuck client got all %d bytes", len(rest))
	}
	if n := r.queuedDown(0); n > capRigFrame {
		t.Fatalf("%d client-bound bytes still queued", n)
	}
	r.alive(r.host) // no CLOSE came back for the stream the host closed
}

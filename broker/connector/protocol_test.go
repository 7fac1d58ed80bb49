package connector

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/testfake"
)

// startFake runs a connector against a fake broker and returns the
// registered fake host end.
func startFake(t *testing.T, mutate func(*Config)) (*testfake.Broker, *Connector, *testfake.Host) {
	t.Helper()
	fb := testfake.NewBroker(t, nil)
	cfg := fakeConfig(t, fb)
	if mutate != nil {
		mutate(&cfg)
	}
	c := newConnector(t, cfg)
	run(t, c)
	h := fb.Host()
	waitConnected(t, c)
	return fb, c, h
}

// echo copies everything a stream's front side reads back to it.
func echo(st *stream) {
	go func() {
		io.Copy(st, st)
	}()
}

func TestRegisterCarriesFreshConnectionIDs(t *testing.T) {
	fb := testfake.NewBroker(t, nil)
	cfg := fakeConfig(t, fb)
	c := newConnector(t, cfg)
	run(t, c)
	h1 := fb.Host()
	if h1.Reg.Role != wire.RoleHost || h1.Reg.CredentialKind != wire.KindHost ||
		h1.Reg.HostID.String() != cfg.HostID || h1.Reg.Token != cfg.Token {
		t.Fatalf("register = %+v", h1.Reg)
	}
	h1.Close() // drop the socket: the connector registers again
	h2 := fb.Host()
	if h2.Reg.ConnectionID == h1.Reg.ConnectionID {
		t.Fatal("a connection_id was reused")
	}
	testenv.WaitFor(t, "two attempts", func() bool { return c.Status().Attempts == 2 })
}

func TestOpenForAnotherRegistrationIsClosedAtOnce(t *testing.T) {
	_, c, h := startFake(t, nil)
	other := wire.NewID()
	h.SendText(wire.Open{StreamID: other, HostConnectionID: wire.NewID()})
	if f := h.Frame(); f.Flags != wire.FlagClose || f.StreamID != other {
		t.Fatalf("got %#v, want CLOSE for the foreign open", f)
	}
	good := wire.NewID()
	h.Open(good)
	if st := accept(t, c); st.id != good {
		t.Fatal("the foreign open reached the front")
	}
	if n := c.Counts()["open_other_registration"]; n != 1 {
		t.Fatalf("open_other_registration = %d", n)
	}
}

func TestDuplicateOpenIsIgnored(t *testing.T) {
	_, c, h := startFake(t, nil)
	id := wire.NewID()
	h.Open(id)
	h.Open(id)
	st := accept(t, c)
	echo(st)
	h.Data(id, []byte("ping"))
	f := h.Frame()
	if f.Flags != wire.FlagData || f.StreamID != id || string(f.Payload) != "ping" {
		t.Fatalf("first frame after a duplicate open: %#v", f)
	}
	if n := c.Counts()["open_duplicate"]; n != 1 {
		t.Fatalf("open_duplicate = %d", n)
	}
	if n := c.Status().ActiveStreams; n != 1 {
		t.Fatalf("active streams = %d", n)
	}
}

func TestDataForUnknownStreamGetsOneClose(t *testing.T) {
	_, c, h := startFake(t, nil)
	unknown, unknownClose := wire.NewID(), wire.NewID()
	h.Data(unknown, []byte("a"))
	h.Data(unknown, []byte("b"))
	h.CloseStream(unknownClose)
	// The registration goes on: a new stream works.
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	echo(st)
	h.Data(id, []byte("still here"))
	closes := map[wire.ID]int{}
	for {
		f := h.Frame()
		if f.Flags == wire.FlagClose {
			closes[f.StreamID]++
			continue
		}
		if f.StreamID != id || string(f.Payload) != "still here" {
			t.Fatalf("unexpected frame %#v", f)
		}
		break
	}
	if closes[unknown] != 1 || closes[unknownClose] != 0 || len(closes) != 1 {
		t.Fatalf("CLOSE answers: %v (want exactly one, for the DATA's stream)", closes)
	}
	if a := c.Status().Attempts; a != 1 {
		t.Fatalf("attempts = %d: DATA for an unknown stream ended the registration", a)
	}
}

func TestBrokerCloseDeliversDataThenEOFAndIsNotAnswered(t *testing.T) {
	_, c, h := startFake(t, nil)
	id := wire.NewID()
	h.Open(id)
	h.Data(id, []byte("hello "))
	h.Data(id, []byte("world"))
	h.CloseStream(id)
	st := accept(t, c)
	got, err := io.ReadAll(st)
	if err != nil || string(got) != "hello world" {
		t.Fatalf("front read %q, %v", got, err)
	}
	if _, err := st.Write([]byte("late")); err == nil {
		t.Fatal("writing to a stream the broker closed succeeded")
	}
	st.Close()
	testenv.WaitFor(t, "the stream to complete", func() bool { return c.Status().CompletedStreams == 1 })
	// Nothing was sent for the closed stream: the next frame belongs to a
	// new stream.
	id2 := wire.NewID()
	h.Open(id2)
	st2 := accept(t, c)
	echo(st2)
	h.Data(id2, []byte("x"))
	if f := h.Frame(); f.StreamID != id2 || f.Flags != wire.FlagData {
		t.Fatalf("a CLOSE was answered with %#v", f)
	}
}

func TestFrontCloseFlushesThenSendsClose(t *testing.T) {
	_, c, h := startFake(t, nil)
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	payload := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320,000 bytes
	if _, err := st.Write(payload); err != nil {
		t.Fatal(err)
	}
	st.Close()
	var got []byte
	for {
		f := h.Frame()
		if f.StreamID != id {
			t.Fatalf("frame for %v", f.StreamID)
		}
		if f.Flags == wire.FlagClose {
			break
		}
		got = append(got, f.Payload...)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("broker got %d bytes, want %d", len(got), len(payload))
	}
	// DATA that crosses our CLOSE is dropped without another CLOSE.
	h.Data(id, []byte("crossing"))
	id2 := wire.NewID()
	h.Open(id2)
	echo(accept(t, c))
	h.Data(id2, []byte("y"))
	if f := h.Frame(); f.StreamID != id2 {
		t.Fatalf("DATA crossing our CLOSE was answered with %#v", f)
	}
}

func TestOpenBeyondMaxStreamsIsClosed(t *testing.T) {
	_, c, h := startFake(t, func(cfg *Config) { cfg.MaxStreams = 2 })
	a, b, extra := wire.NewID(), wire.NewID(), wire.NewID()
	h.Open(a)
	h.Open(b)
	h.Open(extra)
	if f := h.Frame(); f.Flags != wire.FlagClose || f.StreamID != extra {
		t.Fatalf("got %#v, want CLOSE for the third stream", f)
	}
	accept(t, c)
	accept(t, c)
	if n := c.Status().ActiveStreams; n != 2 {
		t.Fatalf("active streams = %d", n)
	}
	if n := c.Counts()["open_over_limit"]; n != 1 {
		t.Fatalf("open_over_limit = %d", n)
	}
}

func TestOpenWithoutFrontIsClosed(t *testing.T) {
	_, c, h := startFake(t, nil)
	c.Listener().Close()
	id := wire.NewID()
	h.Open(id)
	if f := h.Frame(); f.Flags != wire.FlagClose || f.StreamID != id {
		t.Fatalf("got %#v, want CLOSE (local failure)", f)
	}
	if _, err := c.Listener().Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

func TestBrokerBoundFramesAreChunked(t *testing.T) {
	_, c, h := startFake(t, nil)
	bulk, small := wire.NewID(), wire.NewID()
	h.Open(bulk)
	stBulk := accept(t, c)
	h.Open(small)
	stSmall := accept(t, c)
	bulkData := make([]byte, 1<<20)
	for i := range bulkData {
		bulkData[i] = byte(i * 7)
	}
	go stBulk.Write(bulkData)
	go stSmall.Write([]byte("small message"))
	var gotBulk []byte
	var gotSmall []byte
	for len(gotBulk) < len(bulkData) || len(gotSmall) < len("small message") {
		f := h.Frame() // fails on a frame above 64 KiB + 18
		switch f.StreamID {
		case bulk:
			gotBulk = append(gotBulk, f.Payload...)
		case small:
			gotSmall = append(gotSmall, f.Payload...)
		default:
			t.Fatalf("frame for an unknown stream %v", f.StreamID)
		}
	}
	if !bytes.Equal(gotBulk, bulkData) || string(gotSmall) != "small message" {
		t.Fatal("stream bytes were mixed up")
	}
}

func TestSchedulerAlternatesStreams(t *testing.T) {
	fb := testfake.NewBroker(t, nil)
	c := newConnector(t, fakeConfig(t, fb))
	s := newSession(c, nil, wire.NewID(), false)
	a, b := newStream(s, wire.NewID()), newStream(s, wire.NewID())
	s.streams[a.id], s.streams[b.id] = a, b
	a.out.Write(bytes.Repeat([]byte{'a'}, 3*wire.MaxConnectorChunk))
	s.scheduleLocked(a)
	b.out.Write([]byte("b1"))
	s.scheduleLocked(b)
	var order []string
	for {
		_, data, ok := s.next()
		if !ok {
			t.Fatal("session ended")
		}
		if data == nil {
			break
		}
		f, err := wire.ParseFrame(data)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Payload) > wire.MaxConnectorChunk {
			t.Fatalf("chunk of %d bytes", len(f.Payload))
		}
		name := "a"
		if f.StreamID == b.id {
			name = "b"
		}
		order = append(order, name)
		if len(order) == 2 {
			// b gets more while a is still sending: it must come next-but-one.
			b.out.Write([]byte("b2"))
			s.scheduleLocked(b)
		}
	}
	if got := strings.Join(order, ""); got != "ababa" {
		t.Fatalf("frame order %q, want ababa", got)
	}
}

func TestSlowConsumerLosesOnlyItsStream(t *testing.T) {
	_, c, h := startFake(t, func(cfg *Config) {
		cfg.StreamBufferBytes = minFrameBuffer
		cfg.SlowConsumerTimeout = 300 * time.Millisecond
	})
	stuck, other := wire.NewID(), wire.NewID()
	h.Open(stuck)
	stStuck := accept(t, c)
	h.Open(other)
	stOther := accept(t, c)
	chunk := bytes.Repeat([]byte{1}, 64<<10)
	for i := 0; i < 20; i++ { // 1.25 MiB > the 1 MiB buffer; nobody reads
		h.Data(stuck, chunk)
	}
	h.Data(other, []byte("for the other stream"))
	buf := make([]byte, 64)
	stOther.SetReadDeadline(time.Now().Add(step))
	n, err := stOther.Read(buf)
	if err != nil || string(buf[:n]) != "for the other stream" {
		t.Fatalf("other stream read %q, %v", buf[:n], err)
	}
	if f := h.Frame(); f.Flags != wire.FlagClose || f.StreamID != stuck {
		t.Fatalf("got %#v, want CLOSE for the stuck stream", f)
	}
	if _, err := stStuck.Read(buf); !errors.Is(err, errStreamReset) {
		t.Fatalf("stuck stream read: %v, want reset", err)
	}
	if n := c.Counts()["slow_consumer"]; n != 1 {
		t.Fatalf("slow_consumer = %d", n)
	}
	if a := c.Status().Attempts; a != 1 {
		t.Fatalf("attempts = %d", a)
	}
}

func TestSlowButMovingReaderIsNeverCut(t *testing.T) {
	_, c, h := startFake(t, func(cfg *Config) {
		cfg.StreamBufferBytes = minFrameBuffer
		cfg.SlowConsumerTimeout = 300 * time.Millisecond
	})
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	const total = 2 << 20
	got := make(chan int, 1)
	go func() {
		n := 0
		buf := make([]byte, 96<<10)
		for n < total {
			time.Sleep(40 * time.Millisecond) // well below 300 ms between reads
			k, err := st.Read(buf)
			n += k
			if err != nil {
				break
			}
		}
		got <- n
	}()
	chunk := bytes.Repeat([]byte{2}, 64<<10)
	for i := 0; i < total/len(chunk); i++ {
		h.Data(id, chunk)
	}
	select {
	case n := <-got:
		if n != total {
			t.Fatalf("slow reader got %d of %d bytes", n, total)
		}
	case <-time.After(2 * step):
		t.Fatal("slow reader did not finish")
	}
	if n := c.Counts()["slow_consumer"]; n != 0 {
		t.Fatalf("a moving reader was cut (%d)", n)
	}
	if n := c.Counts()["paused"]; n == 0 {
		t.Fatal("the reader never paused; the test did not fill the buffer")
	}
}

func TestStreamDeadlines(t *testing.T) {
	_, c, h := startFake(t, nil)
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	st.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := st.Read(make([]byte, 1)); !isTimeout(err) {
		t.Fatalf("read past deadline: %v", err)
	}
	// A deadline in the past unblocks a pending read (net/http aborts its
	// background read this way).
	st.SetReadDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() { _, err := st.Read(make([]byte, 1)); errc <- err }()
	time.Sleep(20 * time.Millisecond)
	st.SetReadDeadline(time.Unix(1, 0))
	select {
	case err := <-errc:
		if !isTimeout(err) {
			t.Fatalf("aborted read: %v", err)
		}
	case <-time.After(step):
		t.Fatal("a past deadline did not unblock Read")
	}
	st.SetReadDeadline(time.Time{})
	h.Data(id, []byte("ok"))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "ok" {
		t.Fatalf("read after clearing the deadline: %q %v", buf, err)
	}
	// A write blocked on a full send buffer honours its deadline.
	s := c.current()
	s.mu.Lock() // the writer cannot drain meanwhile
	st.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	done := make(chan error, 1)
	go func() {
		_, err := st.Write(make([]byte, c.cfg.StreamSendBytes+1))
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	s.mu.Unlock()
	if err := <-done; !isTimeout(err) {
		t.Fatalf("write past deadline: %v", err)
	}
	st.Close()
	if _, err := st.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v", err)
	}
	if st.RemoteAddr().Network() != "reach" {
		t.Fatalf("remote addr %v", st.RemoteAddr())
	}
}

func TestPingsAndPongTimeout(t *testing.T) {
	t.Run("answered", func(t *testing.T) {
		fb, c, h := startFake(t, func(cfg *Config) {
			cfg.PingInterval = 30 * time.Millisecond
			cfg.PongTimeout = 2 * time.Second
		})
		go h.ReadErr() // reading answers pings
		testenv.WaitFor(t, "three pings", func() bool { return fb.Pings.Load() >= 3 })
		if a := c.Status().Attempts; a != 1 {
			t.Fatalf("attempts = %d", a)
		}
	})
	t.Run("unanswered", func(t *testing.T) {
		var sl sleeps
		sl.setBlock(true)
		_, c, _ := startFake(t, func(cfg *Config) {
			cfg.PingInterval = 30 * time.Millisecond
			cfg.PongTimeout = 150 * time.Millisecond
			cfg.Sleep = sl.sleep
		})
		// The fake never reads, so it never answers a ping.
		testenv.WaitFor(t, "the registration to be dropped", func() bool { return c.Status().State == StateBackoff })
		if st := c.Status(); st.LastError != codePingTimeout {
			t.Fatalf("last error %q", st.LastError)
		}
	})
}

func TestWriteDeadlineEndsRegistration(t *testing.T) {
	var sl sleeps
	sl.setBlock(true)
	_, c, h := startFake(t, func(cfg *Config) {
		cfg.WriteTimeout = 300 * time.Millisecond
		cfg.PingInterval = time.Hour
		cfg.PongTimeout = 2 * time.Hour
		cfg.Sleep = sl.sleep
	})
	id := wire.NewID()
	h.Open(id)
	st := accept(t, c)
	// The fake broker reads nothing more, so TCP fills up and a write stalls.
	go func() {
		buf := make([]byte, 256<<10)
		for {
			if _, err := st.Write(buf); err != nil {
				return
			}
		}
	}()
	testenv.WaitFor(t, "the registration to be dropped", func() bool { return c.Status().State == StateBackoff })
	if st := c.Status(); st.LastError != codeWriteTimeout {
		t.Fatalf("last error %q", st.LastError)
	}
}

func TestRegisterTimeout(t *testing.T) {
	fb := testfake.NewBroker(t, func(fb *testfake.Broker) { fb.Answer = func() []byte { return nil } })
	var sl sleeps
	sl.setBlock(true)
	cfg := fakeConfig(t, fb)
	cfg.RegisterTimeout = 100 * time.Millisecond
	cfg.Sleep = sl.sleep
	c := newConnector(t, cfg)
	run(t, c)
	testenv.WaitFor(t, "backoff", func() bool { return c.Status().State == StateBackoff })
	if st := c.Status(); st.LastError != codeRegTimeout {
		t.Fatalf("last error %q", st.LastError)
	}
}

func TestRedirectIsRefused(t *testing.T) {
	fb := testfake.NewBroker(t, func(fb *testfake.Broker) {
		fb.Handler = func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "ws://127.0.0.1:1/v1/connect", http.StatusFound)
		}
	})
	var sl sleeps
	sl.setBlock(true)
	cfg := fakeConfig(t, fb)
	cfg.Sleep = sl.sleep
	c := newConnector(t, cfg)
	run(t, c)
	testenv.WaitFor(t, "backoff", func() bool { return c.Status().State == StateBackoff })
	if st := c.Status(); st.LastError != codeHTTP {
		t.Fatalf("last error %q", st.LastError)
	}
}

func TestRepliesAreCheckedAgainstTheirRequest(t *testing.T) {
	_, c, h := startFake(t, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := c.PublishBootstrap(context.Background(), time.Minute)
		errc <- err
	}()
	m, _ := h.Read()
	pb, ok := m.(wire.PublishBootstrap)
	if !ok {
		t.Fatalf("got %#v", m)
	}
	// Answer for another pairing: the connector must not accept it as this
	// publisher's reply.
	h.SendText(wire.Published{CredentialKind: wire.KindBootstrap, Label: pb.PairingID + "x"})
	if err := <-errc; err == nil {
		t.Fatal("a mismatched reply was accepted")
	}
	if e := h.ReadErr(); websocket.CloseStatus(e) != websocket.StatusPolicyViolation {
		t.Fatalf("socket ended with %v, want 1008", e)
	}
	testenv.WaitFor(t, "a new registration", func() bool { return c.Status().Attempts >= 2 })
}

func TestErrorReplyReachesOnlyItsCaller(t *testing.T) {
	_, c, h := startFake(t, nil)
	type res struct {
		b   Bootstrap
		err error
	}
	first, second := make(chan res, 1), make(chan res, 1)
	go func() { b, err := c.PublishBootstrap(context.Background(), time.Minute); first <- res{b, err} }()
	m1, _ := h.Read()
	go func() { b, err := c.PublishBootstrap(context.Background(), time.Minute); second <- res{b, err} }()
	m2, _ := h.Read()
	h.SendText(wire.ErrorMsg{Code: wire.CodeQuotaExceeded})
	h.SendText(wire.Published{CredentialKind: wire.KindBootstrap, Label: m2.(wire.PublishBootstrap).PairingID})
	r1, r2 := <-first, <-second
	if !errors.Is(r1.err, wire.ErrQuotaExceeded) {
		t.Fatalf("first caller: %v", r1.err)
	}
	if r2.err != nil || r2.b.PairingID != m2.(wire.PublishBootstrap).PairingID {
		t.Fatalf("second caller: %+v %v", r2.b, r2.err)
	}
	if m1.(wire.PublishBootstrap).PairingID == r2.b.PairingID {
		t.Fatal("pairing ids are not random")
	}
	if wire.TokenDigest(r2.b.Token) != m2.(wire.PublishBootstrap).TokenSHA256 {
		t.Fatal("the published digest is not the returned token's")
	}
	if a := c.Status().Attempts; a != 1 {
		t.Fatalf("attempts = %d: a publish error ended the registration", a)
	}
}

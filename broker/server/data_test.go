package server

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// streamEnv is a host with one published route and helpers to open streams.
type streamEnv struct {
	*env
	host  *pipeConn
	token wire.Secret
	tok2  wire.Secret
}

func newStreamEnv(t *testing.T, mutate func(*Config)) *streamEnv {
	e := newEnv(t, func(c *Config) {
		c.MaxStreamsPerRoute = 16
		if mutate != nil {
			mutate(c)
		}
	})
	se := &streamEnv{env: e, host: e.host(0), token: wire.NewToken()}
	e.publishRoute(se.host, "r1", se.token)
	return se
}

func (se *streamEnv) open() (*pipeConn, wire.ID) {
	se.t.Helper()
	return se.client(se.host, 0, wire.KindRoute, se.token)
}

// The host may answer CLOSE (after some DATA) before the broker has written
// `matched`: the client still gets `matched` first, then the host's bytes,
// then 1000.
func TestMatchedPrecedesAnImmediateHostClose(t *testing.T) {
	se := newStreamEnv(t, nil)
	// Hold the client's session between matching and relaying (the broker
	// raises the read limit to a client frame there) until the stream ended.
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release) // runs before the broker's cleanup
	c, brokerEnd := newPipe(se.pipeN, "127.0.0.1:1")
	brokerEnd.OnSetReadLimit(func(n int64) {
		if n == wire.MaxClientFrame+1 {
			<-gate
		}
	})
	se.served.Add(1)
	go func() {
		defer se.served.Done()
		se.b.Serve(context.Background(), brokerEnd)
	}()
	se.register(c, wire.RoleClient, se.hosts[0].id, wire.KindRoute, se.token, wire.NewID())
	open, ok := readMsg(t, se.host).(wire.Open)
	if !ok {
		t.Fatal("host did not get open")
	}
	sendBinary(t, se.host, dataFrame(open.StreamID, []byte("bye")))
	sendBinary(t, se.host, closeFrame(open.StreamID))
	waitFor(t, "the host's CLOSE to end the stream", func() bool {
		return se.b.Stats().Counts["stream:host_close"] == 1
	})
	release()
	expectMsg(t, c, wire.Matched{StreamID: open.StreamID})
	if got := readBinary(t, c); string(got) != "bye" {
		t.Fatalf("client got %q", got)
	}
	if code, _ := expectClose(t, c); code != wire.CloseNormal {
		t.Fatalf("client closed %d, want 1000", code)
	}
}

func TestDataRelayBothWays(t *testing.T) {
	se := newStreamEnv(t, nil)
	c, id := se.open()
	sendBinary(t, c, []byte("client hello"))
	if got := readBinary(t, se.host); !bytes.Equal(got, dataFrame(id, []byte("client hello"))) {
		t.Fatalf("host got %x", got)
	}
	sendBinary(t, se.host, dataFrame(id, []byte("server hello")))
	if got := readBinary(t, c); string(got) != "server hello" {
		t.Fatalf("client got %q", got)
	}
	// An empty client message carries no bytes and is not forwarded.
	sendBinary(t, c, nil)
	sendBinary(t, c, []byte("x"))
	if got := readBinary(t, se.host); !bytes.Equal(got, dataFrame(id, []byte("x"))) {
		t.Fatalf("host got %x", got)
	}
	// The client closing sends CLOSE to the host.
	c.Close(1000, "")
	if got := readBinary(t, se.host); !bytes.Equal(got, closeFrame(id)) {
		t.Fatalf("host got %x", got)
	}
	waitFor(t, "no live stream", func() bool { return se.b.Stats().ActiveStreams == 0 })
}

func TestOneMiBClientMessageBecomesTwoHostFrames(t *testing.T) {
	se := newStreamEnv(t, nil)
	c, id := se.open()
	msg := bytes.Repeat([]byte{0xab}, wire.MaxClientFrame)
	for i := range msg {
		msg[i] = byte(i)
	}
	sendBinary(t, c, msg)
	var got []byte
	for _, want := range []int{wire.MaxHostFrameOut, wire.HeaderLen*2 + wire.MaxClientFrame - wire.MaxHostFrameOut} {
		f := readBinary(t, se.host)
		if len(f) != want || len(f) > wire.MaxHostFrameOut {
			t.Fatalf("frame of %d bytes, want %d", len(f), want)
		}
		fr, err := wire.ParseFrame(f)
		if err != nil || fr.Flags != wire.FlagData || fr.StreamID != id {
			t.Fatalf("frame %+v %v", fr, err)
		}
		got = append(got, fr.Payload...)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("payload differs")
	}
	// A full 1 MiB + 18 frame from the host is accepted and reaches the
	// client in pieces of ClientWriteChunk.
	sendBinary(t, se.host, dataFrame2(id, msg))
	var back []byte
	for len(back) < len(msg) {
		p := readBinary(t, c)
		if len(p) > se.cfg.ClientWriteChunk {
			t.Fatalf("client message of %d bytes", len(p))
		}
		back = append(back, p...)
	}
	if !bytes.Equal(back, msg) {
		t.Fatal("host→client payload differs")
	}
}

// dataFrame2 builds a frame above MaxHostFrameOut, which AppendFrame
// refuses to encode but a receiver must accept.
func dataFrame2(id wire.ID, payload []byte) []byte {
	f := append([]byte{wire.FrameVersion, wire.FlagData}, id[:]...)
	return append(f, payload...)
}

func TestClientProtocolErrors(t *testing.T) {
	t.Run("text after matched", func(t *testing.T) {
		se := newStreamEnv(t, nil)
		c, id := se.open()
		sendBinary(t, c, []byte("accepted"))
		sendText(t, c, `{"type":"hello"}`)
		if code := expectError(t, c); code != wire.CodeUnauthorized {
			t.Fatal(code)
		}
		// The data accepted before the violation is delivered, then CLOSE.
		if got := readBinary(t, se.host); !bytes.Equal(got, dataFrame(id, []byte("accepted"))) {
			t.Fatalf("host got %x", got)
		}
		if got := readBinary(t, se.host); !bytes.Equal(got, closeFrame(id)) {
			t.Fatalf("host got %x", got)
		}
		se.alive(se.host)
	})
	t.Run("frame before matched", func(t *testing.T) {
		se := newStreamEnv(t, nil)
		c := se.dial()
		sendBinary(t, c, []byte("early bytes"))
		if code := expectError(t, c); code != wire.CodeUnauthorized {
			t.Fatal(code)
		}
	})
	t.Run("1 MiB + 1 is 1009", func(t *testing.T) {
		se := newStreamEnv(t, nil)
		c, id := se.open()
		sendBinary(t, c, make([]byte, wire.MaxClientFrame+1))
		if code, _ := expectClose(t, c); code != wire.CloseTooBig {
			t.Fatalf("close %d", code)
		}
		if got := readBinary(t, se.host); !bytes.Equal(got, closeFrame(id)) {
			t.Fatalf("host got %x", got)
		}
	})
	t.Run("far over the limit is 1009", func(t *testing.T) {
		se := newStreamEnv(t, nil)
		c, id := se.open()
		sendBinary(t, c, make([]byte, 2*wire.MaxClientFrame))
		if code, _ := expectClose(t, c); code != wire.CloseTooBig {
			t.Fatalf("close %d", code)
		}
		if got := readBinary(t, se.host); !bytes.Equal(got, closeFrame(id)) {
			t.Fatalf("host got %x", got)
		}
	})
}

func TestHostFrameViolationsEndTheRegistration(t *testing.T) {
	cases := map[string]func(live, other wire.ID) []byte{
		"empty DATA":           func(id, _ wire.ID) []byte { return append([]byte{1, wire.FlagData}, id[:]...) },
		"CLOSE with payload":   func(id, _ wire.ID) []byte { return append(append([]byte{1, wire.FlagClose}, id[:]...), 0) },
		"version 2":            func(id, _ wire.ID) []byte { return append(append([]byte{2, wire.FlagData}, id[:]...), 'x') },
		"flags 6":              func(id, _ wire.ID) []byte { return append(append([]byte{1, 6}, id[:]...), 'x') },
		"WINDOW in plain v1":   func(id, _ wire.ID) []byte { return append(append([]byte{1, wire.FlagWindow}, id[:]...), 0, 0, 1, 0) },
		"short header":         func(id, _ wire.ID) []byte { return []byte{1, wire.FlagData, 1, 2} },
		"DATA never opened":    func(_, _ wire.ID) []byte { return dataFrame(wire.NewID(), []byte("x")) },
		"CLOSE never opened":   func(_, _ wire.ID) []byte { return closeFrame(wire.NewID()) },
		"DATA for other host":  func(_, other wire.ID) []byte { return dataFrame(other, []byte("x")) },
		"CLOSE for other host": func(_, other wire.ID) []byte { return closeFrame(other) },
	}
	for name, frame := range cases {
		t.Run(name, func(t *testing.T) {
			se := newStreamEnv(t, nil)
			c, id := se.open()
			// A second host with a live stream of its own.
			h1 := se.host1()
			tok := wire.NewToken()
			se.publishRoute(h1, "o", tok)
			oc, oid := se.client(h1, 1, wire.KindRoute, tok)

			sendBinary(t, se.host, frame(id, oid))
			if code := expectError(t, se.host); code != wire.CodeUnauthorized {
				t.Fatal(code)
			}
			if code, _ := expectClose(t, c); code != wire.CloseGoingAway {
				t.Fatalf("client closed %d", code)
			}
			// The other host and its stream are untouched.
			sendBinary(t, oc, []byte("fine"))
			if got := readBinary(t, h1); !bytes.Equal(got, dataFrame(oid, []byte("fine"))) {
				t.Fatalf("other host got %x", got)
			}
		})
	}
}

func (se *streamEnv) host1() *pipeConn { return se.env.host(1) }

func TestHostOversizeFrameIs1009(t *testing.T) {
	se := newStreamEnv(t, nil)
	c, id := se.open()
	sendBinary(t, se.host, dataFrame2(id, make([]byte, wire.MaxClientFrame+1)))
	if code, _ := expectClose(t, se.host); code != wire.CloseTooBig {
		t.Fatalf("host closed %d", code)
	}
	if code, _ := expectClose(t, c); code != wire.CloseGoingAway {
		t.Fatalf("client closed %d", code)
	}
}

func TestFramesForClosedStreamsAreDropped(t *testing.T) {
	se := newStreamEnv(t, nil)
	c, id := se.open()
	c.Close(1000, "")
	if got := readBinary(t, se.host); !bytes.Equal(got, closeFrame(id)) {
		t.Fatalf("host got %x", got)
	}
	// The host's DATA and CLOSE crossed the client's close: both dropped.
	sendBinary(t, se.host, dataFrame(id, []byte("late")))
	sendBinary(t, se.host, closeFrame(id))
	se.alive(se.host)
	if n := se.b.Stats().Counts["drop:closed_stream"]; n != 2 {
		t.Fatalf("dropped %d late frames", n)
	}
	// A closed id of the previous registration is not this one's.
	newer := se.env.host(0)
	expectClose(t, se.host)
	sendBinary(t, newer, closeFrame(id))
	if code := expectError(t, newer); code != wire.CodeUnauthorized {
		t.Fatal(code)
	}
}

func TestHostCloseDeliversQueuedDataThen1000(t *testing.T) {
	se := newStreamEnv(t, nil)
	c, id := se.open()
	sendBinary(t, se.host, dataFrame(id, []byte("one")))
	sendBinary(t, se.host, dataFrame(id, []byte("two")))
	sendBinary(t, se.host, closeFrame(id))
	// Message boundaries mean nothing on a client socket: the two may
	// arrive coalesced.
	if got, code := drainUntilClose(t, c); string(got) != "onetwo" || code != wire.CloseNormal {
		t.Fatalf("client got %q, then close %d", got, code)
	}
	// A CLOSE is never answered with a CLOSE.
	se.alive(se.host)
}

func TestHostGoingOfflineClosesClients1001(t *testing.T) {
	se := newStreamEnv(t, nil)
	c, id := se.open()
	sendBinary(t, se.host, dataFrame(id, []byte("last words")))
	se.host.Close(1000, "")
	if got := readBinary(t, c); string(got) != "last words" {
		t.Fatalf("client got %q", got)
	}
	if code, _ := expectClose(t, c); code != wire.CloseGoingAway {
		t.Fatalf("client closed %d", code)
	}
	if code := se.refused(0, wire.KindRoute, se.token, wire.NewID()); code != wire.CodeHostOffline {
		t.Fatal(code)
	}
}

func TestIdleStreamIsClosed(t *testing.T) {
	se := newStreamEnv(t, func(c *Config) { c.IdleTimeout = 500 * time.Millisecond })
	idle, idleID := se.open()
	busy, busyID := se.open()
	// busy moves a byte every 100 ms (from alternating sides) for 1.2 s.
	for i := 0; i < 12; i++ {
		time.Sleep(100 * time.Millisecond)
		if i%2 == 0 {
			sendBinary(t, busy, []byte("."))
			if got := readBinary(t, se.host); !bytes.Equal(got, dataFrame(busyID, []byte("."))) {
				// The idle stream's CLOSE may come first.
				if !bytes.Equal(got, closeFrame(idleID)) {
					t.Fatalf("host got %x", got)
				}
				readBinary(t, se.host)
			}
		} else {
			sendBinary(t, se.host, dataFrame(busyID, []byte(",")))
			readBinary(t, busy)
		}
	}
	if code, reason := expectClose(t, idle); code != wire.CloseTryAgain || reason != "idle" {
		t.Fatalf("idle client closed %d %q", code, reason)
	}
	if n := se.b.Stats().Counts["stream:idle"]; n != 1 {
		t.Fatalf("%d idle closes", n)
	}
	if se.b.Stats().ActiveStreams != 1 {
		t.Fatal("the busy stream was closed")
	}
}

// Idle means no payload bytes in either direction: a download with no
// client bytes is not idle, and answered pings do not keep a stream alive.
func TestIdleCountsPayloadNotPingsNorDirection(t *testing.T) {
	se := newStreamEnv(t, func(c *Config) {
		c.IdleTimeout = 500 * time.Millisecond
		c.PingInterval = 40 * time.Millisecond
		c.PongTimeout = 10 * time.Second // the host is not read in between
	})
	idle, _ := se.open()
	down, downID := se.open()
	// The idle client reads all along, so every ping to it is answered.
	idleEnd := make(chan *closeError, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), step)
		defer cancel()
		_, _, err := idle.Read(ctx)
		ce, _ := err.(*closeError)
		idleEnd <- ce
	}()
	for i := 0; i < 12; i++ { // 1.2 s of host → client bytes only
		time.Sleep(100 * time.Millisecond)
		sendBinary(t, se.host, dataFrame(downID, []byte("v")))
		if got := readBinary(t, down); string(got) != "v" {
			t.Fatalf("download got %q", got)
		}
	}
	select {
	case ce := <-idleEnd:
		if ce == nil || ce.Code != wire.CloseTryAgain || ce.Reason != "idle" {
			t.Fatalf("idle client ended with %+v, want 1013 idle", ce)
		}
	case <-time.After(step):
		t.Fatal("the pinged but idle stream was not closed")
	}
	if n := se.b.Stats().Counts["stream:idle"]; n != 1 {
		t.Fatalf("%d idle closes, want 1 (the download must stay open)", n)
	}
	if se.b.Stats().ActiveStreams != 1 {
		t.Fatal("the download-only stream was closed")
	}
}

func TestShutdownClosesEverything(t *testing.T) {
	se := newStreamEnv(t, nil)
	c, id := se.open()
	waiting := se.dial() // not registered yet
	se.b.Close()
	if got := readBinary(t, se.host); !bytes.Equal(got, closeFrame(id)) {
		t.Fatalf("host got %x", got)
	}
	if code, _ := expectClose(t, se.host); code != wire.CloseGoingAway {
		t.Fatalf("host closed %d", code)
	}
	if code, _ := expectClose(t, c); code != wire.CloseGoingAway {
		t.Fatalf("client closed %d", code)
	}
	if code, _ := expectClose(t, waiting); code != wire.CloseGoingAway {
		t.Fatalf("unregistered socket closed %d", code)
	}
	late := se.dial()
	if code, reason := expectClose(t, late); code != wire.CloseGoingAway || !strings.Contains(reason, "shutting") {
		t.Fatalf("socket after shutdown closed %d %q", code, reason)
	}
}

// Host DATA queued for a client leaves coalesced into messages of up to
// 256 KiB (the Android app drops a tunnel once 32 messages wait unread), and
// a small message still leaves at once, without waiting for more.
func TestClientBoundDataIsCoalesced(t *testing.T) {
	se := newStreamEnv(t, nil)
	se.pipeN = 4 // the client reads nothing: its socket holds 4 messages
	c, id := se.open()

	sendBinary(t, se.host, dataFrame(id, []byte("hi")))
	if got := readBinary(t, c); string(got) != "hi" {
		t.Fatalf("small message: %q", got)
	}

	const frames, size = 32, 16 << 10
	var want []byte
	for i := 0; i < frames; i++ {
		p := bytes.Repeat([]byte{byte(i)}, size)
		want = append(want, p...)
		sendBinary(t, se.host, dataFrame(id, p))
	}
	se.alive(se.host) // the host's frames before it are all queued now
	var got []byte
	messages := 0
	for len(got) < len(want) {
		m := readBinary(t, c)
		if len(m) > 256<<10 {
			t.Fatalf("a %d-byte client message", len(m))
		}
		got = append(got, m...)
		messages++
	}
	if !bytes.Equal(got, want) {
		t.Fatal("client bytes differ")
	}
	// At most the 4 the socket held and the one being written left
	// alone; the rest, 27+ frames queued meanwhile, in 256 KiB messages.
	if messages > 8 {
		t.Fatalf("%d frames of %d bytes reached the client in %d messages", frames, size, messages)
	}
}

package server

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// ownerPair is a real WebSocket on 127.0.0.1: the peer's end and this
// side's, adapted as the broker adapts its sockets.
func ownerPair(t *testing.T) (peer *websocket.Conn, local *msgconn.WebSocket) {
	t.Helper()
	got := make(chan *websocket.Conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		got <- c
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	peer, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.CloseNow() })
	c := <-got
	t.Cleanup(func() { c.CloseNow() })
	c.SetReadLimit(wire.MaxHostFrameIn)
	return peer, msgconn.FromWebSocket(c, "test")
}

// A client message is queued for the host in the buffer it was read into,
// the DATA header written in its headroom; a full 1 MiB one leaves only
// its last bytes to a second frame. A host's DATA payload is queued for
// the client where it was read. Nothing is copied on either path.
func TestDataIsQueuedWhereItWasRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	id := wire.NewID()

	client, cs := ownerPair(t)
	cs.SetReadHeadroom(wire.HeaderLen)
	msg := make([]byte, wire.MaxClientFrame)
	for i := range msg {
		msg[i] = byte(i % 251)
	}
	go client.Write(ctx, websocket.MessageBinary, msg)
	_, data, err := cs.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	frames := (&stream{conn: cs, id: id}).framesUp(data, nil)
	if len(frames) != 2 || len(frames[0]) != wire.MaxHostFrameOut {
		t.Fatalf("%d frames", len(frames))
	}
	if &frames[0][wire.HeaderLen] != &data[0] {
		t.Fatal("the first DATA frame is a copy, not the read buffer")
	}
	var got []byte
	for _, f := range frames {
		fr, err := wire.ParseFrame(f)
		if err != nil || fr.Flags != wire.FlagData || fr.StreamID != id {
			t.Fatalf("frame %+v: %v", fr, err)
		}
		got = append(got, fr.Payload...)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("the frames do not carry the message")
	}

	host, hs := ownerPair(t)
	// A full-size frame: at least half of any buffer the read pool keeps,
	// whatever earlier reads left in it.
	down := wire.SplitData(id, msg, wire.MaxHostFrameOut)[0]
	want := msg[:len(down)-wire.HeaderLen]
	go host.Write(ctx, websocket.MessageBinary, down)
	_, data, err = hs.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fr, err := wire.ParseFrame(data)
	if err != nil {
		t.Fatal(err)
	}
	p := (&hostSession{conn: hs}).keepPayload(fr.Payload)
	if &p[0] != &fr.Payload[0] || !bytes.Equal(p, want) {
		t.Fatal("the host's payload was copied or changed")
	}
	// The queue owns it: the socket's next read goes elsewhere.
	go host.Write(ctx, websocket.MessageBinary, bytes.Repeat([]byte{1}, len(down)))
	if _, _, err := hs.Read(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p, want) {
		t.Fatal("the next read overwrote a queued payload")
	}
}

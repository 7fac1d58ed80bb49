package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// pipeConn returns a matched Conn over an in-memory msgconn.Pipe and the
// broker's end of it, which the test plays.
func pipeConn(t *testing.T, mutate func(*Config)) (*Conn, *msgconn.PipeConn) {
	t.Helper()
	ours, broker := msgconn.Pipe(4)
	ours.SetLends(true) // the Conn must copy what it queues
	cfg := Config{PingInterval: time.Hour, PongTimeout: 2 * time.Hour}
	if mutate != nil {
		mutate(&cfg)
	}
	c := newConn(ours, wire.NewID(), nil, nil, cfg, zerolog.Nop())
	t.Cleanup(func() { c.Close() })
	return c, broker
}

func pipeCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestPipeConnBytesBothWays(t *testing.T) {
	c, broker := pipeConn(t, nil)
	ctx := pipeCtx(t)
	for _, m := range []string{"first", "second", "third"} {
		if err := broker.Write(ctx, msgconn.Binary, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := io.ReadAll(io.LimitReader(c, int64(len("firstsecondthird"))))
	if err != nil || string(got) != "firstsecondthird" {
		t.Fatalf("read %q, %v", got, err)
	}
	// A Write above the message size leaves as several binary messages,
	// none above writeQueueBytes (below the 1 MiB limit), in order.
	big := make([]byte, wire.MaxClientFrame+10)
	for i := range big {
		big[i] = byte(i % 251)
	}
	go c.Write(big)
	var got2 []byte
	for len(got2) < len(big) {
		typ, data, err := broker.Read(ctx)
		if err != nil || typ != msgconn.Binary || len(data) == 0 || len(data) > writeQueueBytes {
			t.Fatalf("broker got %v %d bytes, %v; want a binary message of 1..%d", typ, len(data), err, writeQueueBytes)
		}
		got2 = append(got2, data...)
	}
	if !bytes.Equal(got2, big) {
		t.Fatal("the broker got other bytes than were written")
	}
}

// TestPipeConnWritesCoalesce: bytes written while the socket is busy leave
// together (writes above directWriteBytes; a small one with nothing queued
// is sent at once by the caller). An inner TLS connection writes every record (at most 16 KiB)
// with its own Write; one message (and one write(2)) per record was most
// of the client's CPU per byte on an upload.
func TestPipeConnWritesCoalesce(t *testing.T) {
	c, broker := pipeConn(t, nil)
	ctx := pipeCtx(t)
	const writes, size = 64, 16 << 10 // an inner TLS record's plaintext
	var want []byte
	done := make(chan error, 1)
	go func() {
		// The broker does not read yet: the pipe takes a few messages,
		// then the socket is busy and the rest waits in the queue.
		for i := range writes {
			p := bytes.Repeat([]byte{byte(i)}, size)
			if _, err := c.Write(p); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := range writes {
		want = append(want, bytes.Repeat([]byte{byte(i)}, size)...)
	}
	time.Sleep(100 * time.Millisecond) // let the writes pile up (no timing is asserted)
	var got []byte
	msgs := 0
	for len(got) < len(want) {
		typ, data, err := broker.Read(ctx)
		if err != nil || typ != msgconn.Binary {
			t.Fatalf("broker got %v, %v after %d bytes", typ, err, len(got))
		}
		got = append(got, data...)
		msgs++
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes arrived changed or out of order")
	}
	if msgs > writes/4 {
		t.Fatalf("%d Writes of %d bytes left as %d messages; want them coalesced while the socket was busy", writes, size, msgs)
	}
}

// TestPipeConnCloseSendsQueued: Close sends what Write already accepted
// before the close 1000, even when the broker is slow to read.
func TestPipeConnCloseSendsQueued(t *testing.T) {
	c, broker := pipeConn(t, nil)
	ctx := pipeCtx(t)
	want := make([]byte, 3*writeQueueBytes/2)
	for i := range want {
		want[i] = byte(i % 253)
	}
	closed := make(chan error, 1)
	go func() {
		for p := want; len(p) > 0; p = p[min(len(p), 1000):] {
			if _, err := c.Write(p[:min(len(p), 1000)]); err != nil {
				closed <- err
				return
			}
		}
		closed <- c.Close()
	}()
	time.Sleep(50 * time.Millisecond) // the broker starts reading late (no timing is asserted)
	var got []byte
	for {
		typ, data, err := broker.Read(ctx)
		if err != nil {
			if msgconn.CloseStatus(err) != wire.CloseNormal {
				t.Fatalf("broker got %v after %d bytes", err, len(got))
			}
			break
		}
		if typ != msgconn.Binary {
			t.Fatalf("broker got a %v message", typ)
		}
		got = append(got, data...)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the broker got %d of %d bytes before the close, or other bytes", len(got), len(want))
	}
	if _, err := c.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
}

func TestPipeConnCloseCodes(t *testing.T) {
	t.Run("1000 is EOF", func(t *testing.T) {
		c, broker := pipeConn(t, nil)
		broker.Close(wire.CloseNormal, "")
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("error then close", func(t *testing.T) {
		c, broker := pipeConn(t, nil)
		msg, _ := wire.Marshal(wire.ErrorMsg{Code: wire.CodeRevoked})
		broker.Write(pipeCtx(t), msgconn.Text, msg)
		broker.Close(wire.ClosePolicy, "")
		var we *wire.Error
		if _, err := c.Read(make([]byte, 1)); !errors.As(err, &we) || we.Code != wire.CodeRevoked {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("1013", func(t *testing.T) {
		c, broker := pipeConn(t, nil)
		broker.Close(wire.CloseTryAgain, "")
		var ce *CloseError
		if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ce) || ce.Code != wire.CloseTryAgain {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("cut", func(t *testing.T) {
		c, broker := pipeConn(t, nil)
		broker.CloseNow()
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, ErrConnectionLost) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("our close is 1000", func(t *testing.T) {
		c, broker := pipeConn(t, nil)
		c.Close()
		if _, _, err := broker.Read(pipeCtx(t)); msgconn.CloseStatus(err) != wire.CloseNormal {
			t.Fatalf("broker got %v", err)
		}
	})
}

func TestPipeConnKeepalive(t *testing.T) {
	c, broker := pipeConn(t, func(cfg *Config) {
		cfg.PingInterval = 20 * time.Millisecond
		cfg.PongTimeout = 100 * time.Millisecond
	})
	// The broker reads (answering pings) for a while: the stream stays.
	ctx, stop := context.WithCancel(pipeCtx(t))
	go func() {
		for ctx.Err() == nil {
			broker.Read(ctx)
		}
	}()
	time.Sleep(300 * time.Millisecond)
	stop()
	if err := c.SetReadDeadline(time.Now().Add(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a stream with an answering broker ended: %v", err)
	}
	c.SetReadDeadline(time.Time{})
	// Now it stops answering: the stream is dropped as lost.
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("got %v", err)
	}
}

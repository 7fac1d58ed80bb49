package client

import (
	"bytes"
	"context"
	"errors"
	"io"
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
	big := bytes.Repeat([]byte{7}, wire.MaxClientFrame+10)
	go c.Write(big)
	for want := []int{wire.MaxClientFrame, 10}; len(want) > 0; want = want[1:] {
		typ, data, err := broker.Read(ctx)
		if err != nil || typ != msgconn.Binary || len(data) != want[0] {
			t.Fatalf("broker got %v %d bytes, %v; want %d", typ, len(data), err, want[0])
		}
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

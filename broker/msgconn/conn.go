// Package msgconn is the message socket all three Reach roles run on: the
// broker core (broker/server), the host connector (broker/connector) and
// the client (broker/client).
//
// Reach v1 gives a WebSocket message's type a meaning (text is JSON
// control, binary is data), so the transport is a message pipe, not a byte
// stream. Conn is that pipe; WebSocket adapts github.com/coder/websocket to
// it and Pipe is an in-memory pair for tests. Around it live the pieces
// every role needs once: the pause-forgiving Keepalive, the net.Conn
// Deadline emulation and the RoundRobin write scheduler.
package msgconn

import (
	"context"
	"errors"
	"fmt"
)

// MessageType is the type of one message. The values match
// github.com/coder/websocket's MessageText and MessageBinary.
type MessageType int

const (
	Text   MessageType = 1
	Binary MessageType = 2
)

func (t MessageType) String() string {
	switch t {
	case Text:
		return "text"
	case Binary:
		return "binary"
	}
	return "unknown"
}

// ErrTooBig is what Conn.Read returns (wrapped or not) for a message above
// the read limit. The transport has closed or is closing the socket with
// 1009.
var ErrTooBig = errors.New("reach: message exceeds the read limit")

// ErrWriteStalled is what a WriteGate's write on the WebSocket adapter
// returns (wrapped) when its write watch cut the socket: a fragment the
// peer did not take within the timeout, not any other failure.
var ErrWriteStalled = errors.New("reach: the peer took no bytes within the write timeout")

// CloseError is what Read returns once the peer closed the socket with a
// close frame: its status code and reason. A socket that broke without one
// returns some other error.
type CloseError struct {
	Code   int
	Reason string
}

func (e *CloseError) Error() string {
	return fmt.Sprintf("reach: socket closed with %d %q", e.Code, e.Reason)
}

// CloseStatus is the close code carried by err, or -1 when err is not a
// close by the peer.
func CloseStatus(err error) int {
	var ce *CloseError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return -1
}

// Conn is one message socket. Implementations allow Read, Write, Ping and
// Close from different goroutines, but callers never call Write
// concurrently with itself, nor Read.
type Conn interface {
	// Read returns the next data message. The slice is valid only until
	// the next Read (transports reuse one buffer): a caller copies what
	// it keeps. Control frames are handled inside (pongs complete a
	// pending Ping). An error means the socket is unusable: a *CloseError
	// when the peer closed it, ErrTooBig when the message exceeded the
	// read limit.
	Read(ctx context.Context) (MessageType, []byte, error)
	// Write sends one message. A transport may cut the socket when ctx
	// ends mid-write (a partial message cannot be resumed).
	Write(ctx context.Context, typ MessageType, data []byte) error
	// Ping sends a ping and waits for its pong until ctx ends; only ctx
	// decides when the pong is overdue. A pong is only seen while a Read
	// is in progress.
	Ping(ctx context.Context) error
	// Close sends a close frame with code and reason and releases the
	// socket; it may block for a bounded close handshake and unblocks
	// pending Read and Write calls. Later calls are no-ops.
	Close(code int, reason string) error
	// CloseNow releases the socket without a close frame (the peer sees
	// 1006).
	CloseNow() error
	// SetReadLimit bounds the size of the messages Read accepts.
	SetReadLimit(n int64)
	// RemoteAddr is the peer's address, for logs.
	RemoteAddr() string
}

// Batcher is a Conn that can gather the messages of a writer draining its
// queue into as few socket writes as possible: HoldWrites before the
// first, SendHeld once the queue is empty (or before the writer waits).
// SendHeld's write is bounded by ctx: when it ends first, the socket is
// cut. Only the single writer of a Conn calls them, in pairs.
type Batcher interface {
	HoldWrites()
	SendHeld(ctx context.Context) error
}

// Owner is a Conn whose reader can hand the buffer of the message its last
// Read returned over to the caller instead of lending it, so a relay can
// queue the bytes where they were read. Only the single reader calls them.
type Owner interface {
	// SetReadHeadroom keeps n free bytes in front of every later message
	// in its buffer.
	SetReadHeadroom(n int)
	// Take returns the last message's buffer, the headroom first, or nil
	// when it stays lent (see Reader.Take). A taken buffer goes back with
	// Recycle once nothing refers to it.
	Take() []byte
}

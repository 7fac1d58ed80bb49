package server

import (
	"context"
	"errors"
)

// MessageType is the type of one WebSocket message. Reach v1 gives the type
// meaning (text is JSON control, binary is data), so the broker's transport
// is a message pipe, not a byte stream. The values match
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

// ErrTooBig is what MessageConn.Read returns (wrapped or not) for a message
// above the read limit. The transport has closed or is closing the socket
// with 1009; the broker ends the session accordingly.
var ErrTooBig = errors.New("reach: message exceeds the read limit")

// MessageConn is one WebSocket as the broker core sees it. The HTTP handler
// adapts github.com/coder/websocket to it; tests use in-memory pipes. The
// core never calls Write concurrently with itself, but calls Read, Write,
// Ping and Close from different goroutines.
type MessageConn interface {
	// Read returns the next data message. The slice is valid only until
	// the next Read (transports reuse one buffer): the core copies what it
	// queues. Control frames are handled inside (pongs complete a pending
	// Ping). An error means the socket is unusable; ErrTooBig means the
	// message exceeded the read limit.
	Read(ctx context.Context) (MessageType, []byte, error)
	// Write sends one message. The broker bounds each call with a deadline
	// on ctx; a transport may cut the socket when ctx ends mid-write.
	Write(ctx context.Context, typ MessageType, data []byte) error
	// Ping sends a ping and waits for its pong until ctx ends. A pong is
	// only seen while a Read is in progress.
	Ping(ctx context.Context) error
	// Close sends a close frame with code and reason and releases the
	// socket; it may block for a bounded close handshake and unblocks
	// pending Read and Write calls. Later calls are no-ops.
	Close(code int, reason string) error
	// SetReadLimit bounds the size of the messages Read accepts.
	SetReadLimit(n int64)
	// RemoteAddr is the peer's address, for logs.
	RemoteAddr() string
}

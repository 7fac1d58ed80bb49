package msgconn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// fragment is the largest WebSocket frame the adapter writes; a larger
// message goes out as a fragmented message, so a ping can be sent between
// fragments of a 1 MiB frame to a slow peer.
const fragment = 64 << 10

// maxReadRetries bounds how often in a row Read resumes after the library
// gave up answering a ping (see Read).
const maxReadRetries = 16

// pingRetry is the pause between two ping attempts that each timed out
// waiting for the library's write lock.
const pingRetry = 10 * time.Millisecond

// WebSocket adapts a github.com/coder/websocket connection to Conn. It
// reads each message into a pooled buffer lent until the next Read (see
// Reader), maps the library's errors to ErrTooBig and *CloseError, and
// works around the library's fixed 5 s wait for its write lock when it
// writes a control frame (Ping and Read).
type WebSocket struct {
	c      *websocket.Conn
	rd     Reader
	sr     streamReader // the message NextReader returned
	remote string
	batch  *BatchConn // the socket's writes gather there (SetBatch); nil: every record is its own write
	// holdAbove is the largest message the library's write buffer sends
	// in one write; a larger one goes through batch.
	holdAbove int
	watch     writeWatch // the deadline of a WriteGate's write in progress

	// With Accept, the reader notes the pongs of our pings itself
	// (pongWatch), so a Keepalive's ping is only a write. With Accept and
	// Dial, it answers the peer's pings itself (answerPing): while a
	// message is being written, the pong is owed to its writer, which
	// sends it right after the message.
	pongs  *pongWatch
	pongMu sync.Mutex // writing, owing, owed
	// writing: write is sending a message (it holds the library's message
	// lock, which a pong written by the reader would wait for).
	writing bool
	owing   bool // a pong is owed to the writer
	// owed holds the latest such ping's payload, allocated on the first
	// owed pong: not an array, nor even a slice header, in every socket,
	// as an idle socket's memory is a goal of its own.
	owed *owedPong
}

// owedPong is a ping payload (at most 125 bytes, RFC 6455 §5.5).
type owedPong struct {
	b [125]byte
	n uint8
}

// pongWatch is the ping state of a WebSocket whose reader notes pongs: the
// sequence number of the last ping written and when a pong to one of ours
// last arrived. Its ping payload lives here so a ping allocates nothing.
type pongWatch struct {
	sent    atomic.Uint64 // the last ping's sequence number; 0: none yet
	pongAt  atomic.Int64  // monotonic nanoseconds since monoBase of the last pong; 0: none
	payload [8]byte       // the ping in progress (one at a time: Keepalive)
}

// monoBase anchors pongWatch's monotonic clock.
var monoBase = time.Now()

// opPing and opPong are RFC 6455's ping and pong opcodes (§5.5.2-3).
// The library's Write passes the message type to the frame as its opcode,
// so a ping written that way is a plain frame write: no wait for its pong,
// no context, no timer.
const (
	opPing = 0x9
	opPong = 0xA
)

var (
	_ Batcher     = (*WebSocket)(nil)
	_ Owner       = (*WebSocket)(nil)
	_ timedWriter = (*WebSocket)(nil)
	_ pongNoter   = (*WebSocket)(nil)
)

// FromWebSocket adapts c; remote is the peer's address for logs.
func FromWebSocket(c *websocket.Conn, remote string) *WebSocket {
	return &WebSocket{c: c, remote: remote, holdAbove: batchMin}
}

// Dial dials url like websocket.Dial (opts as there, nil: the defaults)
// and adapts the connection; remote is the peer's address for logs. Like
// Accept's, its reader answers the peer's pings itself (OnPingReceived,
// after opts' own, which may still refuse a ping; see answerPing), so the
// library's own pong, which gives up the socket's reader after 5 s behind
// a long frame write, is never used. A Keepalive waits for each of its
// pongs with Ping, as on FromWebSocket's. Call SetBatch, when the dial's
// transport put a BatchConn under the socket, before the first Read.
func Dial(ctx context.Context, url string, opts *websocket.DialOptions, remote string) (*WebSocket, *http.Response, error) {
	ws := &WebSocket{remote: remote, holdAbove: batchMin}
	var o websocket.DialOptions
	if opts != nil {
		o = *opts
	}
	o.OnPingReceived = ws.answerPing(o.OnPingReceived)
	c, resp, err := websocket.Dial(ctx, url, &o)
	if err != nil {
		return nil, resp, err
	}
	ws.c = c
	return ws, resp, nil
}

// Accept upgrades an HTTP request like websocket.Accept (opts as there,
// nil: the defaults) and adapts the connection; remote is the peer's
// address for logs. Its reader notes the pongs of the pings Keepalive
// sends (the library's OnPongReceived), so no goroutine waits for a pong:
// a ping is one frame write from the keepalive's timer. It also answers
// the peer's pings itself (OnPingReceived, after opts' own, which may
// still refuse a ping); see answerPing.
func Accept(w http.ResponseWriter, r *http.Request, opts *websocket.AcceptOptions, remote string) (*WebSocket, error) {
	ws := &WebSocket{remote: remote, holdAbove: batchMin, pongs: new(pongWatch)}
	var o websocket.AcceptOptions
	if opts != nil {
		o = *opts
	}
	if o.OnPongReceived != nil {
		return nil, errors.New("msgconn: Accept sets OnPongReceived itself")
	}
	o.OnPongReceived = ws.pongs.note
	o.OnPingReceived = ws.answerPing(o.OnPingReceived)
	c, err := websocket.Accept(w, r, &o)
	if err != nil {
		return nil, err
	}
	ws.c = c
	return ws, nil
}

// note is the reader's OnPongReceived: a pong carrying the number of one
// of our pings is noted with its time; any other (an unsolicited pong, a
// library ping's) is ignored.
func (p *pongWatch) note(_ context.Context, payload []byte) {
	if len(payload) != len(p.payload) {
		return
	}
	if n := binary.BigEndian.Uint64(payload); n != 0 && n <= p.sent.Load() {
		p.pongAt.Store(int64(time.Since(monoBase)))
	}
}

// answerPing is the reader's OnPingReceived: it answers the ping itself
// and always tells the library not to. The library's own pong waits at
// most 5 s for its frame lock and then ends the reader; a frame write that
// flushes a 256 KiB batch (BatchConn) holds that lock as long as the peer
// takes to read 256 KiB, over 5 s below ~51 KB/s: a slow but moving peer
// lost its socket. (It also cost a context with a timeout, its timer and
// a watch, ~650 bytes in ~10 objects for every ping answered.)
//
// While the writer sends a message (which holds the library's message
// lock until its last frame), the pong is owed to that writer, which
// writes it right after the message (writeMessage); only the latest
// ping's payload is kept, as RFC 6455 §5.5.3 allows. Otherwise it is one
// frame write under the context the library handed it; behind a batch
// the peer does not read it first waits for room (awaitRoom), and a ping
// whose 5 s pass there goes unanswered, leaving the socket as it is.
func (w *WebSocket) answerPing(also func(context.Context, []byte) bool) func(context.Context, []byte) bool {
	return func(ctx context.Context, payload []byte) bool {
		if also != nil && !also(ctx, payload) {
			return false
		}
		if w.owe(payload) {
			return false
		}
		if w.batch != nil && !w.batch.awaitRoom(ctx) {
			// The ping's 5 s went by behind a batch the peer does not
			// read: unanswered (a pong per ping must not grow the batch
			// without end).
			return false
		}
		w.pongMu.Lock()
		defer w.pongMu.Unlock()
		if w.oweLocked(payload) {
			return false
		}
		// No message can start until this write is done.
		w.c.Write(ctx, websocket.MessageType(opPong), payload)
		return false
	}
}

// owe hands the pong to payload to the message write in progress, if
// any, and reports whether it did.
func (w *WebSocket) owe(payload []byte) bool {
	w.pongMu.Lock()
	defer w.pongMu.Unlock()
	return w.oweLocked(payload)
}

// oweLocked is owe with pongMu held.
func (w *WebSocket) oweLocked(payload []byte) bool {
	if !w.writing {
		return false
	}
	if w.owed == nil {
		w.owed = new(owedPong)
	}
	w.owing, w.owed.n = true, uint8(copy(w.owed.b[:], payload))
	return true
}

// sendPing writes one ping frame and returns once it is written, without
// waiting for its pong (the reader notes it). Only Keepalive calls it,
// never twice at a time. The write is bounded by the socket, not by a
// context: Keepalive ends a socket whose pong is overdue, which cuts a
// ping stuck behind the peer's backpressure.
func (w *WebSocket) sendPing() error {
	n := w.pongs.sent.Add(1)
	binary.BigEndian.PutUint64(w.pongs.payload[:], n)
	return mapError(w.c.Write(context.Background(), websocket.MessageType(opPing), w.pongs.payload[:]))
}

// lastPong is when a pong to one of our pings last arrived (the zero time:
// none yet); ok is false when this socket's reader does not note pongs
// (FromWebSocket), so Keepalive waits for each pong with Ping instead.
func (w *WebSocket) lastPong() (at time.Time, ok bool) {
	if w.pongs == nil {
		return time.Time{}, false
	}
	if ns := w.pongs.pongAt.Load(); ns != 0 {
		return monoBase.Add(time.Duration(ns)), true
	}
	return time.Time{}, true
}

// SetBatch makes every message above 4 KiB leave through b in as few
// writes as possible (see BatchConn). b is the connection under this
// socket's TLS (the broker's accepted sockets) or above it, holding the one
// under it too (NewBatchConnAbove: the client's and the connector's, whose 4 KiB
// buffer flushes then gather into full TLS records). Call it before the
// first Write.
func (w *WebSocket) SetBatch(b *BatchConn) { w.batch = b }

// maxFrameHeader is the largest WebSocket frame header (RFC 6455 §5.2).
const maxFrameHeader = 14

// SetWriteBuffer says the library's write buffer (the *bufio.Writer its
// server Conn got at the hijack) holds n bytes, not the 4 KiB of
// net/http's: with SetBatch, every message that does not fit in it with
// its frame header leaves through the batch, in one write(2), as a
// message above 4 KiB does with the default buffer. Call it before the
// first Write.
func (w *WebSocket) SetWriteBuffer(n int) { w.holdAbove = min(batchMin, n-maxFrameHeader) }

// Read returns the next message, lent until the next Read or Release.
//
// The library answers a ping while reading and waits at most 5 s for the
// write lock; behind a data write blocked by the peer's backpressure that
// fails without harming the socket. Read then resumes: if the socket is
// really gone, the next read says so.
//
// ctx ending cuts the socket, as the library does; the library itself
// reads under a context that never ends, so it does not arm and drop a
// watch of ctx (an AfterFunc, a child in ctx's table) for every frame: an
// idle socket's reader sits in one Read while every ping and pong passes.
func (w *WebSocket) Read(ctx context.Context) (MessageType, []byte, error) {
	var typ websocket.MessageType
	var data []byte
	err := w.untilMessage(ctx, func() (err error) {
		typ, data, err = w.rd.Read(context.Background(), w.c)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	return MessageType(typ), data, nil
}

// untilMessage runs start, the library's wait for the next message, under
// Read's rules: ctx ending cuts the socket, and a wait the library gave up
// while it could not answer a ping is started again.
func (w *WebSocket) untilMessage(ctx context.Context, start func() error) error {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { w.c.CloseNow() })
		defer stop()
	}
	for retries := 0; ; retries++ {
		err := start()
		if err == nil {
			return nil
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil && retries < maxReadRetries {
			continue
		}
		return mapError(err)
	}
}

// Streamer is a Conn whose reader can take a message's bytes as they
// arrive instead of whole (a byte-stream relay queues them in pieces of
// its own size: no buffer sized after the message). Only the single
// reader calls it, instead of Read.
type Streamer interface {
	// NextReader waits for the next message and returns a reader of its
	// bytes, valid until the next NextReader; it must be read to io.EOF
	// before that. Its errors are Read's (ErrTooBig past the read limit,
	// *CloseError), and it resumes as Read does after the library gave
	// up answering a ping.
	NextReader(ctx context.Context) (MessageType, io.Reader, error)
}

var _ Streamer = (*WebSocket)(nil)

// NextReader waits for the next message and returns a reader of its bytes
// as they arrive (Streamer). ctx bounds the wait for the message's start
// only as Read's does. Like a Read, it ends the lend of the last message
// Read returned: its buffer goes back to the pool (a socket whose first
// message, the registration's answer, was read whole would otherwise keep
// that buffer for its life).
func (w *WebSocket) NextReader(ctx context.Context) (MessageType, io.Reader, error) {
	w.rd.Release()
	var typ websocket.MessageType
	err := w.untilMessage(ctx, func() error {
		var r io.Reader
		var err error
		typ, r, err = w.c.Reader(context.Background())
		w.sr = streamReader{r: r}
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	return MessageType(typ), &w.sr, nil
}

// streamReader is the reader NextReader returns: the library's, with
// Read's error mapping and retries.
type streamReader struct {
	r       io.Reader
	retries int
}

func (s *streamReader) Read(p []byte) (int, error) {
	for {
		n, err := s.r.Read(p)
		if err == nil || err == io.EOF {
			return n, err
		}
		// A ping the library could not answer within its 5 s leaves the
		// message where it was: go on reading it.
		if n == 0 && errors.Is(err, context.DeadlineExceeded) && s.retries < maxReadRetries {
			s.retries++
			continue
		}
		return n, mapError(err)
	}
}

// SetReadHeadroom keeps n free bytes in front of every later message in
// its buffer (Owner).
func (w *WebSocket) SetReadHeadroom(n int) { w.rd.SetHeadroom(n) }

// Take hands the last message's buffer over (Owner; see Reader.Take).
func (w *WebSocket) Take() []byte { return w.rd.Take() }

// Release returns the buffer of the last message to the pool once the
// caller's reader is done with the socket.
func (w *WebSocket) Release() { w.rd.Release() }

func mapError(err error) error {
	var ce websocket.CloseError
	switch {
	case errors.Is(err, websocket.ErrMessageTooBig):
		return fmt.Errorf("%w: %v", ErrTooBig, err)
	case errors.As(err, &ce):
		return &CloseError{Code: int(ce.Code), Reason: ce.Reason}
	}
	return err
}

func (w *WebSocket) Write(ctx context.Context, typ MessageType, data []byte) error {
	return w.write(ctx, typ, [][]byte{data}, nil)
}

// write sends parts, in order, as one message, fragmented above 64 KiB and
// at every part's end (a part is never copied to join another); after is
// called, when set, once each fragment has been written.
func (w *WebSocket) write(ctx context.Context, typ MessageType, parts [][]byte, after func()) error {
	if w.batch != nil && (len(parts) > 1 || len(parts[0]) > w.holdAbove) {
		w.batch.Hold()
		err := w.writeMessage(ctx, typ, parts, after)
		if rerr := w.sendHeld(ctx); err == nil {
			err = rerr
		}
		return err
	}
	return w.writeMessage(ctx, typ, parts, after)
}

// HoldWrites starts gathering this socket's writes (Batcher); without a
// BatchConn it does nothing.
func (w *WebSocket) HoldWrites() {
	if w.batch != nil {
		w.batch.Hold()
	}
}

// SendHeld ends a HoldWrites (Batcher).
func (w *WebSocket) SendHeld(ctx context.Context) error {
	if w.batch == nil {
		return nil
	}
	return w.sendHeld(ctx)
}

// sendHeld ends a Hold. The last batch leaves after the library's write
// returned, outside its watch of ctx, so ctx ending meanwhile cuts the
// socket here, as it would in the library: a peer that stops reading
// cannot hold the writer past its deadline.
func (w *WebSocket) sendHeld(ctx context.Context) error {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { w.c.CloseNow() })
		defer stop()
	}
	return w.batch.Release()
}

// writeWithin is a WriteGate's write of parts as one message: the library
// writes under a context that never ends, so it watches none; the
// socket's writeWatch cuts it once a fragment takes longer than timeout.
func (w *WebSocket) writeWithin(typ MessageType, parts [][]byte, timeout time.Duration, progress func()) error {
	w.watch.begin(timeout, w.c)
	after := progress
	if len(parts) > 1 || len(parts[0]) > fragment {
		// Each fragment gets its own timeout, with or without a progress
		// callback.
		after = func() {
			if progress != nil {
				progress()
			}
			w.watch.begin(timeout, w.c)
		}
	}
	err := w.write(context.Background(), typ, parts, after)
	w.watch.end()
	return w.watch.stalled(err)
}

// sendHeldWithin is a WriteGate's SendHeld.
func (w *WebSocket) sendHeldWithin(timeout time.Duration) error {
	if w.batch == nil {
		return nil
	}
	w.watch.begin(timeout, w.c)
	err := w.batch.Release()
	w.watch.end()
	return w.watch.stalled(err)
}

// writeMessage writes one message, then the pong a ping that arrived
// meanwhile is owed (answerPing).
func (w *WebSocket) writeMessage(ctx context.Context, typ MessageType, parts [][]byte, after func()) error {
	w.pongMu.Lock()
	w.writing = true
	w.pongMu.Unlock()
	err := w.writeFrames(ctx, typ, parts, after)
	w.pongMu.Lock()
	w.writing = false
	owed := w.owing
	var pong []byte // a copy: the reader may owe the next pong meanwhile
	if owed {
		pong = append([]byte(nil), w.owed.b[:w.owed.n]...)
		w.owing = false
	}
	w.pongMu.Unlock()
	if owed && err == nil {
		err = w.c.Write(ctx, websocket.MessageType(opPong), pong)
	}
	return err
}

// writeFrames writes one message: in one frame up to 64 KiB, else in
// fragments of at most 64 KiB and at every part's end.
func (w *WebSocket) writeFrames(ctx context.Context, typ MessageType, parts [][]byte, after func()) error {
	if len(parts) == 1 && len(parts[0]) <= fragment {
		err := w.c.Write(ctx, websocket.MessageType(typ), parts[0])
		if err == nil && after != nil {
			after()
		}
		return err
	}
	wr, err := w.c.Writer(ctx, websocket.MessageType(typ))
	if err != nil {
		return err
	}
	for _, data := range parts {
		for len(data) > 0 {
			n := min(len(data), fragment)
			if _, err := wr.Write(data[:n]); err != nil {
				return err
			}
			data = data[n:]
			if after != nil {
				after()
			}
		}
	}
	return wr.Close()
}

// Ping retries while the library's internal 5 s wait for the write lock
// times out behind a long data write (the peer's backpressure holds our
// ping back, not a dead peer); only ctx decides when the pong is overdue.
func (w *WebSocket) Ping(ctx context.Context) error {
	for {
		err := w.c.Ping(ctx)
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return mapError(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pingRetry):
		}
	}
}

func (w *WebSocket) Close(code int, reason string) error {
	return w.c.Close(websocket.StatusCode(code), reason)
}

func (w *WebSocket) CloseNow() error      { return w.c.CloseNow() }
func (w *WebSocket) SetReadLimit(n int64) { w.c.SetReadLimit(n) }
func (w *WebSocket) RemoteAddr() string   { return w.remote }

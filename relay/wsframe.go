package relay

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/deadline"
)

// The bridge frames both legs itself (RFC 6455), after handshakes it also
// does itself (handshake.go): until the Relay's first auth.ok a pump reads
// whole messages (nextMessage) so the bridge can see the auth exchange;
// after it, frames are forwarded as they arrive (forwardFrame), header and
// payload bytes unchanged, client→Relay frames still masked with the
// client's key and Relay→client frames unmasked. Both modes read frame
// headers with readHeader, which is where the protocol rules live (no
// extension bits, known opcodes, control frames short and unfragmented,
// masking by direction); control frames are answered or acted on by the
// bridge on the leg they arrived on, never forwarded; the per-message limit
// counts the declared lengths of a message's data frames across fragments,
// so a message over it is refused before any byte past the limit is read.

// Opcodes.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xA
)

// maxHeaderBytes is the longest frame header: 2 + 8 (64-bit length) + 4 (mask).
const maxHeaderBytes = 14

// frameHeader is one parsed frame header; raw holds its bytes as read.
type frameHeader struct {
	fin    bool
	op     byte
	masked bool
	key    [4]byte
	length int64
	raw    [maxHeaderBytes]byte
	rawLen int
}

// errProtocol is a peer breaking RFC 6455; the leg is closed with 1002.
type errProtocol struct{ why string }

func (e errProtocol) Error() string { return "websocket protocol error: " + e.why }

var (
	errTooBig     = errors.New("relay: message too big")
	errLegClosing = errors.New("relay: leg is closing")
)

// leg is one side of the bridge after its handshake: the connection, the
// reader its pump reads frames from, and the write lock every frame written
// to it holds (a frame is never interleaved with another, control frames
// included).
type leg struct {
	conn net.Conn
	br   *bufio.Reader
	// fromClient: the peer is the client, whose frames must be masked;
	// frames to it are not. The Relay leg is the other way round.
	fromClient bool
	name       string
	wt         time.Duration // bound of each write (Options.WriteTimeout)

	wmu       sync.Mutex
	wdl       deadline.Lazy // under wmu: the write deadline set on conn for wt
	closeSent bool          // under wmu
	broken    bool          // under wmu: a write failed, nothing more may be written

	skip int64 // reader only: payload bytes left unread by errTooBig

	peerDone     chan struct{} // closed when the peer's close frame arrived or reading ended
	peerDoneOnce sync.Once
	lastPong     atomic.Int64 // UnixNano of the last pong (or the session's start)
}

func newLeg(conn net.Conn, br *bufio.Reader, fromClient bool, name string, wt time.Duration) *leg {
	l := &leg{conn: conn, br: br, fromClient: fromClient, name: name, wt: wt, peerDone: make(chan struct{})}
	l.lastPong.Store(time.Now().UnixNano())
	return l
}

func (l *leg) markPeerDone() { l.peerDoneOnce.Do(func() { close(l.peerDone) }) }

// readHeader reads and checks one frame header. The header is parsed in
// place in the leg's read buffer (parseHeader) and consumed only once it is
// whole and valid.
func (l *leg) readHeader() (frameHeader, error) {
	if _, err := l.br.Peek(2); err != nil {
		return frameHeader{}, err
	}
	// Usually the whole header is buffered already: one parse.
	b, _ := l.br.Peek(l.br.Buffered())
	h, need, err := parseHeader(b, l.fromClient)
	if err == nil && need > 0 {
		if b, err = l.br.Peek(need); err != nil {
			return h, err
		}
		h, _, err = parseHeader(b, l.fromClient)
	}
	if err != nil {
		return h, err
	}
	_, _ = l.br.Discard(h.rawLen)
	return h, nil
}

// parseHeader parses and checks the frame header at the start of b, the
// bytes of a leg whose peer is a client when fromClient. When b holds only
// part of the header (at least its first two bytes), need is the header's
// whole length and h is not yet usable; errors come as soon as the bytes in
// b show one. It is the one parser of frame headers: readHeader uses it on
// the leg's read buffer, and the frame forwarder on frames it finds whole
// in that buffer.
func parseHeader(b []byte, fromClient bool) (h frameHeader, need int, err error) {
	if len(b) < 2 {
		return h, 2, nil
	}
	b0, b1 := b[0], b[1]
	h.fin, h.op, h.masked = b0&0x80 != 0, b0&0x0F, b1&0x80 != 0
	if b0&0x70 != 0 {
		return h, 0, errProtocol{"reserved bits set (no extension was negotiated)"}
	}
	switch h.op {
	case opContinuation, opText, opBinary, opClose, opPing, opPong:
	default:
		return h, 0, errProtocol{fmt.Sprintf("unknown opcode %#x", h.op)}
	}
	if h.masked != fromClient {
		if fromClient {
			return h, 0, errProtocol{"client frame not masked"}
		}
		return h, 0, errProtocol{"server frame masked"}
	}
	length := b1 & 0x7F
	n := 2
	switch length {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h.masked {
		n += 4
	}
	if len(b) < n {
		return h, n, nil
	}
	switch length {
	case 126:
		h.length = int64(binary.BigEndian.Uint16(b[2:]))
	case 127:
		v := binary.BigEndian.Uint64(b[2:])
		if v > 1<<63-1 {
			return h, 0, errProtocol{"frame length has its top bit set"}
		}
		h.length = int64(v)
	default:
		h.length = int64(length)
	}
	if h.op >= opClose && (!h.fin || h.length > 125) {
		return h, 0, errProtocol{"control frame fragmented or longer than 125 bytes"}
	}
	if h.masked {
		copy(h.key[:], b[n-4:n])
	}
	h.rawLen = copy(h.raw[:], b[:n])
	return h, 0, nil
}

// mask XORs p with key, starting at key offset pos; it returns the next offset.
func mask(p []byte, key [4]byte, pos int) int {
	k := binary.LittleEndian.Uint32(key[:])
	if pos&3 != 0 {
		k = k>>(8*uint(pos&3)) | k<<(32-8*uint(pos&3))
	}
	i := 0
	for ; i+8 <= len(p); i += 8 {
		k64 := uint64(k) | uint64(k)<<32
		binary.LittleEndian.PutUint64(p[i:], binary.LittleEndian.Uint64(p[i:])^k64)
	}
	for ; i < len(p); i++ {
		p[i] ^= byte(k)
		k = k>>8 | k<<24
	}
	return (pos + len(p)) & 3
}

// appendHeader appends a frame header for a frame the bridge writes itself
// (unfragmented); to the Relay leg it is masked with a fresh key, returned.
func (l *leg) appendHeader(b []byte, op byte, n int) ([]byte, [4]byte) {
	var key [4]byte
	b = append(b, 0x80|op)
	mbit := byte(0)
	if !l.fromClient {
		mbit = 0x80
	}
	switch {
	case n < 126:
		b = append(b, mbit|byte(n))
	case n < 1<<16:
		b = append(b, mbit|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, mbit|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if mbit != 0 {
		// RFC 6455 wants an unpredictable masking key; crypto/rand costs
		// nothing here (only frames the bridge writes itself: messages
		// before the first auth.ok and control frames).
		rand.Read(key[:])
		b = append(b, key[:]...)
	}
	return b, key
}

// Frame buffers come from a pool and are held only while a frame is read or
// written, so an idle connection holds none. chunkBytes is one TLS record's
// payload: a frame up to it goes out as one write and one record.
const chunkBytes = 16 << 10

var chunkPool = sync.Pool{New: func() any {
	b := make([]byte, chunkBytes)
	return &b
}}

// lockWrite takes the write lock unless the leg is closing or broken.
func (l *leg) lockWrite() error {
	l.wmu.Lock()
	if l.closeSent || l.broken {
		l.wmu.Unlock()
		return errLegClosing
	}
	return nil
}

// writeLocked writes p under the held write lock within timeout; a failure
// marks the leg broken and closes its connection, so its own reader
// notices. For the leg's own bound (wt) the deadline is kept lazily
// (internal/deadline): each write still has at least wt and at most wt
// plus the slack, and a busy leg re-arms its deadline timer about once per
// slack instead of per frame.
func (l *leg) writeLocked(p []byte, timeout time.Duration) error {
	if timeout != l.wt {
		l.wdl.Forget()
		_ = l.conn.SetWriteDeadline(time.Now().Add(timeout))
	} else if t, ok := l.wdl.Next(timeout, time.Time{}); ok {
		_ = l.conn.SetWriteDeadline(t)
	}
	if _, err := l.conn.Write(p); err != nil {
		l.broken = true
		_ = l.conn.Close()
		return err
	}
	return nil
}

// writeFrame writes one unfragmented frame the bridge composed (a message
// in message mode, a pong, a ping, a close).
func (l *leg) writeFrame(op byte, payload []byte, timeout time.Duration) error {
	if err := l.lockWrite(); err != nil {
		return err
	}
	defer l.wmu.Unlock()
	if op == opClose {
		l.closeSent = true
	}
	return l.composeLocked(op, payload, timeout)
}

func (l *leg) composeLocked(op byte, payload []byte, timeout time.Duration) error {
	bp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bp)
	buf := *bp
	hdr, key := l.appendHeader(buf[:0], op, len(payload))
	start, pos := len(hdr), 0
	for {
		// The header and the first chunk of payload go out together; a
		// payload larger than the buffer follows chunk by chunk.
		n := copy(buf[start:], payload)
		if !l.fromClient {
			pos = mask(buf[start:start+n], key, pos)
		}
		payload = payload[n:]
		if err := l.writeLocked(buf[:start+n], timeout); err != nil {
			return err
		}
		if len(payload) == 0 {
			return nil
		}
		start = 0
	}
}

// closePayload is the payload of a close frame for spec: empty for 1005.
func closePayload(spec closeSpec) []byte {
	if spec.code == websocket.StatusNoStatusRcvd {
		return nil
	}
	reason := spec.reason
	if len(reason) > 123 {
		reason = truncateUTF8(reason, 123)
	}
	p := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(reason)), uint16(spec.code))
	return append(p, reason...)
}

func truncateUTF8(s string, n int) string {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// parseClose reads a close frame's payload as the peer's close: nil payload
// is a close without status; a payload of one byte, or a code that may not
// be sent, is a protocol error.
func parseClose(p []byte) (websocket.CloseError, error) {
	switch {
	case len(p) == 0:
		return websocket.CloseError{Code: websocket.StatusNoStatusRcvd}, nil
	case len(p) == 1:
		return websocket.CloseError{}, errProtocol{"close payload of one byte"}
	}
	code := websocket.StatusCode(binary.BigEndian.Uint16(p))
	if !sendable(code) {
		return websocket.CloseError{}, errProtocol{fmt.Sprintf("invalid close code %d", code)}
	}
	return websocket.CloseError{Code: code, Reason: string(p[2:])}, nil
}

// readControl reads a control frame's payload (at most 125 bytes), unmasked.
func (l *leg) readControl(h frameHeader) ([]byte, error) {
	var b [125]byte
	p := b[:h.length]
	if _, err := io.ReadFull(l.br, p); err != nil {
		return nil, err
	}
	if h.masked {
		mask(p, h.key, 0)
	}
	return append([]byte(nil), p...), nil
}

// msgState is where a pump is in the message stream it reads: inside a
// fragmented message or not, and how many payload bytes the message's
// frames have declared so far.
type msgState struct {
	inMsg bool
	typ   byte  // the message's opcode (text or binary)
	n     int64 // declared payload bytes of the message so far
}

// nextDataFrame reads frames until the next data frame and returns its
// header, its payload still unread. Control frames on the way are handled
// on this leg (handleControl). It enforces the message rules: a
// continuation only inside a message, a new message only outside one, and
// at most limit payload bytes per message counted over the declared lengths
// of its frames (errTooBig before the frame that would pass it is read).
func (l *leg) nextDataFrame(st *msgState, limit int64) (frameHeader, error) {
	for {
		h, err := l.readHeader()
		if err != nil {
			return h, err
		}
		if h.op >= opClose {
			if err := l.handleControl(h); err != nil {
				return h, err
			}
			continue
		}
		if err := st.check(h, limit); err != nil {
			if errors.Is(err, errTooBig) {
				l.skip = h.length
			}
			return h, err
		}
		st.take(h)
		return h, nil
	}
}

// check applies the message rules to the data frame h, next in the stream,
// without taking it: a continuation only inside a message, a new message
// only outside one, and at most limit payload bytes per message counted
// over the declared lengths of its frames (errTooBig).
func (st *msgState) check(h frameHeader, limit int64) error {
	n := st.n
	if h.op == opContinuation {
		if !st.inMsg {
			return errProtocol{"continuation frame outside a message"}
		}
	} else {
		if st.inMsg {
			return errProtocol{"new message inside a fragmented message"}
		}
		n = 0
	}
	if h.length > limit-n {
		return errTooBig
	}
	return nil
}

// take moves st past the data frame h, which check accepted.
func (st *msgState) take(h frameHeader) {
	if h.op != opContinuation {
		st.inMsg, st.typ, st.n = true, h.op, 0
	}
	st.n += h.length
	if h.fin {
		st.inMsg = false
	}
}

// handleControl acts on one control frame read on this leg: a ping is
// answered with a pong on the same leg, a pong is the peer's sign of life,
// a close is returned as the peer's websocket.CloseError (or a protocol
// error for a malformed one). Control frames never cross the bridge.
func (l *leg) handleControl(h frameHeader) error {
	p, err := l.readControl(h)
	if err != nil {
		return err
	}
	switch h.op {
	case opPing:
		// A leg already closing or broken answers no more pings; its
		// reader learns how it ended on its next read.
		_ = l.writeFrame(opPong, p, l.wt)
	case opPong:
		l.lastPong.Store(time.Now().UnixNano())
	case opClose:
		ce, err := parseClose(p)
		l.markPeerDone()
		if err != nil {
			return err
		}
		return ce
	}
	return nil
}

// nextMessage reads the leg's next message whole: its opcode (text or
// binary) and its unmasked payload in a buffer from msgBufs, at most limit
// bytes however its frames declared their lengths.
func (l *leg) nextMessage(limit int64) (byte, *[]byte, error) {
	var st msgState
	var bp *[]byte
	for {
		h, err := l.nextDataFrame(&st, limit)
		if err == nil {
			bp, err = l.appendPayload(bp, h, limit)
		}
		if err != nil {
			if bp != nil {
				putMsgBuf(bp)
			}
			return 0, nil, err
		}
		if !st.inMsg {
			return st.typ, bp, nil
		}
	}
}

// appendPayload reads the payload of the data frame h (just read) onto the
// message in *bp, unmasked; a nil bp takes a buffer from msgBufs, so an idle
// connection holds none. The buffer grows as the bytes arrive (doubling,
// never past limit), not to the declared length: a header alone must not
// cost 4 MiB.
func (l *leg) appendPayload(bp *[]byte, h frameHeader, limit int64) (*[]byte, error) {
	if bp == nil {
		bp = msgBufs.Get().(*[]byte)
		*bp = (*bp)[:0]
	}
	data, left, pos := *bp, h.length, 0
	for left > 0 {
		if len(data) == cap(data) {
			nb := make([]byte, len(data), min(max(2*cap(data), 512), int(limit)))
			copy(nb, data)
			data = nb
		}
		take := int(min(left, int64(cap(data)-len(data))))
		start := len(data)
		data = data[:start+take]
		*bp = data
		if _, err := io.ReadFull(l.br, data[start:]); err != nil {
			return bp, err
		}
		if h.masked {
			pos = mask(data[start:], h.key, pos)
		}
		left -= int64(take)
	}
	*bp = data
	return bp, nil
}

// frameCount counts the messages a pump completed and their declared bytes.
type frameCount struct {
	msgs  int64
	bytes int64
}

// frameDone counts the message st just finished, if the last frame ended it.
func (c *frameCount) frameDone(st *msgState) {
	if !st.inMsg {
		c.msgs++
		c.bytes += st.n
	}
}

// forwardFrames copies the data frame whose header src has just read (h,
// already through st) to dst as it came: the header bytes and the payload
// unchanged (masked from a client, unmasked from the Relay), chunk by chunk,
// the first chunk carrying the header. The data frames after it that src's
// read buffer already holds whole go out in the same write when the message
// rules accept them (appendBuffered): a burst of small frames is one write,
// one TLS record toward the client. A dst that is closing or broken gets
// nothing: the payload is read and dropped, so src's reader reaches its
// close frame. It returns an error only for a failed read of src; c counts
// the messages the forwarded frames completed.
func forwardFrames(src, dst *leg, h frameHeader, st *msgState, limit int64, c *frameCount) error {
	if err := dst.lockWrite(); err != nil {
		_, err := io.CopyN(io.Discard, src.br, h.length)
		c.frameDone(st)
		return err
	}
	defer dst.wmu.Unlock()
	bp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bp)
	buf := *bp
	n := copy(buf, h.raw[:h.rawLen])
	left := h.length
	written := false
	for {
		take := int(min(left, int64(len(buf)-n)))
		if _, err := io.ReadFull(src.br, buf[n:n+take]); err != nil {
			if written {
				// dst has part of a frame: nothing more may follow on it.
				dst.broken = true
				_ = dst.conn.Close()
			}
			return err
		}
		left -= int64(take)
		n += take
		if left == 0 {
			c.frameDone(st)
			n = src.appendBuffered(buf, n, st, limit, c)
		}
		if dst.writeLocked(buf[:n], dst.wt) != nil {
			_, err := io.CopyN(io.Discard, src.br, left)
			return err
		}
		written = true
		if left == 0 {
			return nil
		}
		n = 0
	}
}

// appendBuffered moves the data frames at the head of the leg's read buffer
// that are there whole (header and payload) onto buf[:n], as long as they
// fit and st's message rules accept them, and returns the new length. It
// never reads: it stops at the first frame not buffered whole, a control
// frame (the pump's next nextDataFrame handles it, after this write) or a
// frame the rules refuse (nextDataFrame reports it the same way).
func (l *leg) appendBuffered(buf []byte, n int, st *msgState, limit int64, c *frameCount) int {
	for {
		p, _ := l.br.Peek(l.br.Buffered())
		h, need, err := parseHeader(p, l.fromClient)
		if err != nil || need > 0 || h.op >= opClose || st.check(h, limit) != nil {
			return n
		}
		size := int64(h.rawLen) + h.length
		if size > int64(len(p)) || size > int64(len(buf)-n) {
			return n
		}
		n += copy(buf[n:], p[:size])
		_, _ = l.br.Discard(int(size))
		st.take(h)
		c.frameDone(st)
	}
}

// closeWait bounds the close handshake on one leg: writing the close frame,
// then waiting for the peer's, as coder/websocket bounds it (5 s each).
const closeWait = 5 * time.Second

// shutdown ends the leg: its close frame (unless the leg is broken or one
// was sent), the peer's close frame (or the end of its stream) awaited for
// closeWait, then the connection closed. The leg's reader keeps reading
// meanwhile; that is where the peer's close arrives.
func (l *leg) shutdown(spec closeSpec) {
	guard := time.AfterFunc(2*closeWait, func() { _ = l.conn.Close() })
	defer guard.Stop()
	if l.writeFrame(opClose, closePayload(spec), closeWait) == nil {
		t := time.NewTimer(closeWait)
		select {
		case <-l.peerDone:
		case <-t.C:
		}
		t.Stop()
	}
	_ = l.conn.Close()
}

// drop closes the connection without a close frame: the peer vanished.
func (l *leg) drop() {
	_ = l.conn.Close()
}

// drain reads and drops what the peer still sends after the session began
// ending over a message too big: the rest of that frame, then frames
// (control frames still handled, so its close frame is seen) until its
// stream ends. Closing at once would reset a connection with unread bytes
// and could lose the close frame on its way to the peer; shutdown's bound
// (it closes the connection) ends the drain at the latest.
func (l *leg) drain() {
	if _, err := io.CopyN(io.Discard, l.br, l.skip); err != nil {
		return
	}
	for {
		var st msgState
		h, err := l.nextDataFrame(&st, math.MaxInt64)
		if err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, l.br, h.length); err != nil {
			return
		}
	}
}

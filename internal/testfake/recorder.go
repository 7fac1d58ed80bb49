package testfake

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"sync"
)

// DefaultRecorderMax bounds what a Recorder keeps per direction.
const DefaultRecorderMax = 64 << 20

// Recorder keeps a copy of every byte that crosses the outer connection to
// the broker, as the broker sees it after its TLS: the HTTP upgrade and the
// WebSocket frames. Tests use it (Config.WrapOuter = rec.Wrap) to prove that
// nothing the broker must not learn — pairing codes, session tokens, API
// bearers, cookies, request paths — travels outside the inner TLS.
type Recorder struct {
	// Max bounds the bytes kept per direction; 0 means DefaultRecorderMax.
	// Bytes beyond it are not kept and Truncated reports it.
	Max int

	mu        sync.Mutex
	sent      []byte
	received  []byte
	truncated bool
}

// Wrap returns c recording into r.
func (r *Recorder) Wrap(c net.Conn) net.Conn { return &recordingConn{Conn: c, r: r} }

// Sent and Received are copies of the raw bytes so far.
func (r *Recorder) Sent() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.sent)
}

func (r *Recorder) Received() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.received)
}

// Truncated reports whether bytes were dropped because of Max.
func (r *Recorder) Truncated() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.truncated
}

// BrokerView is what the broker can read in each direction: the HTTP head
// followed by the payloads of all WebSocket frames, unmasked and
// concatenated, so a string split across frames is still found. The
// client's frames are masked on the wire, so searching the raw bytes would
// prove nothing. An error means a direction ends inside a frame (Max, or
// the capture was taken while a frame was in flight); the views hold what
// could be decoded.
func (r *Recorder) BrokerView() (sent, received []byte, err error) {
	s, rc := r.Sent(), r.Received()
	sent, err1 := wsPlaintext(s)
	received, err2 := wsPlaintext(rc)
	return sent, received, errors.Join(err1, err2)
}

// Contains reports whether needle occurs in the raw bytes or the broker's
// view of either direction.
func (r *Recorder) Contains(needle []byte) (bool, error) {
	sent, received, err := r.BrokerView()
	for _, b := range [][]byte{r.Sent(), r.Received(), sent, received} {
		if bytes.Contains(b, needle) {
			return true, err
		}
	}
	return false, err
}

func (r *Recorder) record(dst *[]byte, p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	limit := r.Max
	if limit <= 0 {
		limit = DefaultRecorderMax
	}
	room := limit - len(*dst)
	if room < len(p) {
		r.truncated = true
		p = p[:max(room, 0)]
	}
	*dst = append(*dst, p...)
}

// recordingConn records each direction in the order it crossed the
// connection: a write is recorded before the next write starts (and a read
// before the next read), since two goroutines can write one after the
// other — net/http's writeLoop the upgrade head, the caller the first frame
// once the 101 arrived — and recording after an unguarded Write let the
// later one land first in the capture.
type recordingConn struct {
	net.Conn
	r        *Recorder
	rmu, wmu sync.Mutex
}

func (c *recordingConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	n, err := c.Conn.Read(p)
	c.r.record(&c.r.received, p[:n])
	return n, err
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n, err := c.Conn.Write(p)
	c.r.record(&c.r.sent, p[:n])
	return n, err
}

var errPartialFrame = errors.New("capture ends inside a WebSocket frame")

// wsPlaintext decodes one direction of a captured WebSocket connection into
// the HTTP head plus the unmasked payloads of every frame (data and control).
func wsPlaintext(b []byte) ([]byte, error) {
	i := bytes.Index(b, []byte("\r\n\r\n"))
	if i < 0 {
		return bytes.Clone(b), nil // the upgrade is all there is
	}
	out := bytes.Clone(b[:i+4])
	b = b[i+4:]
	for len(b) > 0 {
		if len(b) < 2 {
			return out, errPartialFrame
		}
		masked := b[1]&0x80 != 0
		n := uint64(b[1] & 0x7f)
		h := 2
		switch n {
		case 126:
			if len(b) < 4 {
				return out, errPartialFrame
			}
			n, h = uint64(binary.BigEndian.Uint16(b[2:4])), 4
		case 127:
			if len(b) < 10 {
				return out, errPartialFrame
			}
			n, h = binary.BigEndian.Uint64(b[2:10]), 10
		}
		var key [4]byte
		if masked {
			if len(b) < h+4 {
				return out, errPartialFrame
			}
			copy(key[:], b[h:h+4])
			h += 4
		}
		b = b[h:]
		partial := uint64(len(b)) < n
		if partial {
			n = uint64(len(b))
		}
		start := len(out)
		out = append(out, b[:n]...)
		if masked {
			for j := range out[start:] {
				out[start+j] ^= key[j%4]
			}
		}
		if partial {
			return out, errPartialFrame
		}
		b = b[n:]
	}
	return out, nil
}

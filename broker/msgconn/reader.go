// Pooled reads.
//
// github.com/coder/websocket's Conn.Read allocates a fresh slice for every
// message and grows it from 512 bytes by repeated appends, so a 1 MiB frame
// costs a dozen allocations and several times its size in copying; on the
// broker's data path that was the largest CPU cost. Every Reach reader
// parses a message and then either copies the little it keeps (a frame's
// payload into a queue, a JSON field into a string) or drops it, so one
// buffer per reader, lent until its next read, is enough.

package msgconn

import (
	"context"
	"io"
	"sync"

	"github.com/coder/websocket"
)

// initialSize fits every control message and a typical data chunk; larger
// messages grow the buffer, which keeps its size in the pool.
const initialSize = 32 << 10

var pool = sync.Pool{New: func() any {
	b := make([]byte, 0, initialSize)
	return &b
}}

// Reader reads whole WebSocket messages into pooled, reused buffers, for
// one connection, from one goroutine at a time.
// The zero value is ready to use.
type Reader struct {
	held *[]byte
}

// Read waits for the next message and reads all of it. The returned slice
// is lent: it is valid until the next Read or Release, and a caller copies
// whatever it keeps longer. Waiting for a message holds no buffer, so idle
// connections cost nothing. The connection's read limit still applies: a
// larger message fails with an error wrapping websocket.ErrMessageTooBig.
func (r *Reader) Read(ctx context.Context, c *websocket.Conn) (websocket.MessageType, []byte, error) {
	r.Release()
	typ, rd, err := c.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	bp := pool.Get().(*[]byte)
	buf, err := readAll(rd, (*bp)[:0])
	*bp = buf[:0]
	if err != nil {
		pool.Put(bp)
		return 0, nil, err
	}
	r.held = bp
	return typ, buf, nil
}

// Release returns the buffer of the last message to the pool. The slice the
// last Read returned must not be used afterwards.
func (r *Reader) Release() {
	if r.held != nil {
		pool.Put(r.held)
		r.held = nil
	}
}

// readAll is io.ReadAll into buf, growing it only when full.
func readAll(rd io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

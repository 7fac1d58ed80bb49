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

// maxPooled is the largest buffer kept: a full client message (1 MiB)
// with its headroom, after readAll's growth.
const maxPooled = 2 << 20

// The pool is split by capacity, one class per power of two from
// initialSize (class i holds capacities in [initialSize<<i,
// initialSize<<(i+1))), so a connection moving 64 KiB frames is not handed
// the 1 MiB buffers of another's uploads: every buffer of the class picked
// for a message of n bytes (see classFor) is less than 2n, which keeps the
// message eligible for Take.
const classes = 7 // 32 KiB … 2 MiB

var pools [classes]sync.Pool

// classSlack is what a new buffer holds beyond its class's smallest size.
// Reach messages are mostly a power-of-two payload plus a frame header
// (a 64 KiB DATA chunk, a 256 KiB client message read with the broker's
// headroom): without it, each such message in a fresh buffer regrew it
// (copied it) to the next size, and readAll grows a buffer that is full
// before it has seen the message end, even when nothing more comes.
const classSlack = 1 << 10

func init() {
	for i := range pools {
		size := initialSize<<i + classSlack
		pools[i].New = func() any {
			b := make([]byte, 0, size)
			return &b
		}
	}
}

// classFor is the class whose buffers hold n bytes without being twice as
// large: the largest class i with initialSize<<i <= n (class 0 below).
func classFor(n int) int {
	i := 0
	for i+1 < classes && initialSize<<(i+1) <= n {
		i++
	}
	return i
}

// putBuf returns a buffer to the class of its capacity; sizes outside
// the classes are left to the GC.
func putBuf(bp *[]byte) {
	c := cap(*bp)
	if c < initialSize || c > maxPooled {
		return
	}
	*bp = (*bp)[:0]
	pools[classFor(c)].Put(bp)
}

// Reader reads whole WebSocket messages into pooled, reused buffers, for
// one connection, from one goroutine at a time.
// The zero value is ready to use.
type Reader struct {
	held     *[]byte
	n        int // bytes of *held in use: headroom + the message
	headroom int
	last     int // bytes the last message needed: the next one is likely alike
	prev     int // and the one before: a small message between two large ones does not shrink the next buffer
}

// SetHeadroom keeps n bytes free in front of every later message in its
// buffer, so a caller that takes the buffer over (Take) can write a header
// there instead of copying the message behind one.
func (r *Reader) SetHeadroom(n int) { r.headroom = n }

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
	want := max(r.last, r.prev)
	bp := pools[classFor(want)].Get().(*[]byte)
	if cap(*bp) <= want {
		// Too small for the messages this connection reads: regrown by
		// readAll, it went back to a larger class, and a message just
		// below a class's top (7 inner TLS records, 112 KiB) regrew a
		// fresh buffer every time. One sized for them stays in this class.
		b := make([]byte, 0, want+classSlack)
		bp = &b
	}
	buf, err := readAll(rd, (*bp)[:r.headroom])
	*bp = buf[:0]
	if err != nil {
		putBuf(bp)
		return 0, nil, err
	}
	r.held, r.n, r.last, r.prev = bp, len(buf), len(buf), r.last
	return typ, buf[r.headroom:], nil
}

// Take hands the buffer of the last message over to the caller: its first
// headroom bytes are free, the message follows. The caller owns it from
// then on (the next Read takes another from the pool) and gives it back
// with Recycle once nothing refers to it. Take returns nil, and the buffer
// stays lent, when there is no message or the message fills less than
// half of its buffer: a small message would pin a large buffer, so it is
// worth a copy instead.
func (r *Reader) Take() []byte {
	if r.held == nil {
		return nil
	}
	b := (*r.held)[:r.n]
	if 2*len(b) < cap(b) {
		return nil
	}
	r.held = nil
	return b
}

// Recycle gives a buffer back to the pool Read draws from, once nothing
// refers to any byte of it: one Take returned, or any other buffer its
// owner is done with. Sizes the pool does not keep are left to the GC.
func Recycle(b []byte) {
	if c := cap(b); c < initialSize || c > maxPooled {
		return // not kept: no slice header on the heap for it either
	}
	bp := b
	putBuf(&bp)
}

// Release returns the buffer of the last message to the pool. The slice the
// last Read returned must not be used afterwards.
func (r *Reader) Release() {
	if r.held != nil {
		putBuf(r.held)
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

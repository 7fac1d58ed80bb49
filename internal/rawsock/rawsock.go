// Package rawsock moves a TCP socket's bytes with raw read(2) and write(2)
// calls through the socket's RawConn, waiting on the runtime's poller when
// the socket is empty or full, so that no call on the data path enters the
// runtime's system-call bookkeeping (sys_raw.go says why that matters).
// Deadlines and Close apply as to the plain connection: RawConn honours
// them. Under the race detector the syscall package's calls are used
// (sys_std.go); elsewhere than on Linux nothing is raw (Enabled is false).
//
// Sock is the mechanism (broker/msgconn's BatchConn builds its batching and
// read-ahead on it); Conn is a net.Conn whose Read and Write go through it,
// for the front's client sockets (under crypto/tls) and its upstream legs.
package rawsock

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// Sock is one socket's raw reads and writes. Its methods may be called
// concurrently as a net.Conn's are (RawConn serializes readers and writers
// apart); it holds no buffer between calls.
type Sock struct {
	rc syscall.RawConn
	c  net.Conn // the addresses errors name
}

// Of returns c's Sock, when c has a RawConn and raw calls are Enabled.
func Of(c net.Conn) (Sock, bool) {
	if !Enabled {
		return Sock{}, false
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return Sock{}, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return Sock{}, false
	}
	return Sock{rc: rc, c: c}, true
}

// Raw reports whether s is a socket's (Of found one); the zero Sock is not.
func (s Sock) Raw() bool { return s.rc != nil }

// Read is one read(2) into p, waiting on the poller while the socket is
// empty; the end of stream is io.EOF, as from the plain connection. The
// wait holds nothing (awaitReadable: two ppoll(2) calls that do not wait,
// around it), for a socket that idles long and must stay small (the
// broker's); ReadWait waits holding its op instead.
func (s Sock) Read(p []byte) (int, error) {
	n, _, err := s.read(p, nil, 0)
	return n, err
}

// ReadWait is Read waiting as the plain connection does: a read that finds
// the socket empty waits on the poller and reads again, one read(2) per
// wake-up and no ppoll(2). A waiting reader holds its op (a pooled
// rawOp, about 100 bytes) until the socket is readable.
func (s Sock) ReadWait(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	op := rawOps.Get().(*rawOp)
	op.p = p
	err := s.rc.Read(op.readWait)
	n, errno := op.n, op.errno
	op.done()
	if err == nil && errno != 0 {
		err = s.opError("read", errno)
	}
	if err == nil && n <= 0 {
		err = io.EOF
	}
	return n, plainOp(err)
}

// ReadPooled is Read into a buffer of size bytes taken from pool (a
// *[]byte of at least that length) instead of p, taken only once the
// socket has data: a reader waiting for bytes holds no buffer. It returns
// the buffer, holding the n bytes read, for the caller to put back; nil
// with an error.
func (s Sock) ReadPooled(pool *sync.Pool, size int) (int, *[]byte, error) {
	return s.read(nil, pool, size)
}

func (s Sock) read(p []byte, pool *sync.Pool, size int) (int, *[]byte, error) {
	if pool == nil && len(p) == 0 {
		return 0, nil, nil
	}
	var (
		n     int
		errno syscall.Errno
		bp    *[]byte
		err   error
	)
	for {
		op := rawOps.Get().(*rawOp)
		op.p, op.pool, op.size = p, pool, size
		err = s.rc.Read(op.read)
		n, errno, bp = op.n, op.errno, op.buf
		op.done()
		if err != nil || errno != syscall.EAGAIN {
			break
		}
		// Empty: wait for the poller holding nothing (awaitReadable).
		if err = s.rc.Read(awaitReadable); err != nil {
			break
		}
	}
	if err == nil && errno != 0 {
		err = s.opError("read", errno)
	}
	if err != nil || n <= 0 {
		if bp != nil {
			pool.Put(bp)
		}
		if err == nil {
			err = io.EOF
		}
		return 0, nil, plainOp(err)
	}
	return n, bp, nil
}

// Write writes all of p with raw write(2) calls, waiting on the poller
// while the socket is full.
func (s Sock) Write(p []byte) (int, error) {
	op := rawOps.Get().(*rawOp)
	op.p = p
	err := s.rc.Write(op.write)
	n, errno := op.n, op.errno
	op.done()
	if err == nil && errno != 0 {
		err = s.opError("write", errno)
	}
	return n, plainOp(err)
}

func (s Sock) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: s.c.LocalAddr(), Addr: s.c.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}

// plainOp names a RawConn's error (a deadline, a closed socket) as the
// plain connection's Read and Write do: net/http tells a common read error
// from others by its Op "read".
func plainOp(err error) error {
	oe, ok := err.(*net.OpError) // RawConn's own, never wrapped
	if !ok || (oe.Op != "raw-read" && oe.Op != "raw-write") {
		return err
	}
	c := *oe
	c.Op = oe.Op[len("raw-"):]
	return &c
}

// rawOp is one raw read or write in progress: its arguments, its result
// and the step functions a RawConn calls (made once per rawOp). They come
// from a pool, so a socket holds none between calls.
type rawOp struct {
	p           []byte     // read: where to; write: what is left after n
	pool        *sync.Pool // read: take the buffer from here instead (buf)
	size        int        // ... of this many bytes
	buf         *[]byte    // read: the pooled buffer taken
	n           int
	errno       syscall.Errno
	read, write func(fd uintptr) bool
	readWait    func(fd uintptr) bool
}

var rawOps = sync.Pool{New: func() any {
	op := new(rawOp)
	op.read, op.write, op.readWait = op.readStep, op.writeStep, op.readWaitStep
	return op
}}

func (op *rawOp) done() {
	op.p, op.pool, op.size, op.buf, op.n, op.errno = nil, nil, 0, nil, 0, 0
	rawOps.Put(op)
}

// readStep is one raw read (RawConn.Read calls it, and it never asks to
// wait: an empty socket is waited for with awaitReadable, holding no op):
// into p, or into a pooled buffer taken only if data is there.
func (op *rawOp) readStep(fd uintptr) bool {
	dst := op.p
	if op.pool != nil {
		op.buf = op.pool.Get().(*[]byte)
		dst = (*op.buf)[:op.size]
	}
	op.n, op.errno = sysRead(fd, dst)
	if op.errno != 0 && op.buf != nil {
		op.pool.Put(op.buf)
		op.buf = nil
	}
	return true
}

// readWaitStep is ReadWait's raw read: false on EAGAIN, to wait for the
// poller and read again.
func (op *rawOp) readWaitStep(fd uintptr) bool {
	op.n, op.errno = sysRead(fd, op.p)
	return op.errno != syscall.EAGAIN
}

// writeStep is the raw write: false on EAGAIN, to wait for the poller.
func (op *rawOp) writeStep(fd uintptr) bool {
	for op.n < len(op.p) {
		n, errno := sysWrite(fd, op.p[op.n:])
		if errno == syscall.EAGAIN {
			return false // wait until writable
		}
		if errno != 0 {
			op.errno = errno
			return true
		}
		op.n += n
	}
	return true
}

// WriteFD is one raw write(2) of p on a socket's descriptor, for a
// RawConn step that writes itself (it never waits: EAGAIN is returned).
func WriteFD(fd uintptr, p []byte) (int, syscall.Errno) { return sysWrite(fd, p) }

// PeekFD is one raw recvfrom(2) of p on a descriptor with MSG_PEEK and
// MSG_DONTWAIT: what the socket holds, left in it (EAGAIN: nothing).
func PeekFD(fd uintptr, p []byte) (int, syscall.Errno) { return sysPeek(fd, p) }

// Conn is a socket connection whose Read and Write are its Sock's; every
// other method is the connection's own (deadlines, Close, addresses), and
// CloseWrite and SyscallConn are kept.
type Conn struct {
	net.Conn
	s Sock
}

// Wrap returns c as a Conn when c is a socket (a syscall.Conn: a
// *net.TCPConn, or a type embedding one) and raw calls are Enabled, else c
// itself (an in-memory connection, a broker stream).
func Wrap(c net.Conn) net.Conn {
	s, ok := Of(c)
	if !ok {
		return c
	}
	return &Conn{Conn: c, s: s}
}

func (c *Conn) Read(p []byte) (int, error)  { return c.s.ReadWait(p) }
func (c *Conn) Write(p []byte) (int, error) { return c.s.Write(p) }

// CloseWrite shuts the sending side down, as net.TCPConn's does.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// SyscallConn is the connection's RawConn.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.s.rc, nil }

package relay

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
)

// Buffer sizes of the client leg's WebSocket connection. coder/websocket
// keeps whatever bufio pair the hijack returns for the connection's whole
// life, and net/http's pair is 4 KiB each way. Reads come from crypto/tls,
// which already holds the decrypted record, so the read buffer only needs to
// batch frame headers: payloads larger than it are read straight into the
// message buffer. The write buffer decides how many TLS records (and
// syscalls) a message costs: a message up to its size goes out as one.
const (
	clientReadBufBytes  = 512
	clientWriteBufBytes = 2 << 10
)

// smallBuffers wraps w so that the hijack coder/websocket performs yields a
// connection with small bufio buffers instead of the server's. Writers that
// cannot hijack are returned unchanged so Accept reports them as before.
func smallBuffers(w http.ResponseWriter) http.ResponseWriter {
	if _, ok := findHijacker(w); !ok {
		return w
	}
	return smallBufWriter{w}
}

// findHijacker follows Unwrap like http.ResponseController does.
func findHijacker(w http.ResponseWriter) (http.Hijacker, bool) {
	for {
		switch t := w.(type) {
		case http.Hijacker:
			return t, true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return nil, false
		}
	}
}

type smallBufWriter struct{ http.ResponseWriter }

func (w smallBufWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands over the connection with fresh small buffers. Bytes the
// server had already read past the request (a client may send its first
// frame without waiting for the 101) move into the new read buffer, where
// coder/websocket looks for them; anything the server still buffered for
// writing is flushed first.
func (w smallBufWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, _ := findHijacker(w.ResponseWriter)
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	if brw.Writer.Buffered() > 0 {
		if err := brw.Writer.Flush(); err != nil {
			_ = conn.Close()
			return nil, nil, err
		}
	}
	// The library rebuilds its reader over the returned conn (with what the
	// reader had buffered in front), so the conn itself must read abruptly.
	conn = abruptEOFConn{conn}
	var src io.Reader = conn
	size := clientReadBufBytes
	n := brw.Reader.Buffered()
	if n > 0 {
		pending, _ := brw.Reader.Peek(n)
		src = io.MultiReader(bytes.NewReader(bytes.Clone(pending)), conn)
		size = max(size, n)
	}
	br := bufio.NewReaderSize(src, size)
	if n > 0 {
		// Served by the bytes.Reader alone: never blocks on conn.
		if _, err := br.Peek(n); err != nil {
			_ = conn.Close()
			return nil, nil, err
		}
	}
	return conn, bufio.NewReadWriter(br, bufio.NewWriterSize(conn, clientWriteBufBytes)), nil
}

// abruptEOF reports the end of a WebSocket leg's byte stream as
// io.ErrUnexpectedEOF. coder/websocket takes a bare io.EOF from below while a
// message is open (between its fragments, or where a frame's payload should
// start) for the message's end, so a peer that stopped sending mid-message
// would have its fragment forwarded as a complete message. A WebSocket never
// ends cleanly by EOF (that is closure without a close frame, 1006), so the
// mapping changes nothing else.
type abruptEOF struct{ r io.Reader }

func (a abruptEOF) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// abruptEOFConn is a leg's connection with abruptEOF's reads.
type abruptEOFConn struct{ net.Conn }

func (c abruptEOFConn) Read(p []byte) (int, error) { return abruptEOF{c.Conn}.Read(p) }

// dialAbruptEOF wraps dial so that the connections it makes read as abruptEOFConn.
func dialAbruptEOF(dial func(context.Context, string, string) (net.Conn, error)) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return abruptEOFConn{c}, nil
	}
}

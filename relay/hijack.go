package relay

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
)

// Read buffer of the client leg. Reads come from crypto/tls, which already
// holds the decrypted record, so the buffer only batches frame headers:
// payloads larger than it are read straight into the forwarding or message
// buffer.
const clientReadBufBytes = 512

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

// hijackSmall takes the connection over with a small read buffer instead of
// the server's 4 KiB pair. Bytes the server had already read past the
// request (a client may send its first frame without waiting for the 101)
// move into the new read buffer; anything the server still buffered for
// writing is flushed first. The reader reads the connection's end as
// io.ErrUnexpectedEOF (abruptEOF); writes go to the connection itself.
func hijackSmall(hj http.Hijacker) (net.Conn, *bufio.Reader, error) {
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
	var src io.Reader = abruptEOF{conn}
	size := clientReadBufBytes
	n := brw.Reader.Buffered()
	if n > 0 {
		pending, _ := brw.Reader.Peek(n)
		src = io.MultiReader(bytes.NewReader(bytes.Clone(pending)), src)
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
	return conn, br, nil
}

// abruptEOF reports the end of a WebSocket leg's byte stream as
// io.ErrUnexpectedEOF: a WebSocket never ends cleanly by EOF (that is
// closure without a close frame, 1006), and no reader of a leg may take a
// bare io.EOF between a message's fragments, or where a frame's payload
// should start, for the message's end.
type abruptEOF struct{ r io.Reader }

func (a abruptEOF) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

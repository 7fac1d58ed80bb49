package testenv

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
)

// Records is a TCP forwarder on 127.0.0.1 in front of a TLS server that
// notes the length of every TLS record its clients send (RFC 8446 §5.1:
// type, version, a 2-byte length): how a client cut its bytes into
// records, which the bytes themselves do not show.
type Records struct {
	Addr string // where clients connect instead of the server

	mu  sync.Mutex
	max int
	n   int
}

// ForwardRecords starts a Records in front of the server at to.
func ForwardRecords(t testing.TB, to string) *Records {
	t.Helper()
	r := &Records{}
	r.Addr = Forward(t, to, func(client, server net.Conn) {
		go io.Copy(client, server)
		go r.parse(io.TeeReader(client, server))
	})
	return r
}

// Forward accepts TCP connections on 127.0.0.1 and dials to for each;
// pipe moves the bytes between the two (and returns at once). Every
// connection is closed when the test ends. It returns the address to
// connect to.
func Forward(t testing.TB, to string, pipe func(client, server net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			pipe(c, s)
		}
	}()
	return ln.Addr().String()
}

func (r *Records) parse(rd io.Reader) {
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(rd, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(hdr[3:]))
		r.mu.Lock()
		r.max, r.n = max(r.max, n), r.n+1
		r.mu.Unlock()
		if _, err := io.CopyN(io.Discard, rd, int64(n)); err != nil {
			return
		}
	}
}

// Seen is how many records the clients sent so far and the longest one's
// length.
func (r *Records) Seen() (n, longest int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.max
}

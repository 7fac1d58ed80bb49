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

	mu   sync.Mutex
	max  int
	n    int
	stop []func()
}

// ForwardRecords starts a Records in front of the server at to.
func ForwardRecords(t testing.TB, to string) *Records {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Records{Addr: ln.Addr().String()}
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, f := range r.stop {
			f()
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
			r.mu.Lock()
			r.stop = append(r.stop, func() { c.Close(); s.Close() })
			r.mu.Unlock()
			go io.Copy(c, s)
			go r.parse(io.TeeReader(c, s))
		}
	}()
	return r
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

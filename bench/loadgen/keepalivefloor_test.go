package main

import (
	"crypto/tls"
	"crypto/x509"
	"net/http/httptest"
	"testing"
	"time"
)

// The floor's bare server does the broker's keepalive work per socket:
// it pings on its own timer (10-byte records) and answers a peer's ping
// with a pong. Real TLS on 127.0.0.1.
func TestKeepaliveFloorServerPingsAndAnswers(t *testing.T) {
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS()
	cert, pool := srv.TLS.Certificates[0], x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	srv.Close()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveFloor(c.(*tls.Conn), 20*time.Millisecond)
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "example.com"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var ping [floorPeerSize]byte
	ping[0] = floorPing
	if _, err := c.Write(ping[:]); err != nil {
		t.Fatal(err)
	}
	got := map[byte]int{}
	buf := make([]byte, 128)
	for got[floorPong] < 1 || got[floorPing] < 2 {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		if n != floorServerSize {
			t.Fatalf("a %d-byte record from the server, want %d", n, floorServerSize)
		}
		got[buf[0]]++
	}
	if got[floorPong] != 1 {
		t.Fatalf("%d pongs to one ping", got[floorPong])
	}
}

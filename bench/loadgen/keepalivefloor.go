package main

// The keepalive floor (issue 15): what N idle sockets cost a bare Go TLS
// server that does, per socket and ping interval, what the spec asks of
// the broker (reach.md: both sides ping every 15 s), with nothing else:
// the peer's small record read and one small record written back (its
// pong), the server's own small record written (its ping) and the peer's
// answer read. No WebSocket, no session, no contexts: crypto/tls and the
// Go runtime on this machine, measured like the broker's keepalive row.
//
//   loadgen keepalive-server -listen ADDR -cert PEM -key PEM   the server (on the broker's core)
//   loadgen keepalive-floor -addr ADDR -ca-file PEM -n N -pids PID   its peers and the figure

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// The records: a kind byte (ping or pong) padded to the size of the
// keepalive's WebSocket frames: 10 bytes from the broker (a 2-byte header
// and the 8-byte ping number), 14 from a peer (a masked client frame).
const (
	floorPing       = 'p'
	floorPong       = 'o'
	floorServerSize = 10
	floorPeerSize   = 14
)

func cmdKeepaliveServer(args []string) error {
	fs := flag.NewFlagSet("keepalive-server", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "loopback address")
	certFile := fs.String("cert", "", "certificate (PEM)")
	keyFile := fs.String("key", "", "its key (PEM)")
	interval := fs.Duration("interval", wire.PingInterval, "the server's own ping, per socket")
	fs.Parse(args)
	if err := loopbackOnly(*listen); err != nil {
		return err
	}
	if *interval <= 0 || *interval > maxDuration {
		return errors.New("bad -interval")
	}
	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		return err
	}
	ln, err := tls.Listen("tcp", *listen, &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		return err
	}
	fmt.Printf("keepalive-server listening %s\n", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveFloor(c.(*tls.Conn), *interval)
	}
}

// serveFloor is one socket of the bare server: its first ping one
// interval after the accept, like the broker's after a registration.
func serveFloor(c *tls.Conn, interval time.Duration) {
	defer c.Close()
	floorKeepalive(c, floorServerSize, interval, interval)
}

// floorKeepalive runs one side of a socket until a read or a write fails:
// a reader (the broker's one goroutine per idle socket) that answers each
// ping with a pong, and a timer whose goroutine writes this side's ping of
// size bytes, first after first, then every interval.
func floorKeepalive(c *tls.Conn, size int, first, interval time.Duration) error {
	var mu sync.Mutex // one write at a time: the reader's pong, the timer's ping
	write := func(kind byte) error {
		var b [floorPeerSize]byte
		b[0] = kind
		mu.Lock()
		defer mu.Unlock()
		_, err := c.Write(b[:size])
		return err
	}
	// Made stopped and then started, so the function never runs before t
	// is set (first may be about 0).
	var t *time.Timer
	t = time.AfterFunc(time.Hour, func() {
		if write(floorPing) == nil {
			t.Reset(interval)
		}
	})
	t.Reset(first)
	defer t.Stop()
	buf := make([]byte, 128)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		if n > 0 && buf[0] == floorPing {
			if err := write(floorPong); err != nil {
				return err
			}
		}
	}
}

func cmdKeepaliveFloor(args []string) error {
	fs := flag.NewFlagSet("keepalive-floor", flag.ExitOnError)
	addr := fs.String("addr", "", "keepalive-server host:port")
	caFile := fs.String("ca-file", "", "its certificate (PEM)")
	n := fs.Int("n", 1000, "idle sockets")
	par := fs.Int("parallel", 16, "dials in flight")
	interval := fs.Duration("interval", wire.PingInterval, "each peer's ping")
	window := fs.Duration("window", 60*time.Second, "the measured idle window (after one interval of settling)")
	pids := fs.String("pids", "", "the server's pid")
	fs.Parse(args)
	if err := loopbackOnly(*addr); err != nil {
		return err
	}
	if *n < 1 || *n > maxConns || *par < 1 || *par > 256 || *interval <= 0 || *interval > maxDuration ||
		*window <= 0 || *window > maxDuration {
		return errors.New("bad -n/-parallel/-interval/-window")
	}
	roots, err := parsePIDs(*pids)
	if err != nil {
		return err
	}
	pool, err := loadPool(*caFile)
	if err != nil {
		return err
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	conns := make([]*tls.Conn, *n)
	err = dialAll(*n, *par, func(i int) error {
		d := net.Dialer{Timeout: dialTimeout}
		c, err := tls.DialWithDialer(&d, "tcp", *addr, cfg)
		conns[i] = c
		return err
	})
	for _, c := range conns {
		if c != nil {
			defer c.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	var failed atomic.Int64
	for _, c := range conns {
		go peerFloor(c, *interval, &failed)
	}
	// One interval for every peer's first ping (spread over it) and the
	// server's first one.
	time.Sleep(*interval + time.Second)
	rate, _, err := idleCPU(roots, *window)
	if err != nil {
		return err
	}
	if f := failed.Load(); f > 0 {
		return fmt.Errorf("%d of %d sockets failed", f, *n)
	}
	perSocket := rate * interval.Seconds() / float64(*n)
	fmt.Printf("phase=keepalive_floor sockets=%d secs=%.1f cpu_us=%.0f core_pct=%.2f us_per_socket_interval=%.2f interval_s=%.0f\n",
		*n, window.Seconds(), rate*window.Seconds(), rate/1e4, perSocket, interval.Seconds())
	return nil
}

// peerFloor is one peer: its first ping at a random point of the first
// interval; a failure other than the end of the run is counted.
func peerFloor(c *tls.Conn, interval time.Duration, failed *atomic.Int64) {
	err := floorKeepalive(c, floorPeerSize, rand.N(interval), interval)
	if !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
		failed.Add(1)
	}
}

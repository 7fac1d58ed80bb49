package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// cmdH3 is wrk's counterpart over HTTP/3 (wrk speaks only HTTP/1.1):
// -conns QUIC connections, each looping GETs of one URL with one request in
// flight, as wrk's connections do. A request counts only with status 200
// and, with -size, a body of exactly that length. It prints the rate, MB/s
// and the server's CPU per request over the measured window.
func cmdH3(args []string) error {
	fs := flag.NewFlagSet("h3", flag.ExitOnError)
	url := fs.String("url", "", "https://127.0.0.1:PORT/path")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the server")
	conns := fs.Int("conns", 32, "QUIC connections, one request in flight each")
	size := fs.Int64("size", -1, "expected body length (-1: any)")
	var win window
	win.flags(fs, 2*time.Second, "server pids for CPU accounting")
	fs.Parse(args)
	if *conns < 1 || *conns > maxConns {
		return errors.New("bad -conns")
	}
	clients, closeAll, err := h3Clients(*url, *pin, *conns)
	if err != nil {
		return err
	}
	defer closeAll()
	var proto atomic.Value
	res, err := win.loop(*conns, func(i int) (int64, error) { return h3Get(clients[i], *url, *size, &proto) })
	if err != nil {
		return err
	}
	if res.ok == 0 {
		return fmt.Errorf("no request succeeded (%d failed; last: %v)", res.fail, res.lastErr)
	}
	fmt.Printf("ops=%d fail=%d secs=%.2f rate=%.1f mbs=%.1f cpu_us=%.0f cpu_per_op_us=%.1f proto=%s\n",
		res.ok, res.fail, res.secs, float64(res.ok)/res.secs, float64(res.bytes)/res.secs/1e6,
		res.cpu, res.cpu/float64(res.ok), proto.Load())
	return nil
}

// cmdH3Get is the sanity check before the HTTP/3 figures: one pinned GET
// over QUIC, printing the status, length and protocol.
func cmdH3Get(args []string) error {
	fs := flag.NewFlagSet("h3get", flag.ExitOnError)
	url := fs.String("url", "", "https://127.0.0.1:PORT/path")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the server")
	fs.Parse(args)
	clients, closeAll, err := h3Clients(*url, *pin, 1)
	if err != nil {
		return err
	}
	defer closeAll()
	var proto atomic.Value
	n, err := h3Get(clients[0], *url, -1, &proto)
	if err != nil {
		return err
	}
	fmt.Printf("status=200 bytes=%d proto=%s\n", n, proto.Load())
	return nil
}

// h3Clients are n HTTP/3 clients, each with its own QUIC connection, pinned
// like every other client of the tool (clientTLS, ALPN h3).
func h3Clients(url, pin string, n int) ([]*http.Client, func(), error) {
	if err := loopbackURL(url); err != nil {
		return nil, nil, err
	}
	cfg, err := clientTLS(pin, []string{http3.NextProtoH3})
	if err != nil {
		return nil, nil, err
	}
	clients := make([]*http.Client, n)
	transports := make([]*http3.Transport, n)
	for i := range clients {
		transports[i] = &http3.Transport{TLSClientConfig: cfg, DisableCompression: true,
			QUICConfig: &quic.Config{HandshakeIdleTimeout: dialTimeout}}
		clients[i] = &http.Client{Transport: transports[i]}
	}
	return clients, func() {
		for _, tr := range transports {
			tr.Close()
		}
	}, nil
}

// h3Get is one request; it fails unless the status is 200 and, when size
// is not negative, the body has exactly size bytes.
func h3Get(cl *http.Client, url string, size int64, proto *atomic.Value) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout+30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return n, err
	}
	if proto.Load() == nil {
		proto.Store(resp.Proto)
	}
	if resp.StatusCode != http.StatusOK {
		return n, fmt.Errorf("status %d", resp.StatusCode)
	}
	if size >= 0 && n != size {
		return n, fmt.Errorf("body of %d bytes, want %d", n, size)
	}
	return n, nil
}

package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// cmdReachBulk is issue 14's broker figure as the issue states it: broker
// CPU per GB on ONE stream whose client writes 1 MiB binary messages. Both
// ends run here, on the load core, with the packages the product runs: the
// host is a real connector (broker/connector, the one `securelink serve`
// runs) registered under its own host line, whose stream net.Conn is the
// sink (upload) or the source (download); the client is broker/client's
// Conn, each Write of -msg-size bytes one binary message. No inner TLS and
// no HTTP: the stream carries raw bytes, so the only per-byte work on the
// broker is what it does for any stream (outer TLS both sides, unmasking,
// queueing), and the load core is not spent on a second TLS layer.
//
// Download frames are the connector's (64 KiB DATA frames) coalesced by
// the broker into client messages of up to its client_write_chunk; only
// the client-to-host direction has the client's message size.
func cmdReachBulk(args []string) error {
	fs := flag.NewFlagSet("reach-bulk", flag.ExitOnError)
	mode := fs.String("mode", "upload", "upload (client -> host), download (host -> client) or echo (one -msg-size message each way, one in flight)")
	brokerURL := fs.String("broker-url", "", "wss://127.0.0.1:PORT/v1/connect")
	caFile := fs.String("ca-file", "", "the broker's certificate (PEM)")
	hostPath := fs.String("host", "", "JSON from `securelink broker add-host --json`: the host this run registers as")
	msgSize := fs.Int("msg-size", wire.MaxClientFrame, "bytes per Write on either end (the client's message size)")
	echoRate := fs.Float64("echo-rate", 0, "echo: round trips started per second (0: back to back)")
	var win window
	win.flags(fs, 2*time.Second, "server pids for CPU accounting (the broker)")
	fs.Parse(args)
	if *mode != "download" && *mode != "upload" && *mode != "echo" {
		return errors.New("-mode must be download, upload or echo")
	}
	if *msgSize < 1 || *msgSize > wire.MaxClientFrame {
		return fmt.Errorf("-msg-size must be 1..%d", wire.MaxClientFrame)
	}
	if err := brokerLoopback(*brokerURL); err != nil {
		return err
	}
	pool, err := loadPool(*caFile)
	if err != nil {
		return err
	}
	lines, err := readHosts(*hostPath, 1)
	if err != nil {
		return err
	}
	meter, err := win.meter()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	defer func() {
		cancel()
		waitBounded(&runs, 10*time.Second)
	}()
	p, err := openBulkPair(ctx, &runs, *brokerURL, pool, lines[0])
	if err != nil {
		return err
	}
	defer p.close()
	if *mode == "echo" {
		res, err := measureEcho(p.client, p.host, *msgSize, *echoRate, win, meter)
		if err != nil {
			return err
		}
		fmt.Println(res)
		return nil
	}
	src, dst := p.client, p.host
	if *mode == "download" {
		src, dst = p.host, p.client
	}
	res, err := measureBulk(src, dst, *msgSize, win, meter)
	if err != nil {
		return err
	}
	fmt.Println(res.line(*mode, *msgSize))
	return nil
}

// bulkPair is one matched stream: the client's end and the host's end.
type bulkPair struct {
	client net.Conn
	host   net.Conn
}

func (p *bulkPair) close() {
	p.client.Close()
	p.host.Close()
}

// openBulkPair registers line's host with a real connector (it runs until
// ctx ends; runs counts it), has it publish a bootstrap, dials it as a
// client and returns both ends of the stream.
func openBulkPair(ctx context.Context, runs *sync.WaitGroup, brokerURL string, pool *x509.CertPool, line hostLine) (*bulkPair, error) {
	accepted := make(chan net.Conn, 1)
	hosts, err := startHosts(ctx, runs, brokerURL, pool, []hostLine{line}, 1, 1, func(h *idleHost) {
		ln := h.c.Listener()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case accepted <- c:
			default:
				c.Close() // one stream only
			}
		}
	})
	if err != nil {
		return nil, err
	}
	bctx, bcancel := context.WithTimeout(ctx, 30*time.Second)
	defer bcancel()
	b, err := hosts[0].c.PublishBootstrap(bctx, wire.DefaultBootstrapTTL)
	if err != nil {
		return nil, fmt.Errorf("publish bootstrap: %w", err)
	}
	cl, err := client.Dial(bctx, reachCred{b.BrokerURL, b.HostID, "bootstrap", wire.Secret(b.Token)}.config(pool))
	if err != nil {
		return nil, fmt.Errorf("client dial: %w", err)
	}
	select {
	case h := <-accepted:
		return &bulkPair{client: cl, host: h}, nil
	case <-bctx.Done():
		cl.Close()
		return nil, errors.New("the stream did not reach the host")
	}
}

// bulkResult is what one reach-bulk window measured.
type bulkResult struct {
	bytes, writes int64
	secs, cpuUS   float64 // window seconds, broker CPU µs
	selfUS        float64 // this process (both ends)
	err           string  // the first transfer error, if any
}

func (r bulkResult) line(mode string, msg int) string {
	cut, note := 0, ""
	if r.err != "" {
		cut, note = 1, " error="+strconv.Quote(r.err)
	}
	perGB := 0.0
	if r.bytes > 0 {
		perGB = r.cpuUS / 1e6 / (float64(r.bytes) / 1e9)
	}
	return fmt.Sprintf("mode=%s msg_bytes=%d bytes=%d writes=%d secs=%.2f mbs=%.1f cpu_us=%.0f cpu_s_per_gb=%.3f cpu_self_us=%.0f cut=%d%s",
		mode, msg, r.bytes, r.writes, r.secs, float64(r.bytes)/max(r.secs, 1e-9)/1e6, r.cpuUS, perGB, r.selfUS, cut, note)
}

// measureBulk writes msg-byte buffers to src back to back and reads dst
// into a buffer of the same size, through the warm-up and the window; the
// bytes counted are the ones dst received. Each byte read is checked
// against the pattern written, so a broker that lost, repeated or
// reordered bytes fails the run.
func measureBulk(src, dst net.Conn, msg int, win window, meter *cpuMeter) (bulkResult, error) {
	var (
		moved, writes atomic.Int64
		stopping      atomic.Bool
		firstErr      atomic.Value
		wg            sync.WaitGroup
	)
	fail := func(err error) {
		if !stopping.Load() {
			firstErr.CompareAndSwap(nil, err.Error())
		}
	}
	// The pattern is byte(position % 251); out holds it from every
	// starting offset, so each write is a slice of it.
	out := make([]byte, msg+251)
	for i := range out {
		out[i] = byte(i % 251)
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for off := 0; !stopping.Load(); {
			if _, err := src.Write(out[off : off+msg]); err != nil {
				fail(fmt.Errorf("write: %w", err))
				return
			}
			writes.Add(1)
			off = (off + msg) % 251
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, msg)
		var at int64
		for {
			n, err := dst.Read(buf)
			for i := range n {
				if buf[i] != byte((at+int64(i))%251) {
					fail(fmt.Errorf("byte %d differs from what was written", at+int64(i)))
					return
				}
			}
			at += int64(n)
			moved.Add(int64(n))
			if err != nil {
				if err != io.EOF {
					fail(fmt.Errorf("read after %d bytes: %w", at, err))
				}
				return
			}
		}
	}()
	time.Sleep(win.warm)
	var r bulkResult
	if err := meter.begin(); err != nil {
		return r, err
	}
	self0 := selfCPUMicros()
	b0, w0, t0 := moved.Load(), writes.Load(), time.Now()
	time.Sleep(win.dur)
	b1, w1 := moved.Load(), writes.Load()
	r.secs = time.Since(t0).Seconds()
	r.selfUS = selfCPUMicros() - self0
	cpu, err := meter.end()
	if e := firstErr.Load(); e != nil {
		r.err = e.(string)
	}
	stopping.Store(true)
	src.Close()
	dst.Close()
	waitBounded(&wg, 10*time.Second)
	if err != nil {
		return r, err
	}
	r.bytes, r.writes, r.cpuUS = b1-b0, w1-w0, cpu
	if r.bytes <= 0 {
		return r, fmt.Errorf("no byte moved in the window (%d before)%s", b0, map[bool]string{true: ": " + r.err}[r.err != ""])
	}
	return r, nil
}

// measureEcho sends one msg-byte message from the client, has the host
// write it back, and waits for all of it before the next: the broker's
// small-message path, without the front, inner TLS or the Relay. It prints
// round-trip percentiles and the broker's CPU per round trip (two
// messages cross it).
func measureEcho(cl, host net.Conn, msg int, rate float64, win window, meter *cpuMeter) (string, error) {
	go func() {
		buf := make([]byte, msg)
		for {
			if _, err := io.ReadFull(host, buf); err != nil {
				return
			}
			if _, err := host.Write(buf); err != nil {
				return
			}
		}
	}()
	out, in := make([]byte, msg), make([]byte, msg)
	for i := range out {
		out[i] = byte(i)
	}
	trip := func() (time.Duration, error) {
		t := time.Now()
		if _, err := cl.Write(out); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(cl, in); err != nil {
			return 0, err
		}
		return time.Since(t), nil
	}
	for end := time.Now().Add(win.warm); time.Now().Before(end); {
		if _, err := trip(); err != nil {
			return "", fmt.Errorf("warm-up: %w", err)
		}
	}
	if err := meter.begin(); err != nil {
		return "", err
	}
	var samples []int64
	t0 := time.Now()
	for time.Since(t0) < win.dur && len(samples) < maxSamples {
		if rate > 0 {
			// Paced: the next round trip starts on its slot (or at once when late).
			if wait := time.Until(t0.Add(time.Duration(float64(len(samples)) * float64(time.Second) / rate))); wait > 0 {
				time.Sleep(wait)
			}
		}
		d, err := trip()
		if err != nil {
			return "", err
		}
		samples = append(samples, d.Microseconds())
	}
	secs := time.Since(t0).Seconds()
	cpu, err := meter.end()
	if err != nil {
		return "", err
	}
	slices.Sort(samples)
	n := float64(len(samples))
	return fmt.Sprintf("mode=echo msg_bytes=%d ops=%d secs=%.2f p50_us=%d p99_us=%d cpu_us=%.0f cpu_per_op_us=%.1f cpu_per_msg_us=%.1f",
		msg, len(samples), secs, pct(samples, 0.5), pct(samples, 0.99), cpu, cpu/n, cpu/n/2), nil
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/wire"
)

type hostLine struct {
	HostID string `json:"host_id"`
	Token  string `json:"host_token"`
}

// readHosts reads the JSON lines `securelink broker add-host --json` printed.
func readHosts(path string, want int) ([]hostLine, error) {
	b, err := readBounded(path, maxIdleHosts*256)
	if err != nil {
		return nil, err
	}
	var out []hostLine
	for _, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var h hostLine
		if err := json.Unmarshal(line, &h); err != nil || h.HostID == "" || h.Token == "" {
			return nil, fmt.Errorf("%s: a line is not {host_id, host_token}", path)
		}
		out = append(out, h)
		if len(out) == want {
			break
		}
	}
	if len(out) < want {
		return nil, fmt.Errorf("%s: %d hosts, want %d", path, len(out), want)
	}
	return out, nil
}

// idleHost is a real connector (the one `securelink serve` runs) that
// accepts its streams and leaves them idle.
type idleHost struct {
	c     *connector.Connector
	mu    sync.Mutex
	conns []net.Conn
}

func (h *idleHost) accept() {
	ln := h.c.Listener()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		h.mu.Lock()
		h.conns = append(h.conns, c)
		h.mu.Unlock()
	}
}

func (h *idleHost) accepted() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// cmdReachIdle measures the broker's resident memory per idle host
// registration and per idle stream. Hosts are real connectors (the package
// `securelink serve` runs), streams are real client streams with bootstrap
// credentials the hosts publish; nothing moves on them once matched.
func cmdReachIdle(args []string) error {
	fs := flag.NewFlagSet("reach-idle", flag.ExitOnError)
	brokerURL := fs.String("broker-url", "", "wss://127.0.0.1:PORT/v1/connect")
	caFile := fs.String("ca-file", "", "the broker's certificate (PEM)")
	hostsPath := fs.String("hosts", "", "JSON lines from `securelink broker add-host --json`")
	nHosts := fs.Int("hosts-n", 200, "idle hosts to register")
	streamHosts := fs.Int("stream-hosts", 64, "hosts that get idle streams")
	perHost := fs.Int("streams-per-host", 16, "idle streams per such host")
	settle := fs.Duration("settle", 3*time.Second, "wait before each RSS sample")
	late := fs.Duration("late", 0, "if set, sample the RSS again this long after the streams' sample (Go forces a GC every 2 min)")
	par := fs.Int("parallel", 16, "registrations in flight")
	pids := fs.String("pids", "", "broker pid")
	metrics := fs.String("metrics", "", "the broker's metrics listener (host:port): goroutines per idle host and stream from go_goroutines")
	hold := fs.Duration("hold", 0, "if set, keep everything idle this long after the last sample and report the broker's CPU meanwhile (keepalive and idle timers)")
	fs.Parse(args)
	if err := brokerLoopback(*brokerURL); err != nil {
		return err
	}
	if *nHosts < 1 || *nHosts > maxIdleHosts || *streamHosts < 0 || *streamHosts > *nHosts ||
		*perHost < 1 || *perHost > maxStreamsPerHst || *settle < 0 || *settle > maxDuration || *par < 1 || *par > 256 || *hold < 0 || *hold > maxDuration {
		return errors.New("bad -hosts-n/-stream-hosts/-streams-per-host/-settle/-parallel/-hold")
	}
	roots, err := parsePIDs(*pids)
	if err != nil || len(roots) == 0 {
		return fmt.Errorf("need -pids: %v", err)
	}
	pool, err := loadPool(*caFile)
	if err != nil {
		return err
	}
	lines, err := readHosts(*hostsPath, *nHosts)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	if *metrics != "" {
		if err := loopbackOnly(*metrics); err != nil {
			return err
		}
	}
	// goroutines reads the broker's go_goroutines; -1 without -metrics.
	goroutines := func() (float64, error) {
		if *metrics == "" {
			return -1, nil
		}
		s, err := scrape(ctx, *metrics)
		return s.goroutines, err
	}
	before, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	g0, err := goroutines()
	if err != nil {
		return err
	}
	hosts := make([]*idleHost, len(lines))
	var runs sync.WaitGroup
	defer func() {
		cancel()
		waitBounded(&runs, 10*time.Second)
	}()
	for i, l := range lines {
		c, err := connector.New(connector.Config{
			BrokerURL: *brokerURL, HostID: l.HostID, Token: wire.Secret(l.Token),
			RootCAs: pool, MaxStreams: *perHost, Log: zerolog.Nop(),
		})
		if err != nil {
			return fmt.Errorf("host %d: %w", i, err)
		}
		hosts[i] = &idleHost{c: c}
		go hosts[i].accept()
	}
	// Start the registrations -parallel at a time, so the broker sees a
	// steady trickle rather than one burst of handshakes.
	t0 := time.Now()
	for i, h := range hosts {
		runs.Add(1)
		go func() { defer runs.Done(); h.c.Run(ctx) }()
		if (i+1)%*par == 0 {
			if err := waitConnected(hosts[:i+1], 60*time.Second); err != nil {
				return err
			}
		}
	}
	if err := waitConnected(hosts, 60*time.Second); err != nil {
		return err
	}
	hostSecs := time.Since(t0).Seconds()
	time.Sleep(*settle)
	mid, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	g1, err := goroutines()
	if err != nil {
		return err
	}

	// Idle streams: each with its own bootstrap (one stream each).
	type job struct{ h *idleHost }
	jobs := make(chan job)
	var (
		wg       sync.WaitGroup
		firstErr atomic.Value
		cmu      sync.Mutex
		clients  []net.Conn
	)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for w := 0; w < *par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if firstErr.Load() != nil {
					continue
				}
				bctx, bcancel := context.WithTimeout(ctx, 30*time.Second)
				b, err := j.h.c.PublishBootstrap(bctx, wire.DefaultBootstrapTTL)
				if err == nil {
					var c net.Conn
					cfg := reachCred{b.BrokerURL, b.HostID, "bootstrap", wire.Secret(b.Token)}.config(pool)
					c, err = client.Dial(bctx, cfg)
					if err == nil {
						cmu.Lock()
						clients = append(clients, c)
						cmu.Unlock()
					}
				}
				bcancel()
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	t1 := time.Now()
	for _, h := range hosts[:*streamHosts] {
		for k := 0; k < *perHost; k++ {
			jobs <- job{h}
		}
	}
	close(jobs)
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return fmt.Errorf("opening idle streams: %v", e)
	}
	nStreams := *streamHosts * *perHost
	// Every stream must have reached its host, or it is not a stream yet.
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := 0
		for _, h := range hosts {
			n += h.accepted()
		}
		if n == nStreams {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d streams reached their hosts", n, nStreams)
		}
		time.Sleep(50 * time.Millisecond)
	}
	streamSecs := time.Since(t1).Seconds()
	time.Sleep(*settle)
	after, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	g2, err := goroutines()
	if err != nil {
		return err
	}
	gNote := ""
	if *metrics != "" {
		gNote = fmt.Sprintf(" goroutines_per_host=%.2f", (g1-g0)/float64(len(hosts)))
		if nStreams > 0 {
			gNote += fmt.Sprintf(" goroutines_per_stream=%.2f", (g2-g1)/float64(nStreams))
		}
	}
	perHostKiB := (float64(mid.rssKiB) - float64(before.rssKiB)) / float64(len(hosts))
	perStreamKiB := 0.0
	if nStreams > 0 {
		perStreamKiB = (float64(after.rssKiB) - float64(mid.rssKiB)) / float64(nStreams)
	}
	lateNote := ""
	if *late > 0 && *late <= maxDuration {
		time.Sleep(*late)
		l, err := sampleProcs(roots)
		if err != nil {
			return err
		}
		lateNote = fmt.Sprintf(" rss_late_kib=%d kib_per_host_stream_late=%.1f", l.rssKiB,
			(float64(l.rssKiB)-float64(before.rssKiB))/float64(len(hosts)+nStreams))
	}
	holdNote := ""
	if *hold > 0 {
		// Everything idle: what the broker spends is its keepalive (a ping
		// every interval on every socket) and its idle timers.
		h0, err := sampleProcs(roots)
		if err != nil {
			return err
		}
		t := time.Now()
		time.Sleep(*hold)
		h1, err := sampleProcs(roots)
		if err != nil {
			return err
		}
		secs := time.Since(t).Seconds()
		holdNote = fmt.Sprintf(" hold_secs=%.1f idle_cpu_pct=%.2f", secs, (h1.cpuMicros()-h0.cpuMicros())/1e6/secs*100)
	}
	fmt.Printf("hosts=%d streams=%d host_secs=%.2f stream_secs=%.2f rss_before_kib=%d rss_hosts_kib=%d rss_streams_kib=%d kib_per_host=%.1f kib_per_stream=%.1f%s%s%s\n",
		len(hosts), nStreams, hostSecs, streamSecs, before.rssKiB, mid.rssKiB, after.rssKiB, perHostKiB, perStreamKiB, gNote, lateNote, holdNote)
	return nil
}

func waitConnected(hosts []*idleHost, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		n := 0
		var last connector.Status
		for _, h := range hosts {
			st := h.c.Status()
			if st.State == connector.StateConnected {
				n++
			} else {
				last = st
			}
		}
		if n == len(hosts) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d hosts registered; one is %s (%s %s)", n, len(hosts), last.State, last.LastError, last.LastErrorDetail)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

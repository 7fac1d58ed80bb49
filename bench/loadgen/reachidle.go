package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
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
	warm := fs.Int("warm", 0, "hosts registered (from the file's first lines) and kept before the baseline sample, so the per-host figure leaves out the broker's first-use costs (code paged in, runtime arenas)")
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
	if *nHosts < 1 || *warm < 0 || *nHosts+*warm > maxIdleHosts || *streamHosts < 0 || *streamHosts > *nHosts ||
		*perHost < 1 || *perHost > maxStreamsPerHst || *settle < 0 || *settle > maxDuration || *par < 1 || *par > 256 || *hold < 0 || *hold > maxDuration {
		return errors.New("bad -hosts-n/-warm/-stream-hosts/-streams-per-host/-settle/-parallel/-hold")
	}
	roots, err := parsePIDs(*pids)
	if err != nil || len(roots) == 0 {
		return fmt.Errorf("need -pids: %v", err)
	}
	pool, err := loadPool(*caFile)
	if err != nil {
		return err
	}
	lines, err := readHosts(*hostsPath, *warm+*nHosts)
	if err != nil {
		return err
	}
	warmLines, lines := lines[:*warm], lines[*warm:]
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
	var runs sync.WaitGroup
	defer func() {
		cancel()
		waitBounded(&runs, 10*time.Second)
	}()
	if len(warmLines) > 0 {
		if _, err := startHosts(ctx, &runs, *brokerURL, pool, warmLines, *perHost, *par, (*idleHost).accept); err != nil {
			return fmt.Errorf("warm-up hosts: %w", err)
		}
		time.Sleep(*settle)
	}
	before, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	g0, err := goroutines()
	if err != nil {
		return err
	}
	t0 := time.Now()
	hosts, err := startHosts(ctx, &runs, *brokerURL, pool, lines, *perHost, *par, (*idleHost).accept)
	if err != nil {
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
	var jobs []*idleHost
	for _, h := range hosts[:*streamHosts] {
		for k := 0; k < *perHost; k++ {
			jobs = append(jobs, h)
		}
	}
	nStreams := len(jobs)
	t1 := time.Now()
	clients, _, err := openIdleStreams(ctx, pool, jobs, *par)
	defer closeAll(clients)
	if err != nil {
		return err
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
	fmt.Printf("warm=%d hosts=%d streams=%d host_secs=%.2f stream_secs=%.2f rss_before_kib=%d rss_hosts_kib=%d rss_streams_kib=%d kib_per_host=%.1f kib_per_stream=%.1f%s%s%s\n",
		len(warmLines), len(hosts), nStreams, hostSecs, streamSecs, before.rssKiB, mid.rssKiB, after.rssKiB, perHostKiB, perStreamKiB, gNote, lateNote, holdNote)
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

// startHosts starts a real connector for each line and waits until all are
// registered, starting them par at a time so the broker sees a steady
// trickle rather than one burst of handshakes. accept serves each host's
// listener. The connectors run until ctx ends; runs counts them.
func startHosts(ctx context.Context, runs *sync.WaitGroup, brokerURL string, pool *x509.CertPool, lines []hostLine, perHost, par int, accept func(*idleHost)) ([]*idleHost, error) {
	hosts := make([]*idleHost, len(lines))
	for i, l := range lines {
		c, err := connector.New(connector.Config{
			BrokerURL: brokerURL, HostID: l.HostID, Token: wire.Secret(l.Token),
			RootCAs: pool, MaxStreams: perHost, Log: zerolog.Nop(),
			// A loaded machine (the load core runs every client's TLS)
			// can hold a reply past the 5 s default; the figures are CPU,
			// not latency.
			PublishTimeout: 30 * time.Second,
		})
		if err != nil {
			return nil, fmt.Errorf("host %d: %w", i, err)
		}
		hosts[i] = &idleHost{c: c}
		go accept(hosts[i])
	}
	for i, h := range hosts {
		runs.Add(1)
		go func() { defer runs.Done(); h.c.Run(ctx) }()
		if (i+1)%par == 0 {
			if err := waitConnected(hosts[:i+1], 60*time.Second); err != nil {
				return nil, err
			}
		}
	}
	return hosts, waitConnected(hosts, 60*time.Second)
}

// openIdleStreams opens one idle client stream per entry of jobs (a host
// may appear several times), each with its own bootstrap the host
// publishes, par at a time, and waits until every stream has reached its
// host. A failed open is tried again, at most openAttempts times in all;
// retries counts the repeats. It returns the client ends, also on error
// (the caller closes them).
func openIdleStreams(ctx context.Context, pool *x509.CertPool, jobs []*idleHost, par int) (clients []net.Conn, retries int64, err error) {
	uniq := map[*idleHost]bool{}
	want := 0
	for _, h := range jobs {
		if !uniq[h] {
			uniq[h] = true
			want += h.accepted()
		}
	}
	want += len(jobs)
	ch := make(chan *idleHost)
	var (
		wg       sync.WaitGroup
		firstErr atomic.Value
		cmu      sync.Mutex
		repeats  atomic.Int64
	)
	open := func(h *idleHost) error {
		// A host that lost its registration (a starved load core misses
		// pongs) reconnects by itself; wait for it rather than publish
		// into a dead session.
		if err := waitConnected([]*idleHost{h}, 60*time.Second); err != nil {
			return err
		}
		bctx, bcancel := context.WithTimeout(ctx, 30*time.Second)
		defer bcancel()
		b, err := h.c.PublishBootstrap(bctx, wire.DefaultBootstrapTTL)
		if err != nil {
			return err
		}
		cfg := reachCred{b.BrokerURL, b.HostID, "bootstrap", wire.Secret(b.Token)}.config(pool)
		c, err := client.Dial(bctx, cfg)
		if err != nil {
			return err
		}
		cmu.Lock()
		clients = append(clients, c)
		cmu.Unlock()
		return nil
	}
	for w := 0; w < par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for h := range ch {
				if firstErr.Load() != nil {
					continue
				}
				err := open(h)
				for k := 1; err != nil && k < openAttempts && ctx.Err() == nil; k++ {
					repeats.Add(1)
					err = open(h)
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	for _, h := range jobs {
		ch <- h
	}
	close(ch)
	wg.Wait()
	retries = repeats.Load()
	if e := firstErr.Load(); e != nil {
		return clients, retries, fmt.Errorf("opening idle streams: %v (%s)", e, hostsSummary(uniq))
	}
	// Every stream must have reached its host, or it is not a stream yet.
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := 0
		for h := range uniq {
			n += h.accepted()
		}
		// More than want: a retried open whose first try the client gave
		// up on still reached its host (and was closed by the client).
		if n >= want {
			return clients, retries, nil
		}
		if time.Now().After(deadline) {
			return clients, retries, fmt.Errorf("%d of %d streams reached their hosts", n-(want-len(jobs)), len(jobs))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hostsSummary says how many of hosts are registered and why their
// connectors reconnected, for an error message.
func hostsSummary(hosts map[*idleHost]bool) string {
	up := 0
	why := map[string]int64{}
	for h := range hosts {
		if h.c.Status().State == connector.StateConnected {
			up++
		}
		for k, v := range h.c.Counts() {
			if strings.HasPrefix(k, "reconnect:") {
				why[k] += v
			}
		}
	}
	return fmt.Sprintf("%d of %d hosts registered; reconnects %v", up, len(hosts), why)
}

// openAttempts bounds the tries of one idle stream open.
const openAttempts = 6

func closeAll(cs []net.Conn) {
	for _, c := range cs {
		c.Close()
	}
}

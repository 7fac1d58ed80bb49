package main

// reach-scale: the broker at scale (issue 15). Real connectors register,
// real clients open streams through the broker, and the broker's CPU is read
// from /proc around each window, so every figure is CPU per operation at a
// known table size: registrations and matches at each stream-table level,
// the RSS and goroutines each idle socket costs at the largest level, and
// the keepalive CPU of an idle broker holding them all.

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// Bounds of reach-scale.
const (
	maxScaleLevels  = 8
	maxScaleStreams = 1 << 20
	maxChurnWorkers = 256
)

// ---------------------------------------------------------------- reach-hosts

// cmdReachHosts writes a broker hosts file with n fresh hosts, in one write,
// and their credentials as the JSON lines `securelink broker add-host
// --json` prints. add-host rewrites the whole file once per host (O(n²) for
// the 10,000 hosts of the scale figure); this uses the same store format and
// the same id and token primitives.
func cmdReachHosts(args []string) error {
	fs := flag.NewFlagSet("reach-hosts", flag.ExitOnError)
	n := fs.Int("n", 0, "hosts to create")
	hostsFile := fs.String("hosts-file", "", "the broker's hosts_file to create (must not exist)")
	out := fs.String("out", "", "write {host_id, host_token} JSON lines here (0600, must not exist)")
	fs.Parse(args)
	if *n < 1 || *n > store.MaxHostsEntries || *hostsFile == "" || *out == "" {
		return fmt.Errorf("need -n 1..%d, -hosts-file and -out", store.MaxHostsEntries)
	}
	for _, p := range []string{*hostsFile, *out} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("%s exists; reach-hosts only creates", p)
		}
	}
	if err := atomicfile.CheckWriter(filepath.Dir(*hostsFile)); err != nil {
		return err
	}
	h := store.Hosts{}
	lines := make([]byte, 0, *n*100)
	for len(h) < *n {
		id := wire.NewID()
		if h[id] != (wire.Digest{}) {
			continue
		}
		tok := wire.NewToken()
		h[id] = wire.TokenDigest(string(tok))
		b, err := json.Marshal(map[string]string{"host_id": id.String(), "host_token": string(tok)})
		if err != nil {
			return err
		}
		lines = append(append(lines, b...), '\n')
	}
	if err := atomicfile.WriteFile(*out, lines, 0o600); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(*hostsFile, h.Marshal(), store.FileMode); err != nil {
		return err
	}
	fmt.Printf("hosts=%d\n", len(h))
	return nil
}

// ---------------------------------------------------------------- figures

// parseLevels reads -levels: stream-table sizes, strictly ascending.
func parseLevels(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 0 || v > maxScaleStreams {
			return nil, fmt.Errorf("level %q is not 0..%d", f, maxScaleStreams)
		}
		if len(out) > 0 && v <= out[len(out)-1] {
			return nil, errors.New("-levels must be strictly ascending")
		}
		out = append(out, v)
	}
	if len(out) == 0 || len(out) > maxScaleLevels {
		return nil, fmt.Errorf("-levels needs 1..%d sizes", maxScaleLevels)
	}
	return out, nil
}

// opFigure is one measured phase: ops done in secs, costing the broker
// cpuUS of CPU.
type opFigure struct {
	phase  string
	level  int // streams in the table during the phase; -1: not applicable
	ops    int64
	errors int64 // operations that failed (not in ops)
	// retries are attempts repeated inside an operation: a connector's
	// reconnects before it registered, a stream open tried again. Their
	// broker CPU is in cpuUS.
	retries int64
	secs    float64
	cpuUS   float64
	// idleUS is the broker's CPU per second with nothing but keepalive
	// moving at this table size (measured just before); net_us_per_op
	// takes idleUS × secs out of cpuUS, so the pings of thousands of idle
	// sockets are not charged to the operations of the window.
	idleUS float64
	err    string
}

// line renders the figure as the key=value line bench/scale.sh reads:
// us_per_op is broker CPU per operation, per_s the measured rate, busy_pct
// the share of the broker's core the phase used; net_us_per_op is CPU per
// operation beyond the idle baseline and per_core_s the rate one broker
// core could sustain at that cost (1e6 / net_us_per_op). An error, if any,
// comes last (it may hold spaces).
func (f opFigure) line() string {
	per, net, rate, busy, ceiling := 0.0, 0.0, 0.0, 0.0, 0.0
	if f.ops > 0 {
		per = f.cpuUS / float64(f.ops)
		net = max(0, f.cpuUS-f.idleUS*f.secs) / float64(f.ops)
	}
	if f.secs > 0 {
		rate = float64(f.ops) / f.secs
		busy = f.cpuUS / f.secs / 1e4
	}
	if net > 0 {
		ceiling = 1e6 / net
	}
	s := fmt.Sprintf("phase=%s level=%d ops=%d errors=%d retries=%d secs=%.2f cpu_us=%.0f idle_us_per_s=%.0f us_per_op=%.1f net_us_per_op=%.1f per_s=%.0f busy_pct=%.0f per_core_s=%.0f",
		f.phase, f.level, f.ops, f.errors, f.retries, f.secs, f.cpuUS, f.idleUS, per, net, rate, busy, ceiling)
	if f.err != "" {
		s += " error=" + f.err
	}
	return s
}

// perSocket is the idle cost of each socket: the broker's growth from a
// baseline (before any host) over the sockets it holds (hosts + streams).
func perSocket(base, now float64, sockets int) float64 {
	if sockets <= 0 {
		return 0
	}
	return (now - base) / float64(sockets)
}

// ---------------------------------------------------------------- churn

// regChurn registers and drops one host again and again: a fresh connector
// (what a host does after a restart) until `registered`, then gone.
// It returns the reconnects the connector needed before it registered.
func regChurn(ctx context.Context, brokerURL string, pool *x509.CertPool, l hostLine) (int64, error) {
	c, err := connector.New(connector.Config{
		BrokerURL: brokerURL, HostID: l.HostID, Token: wire.Secret(l.Token),
		RootCAs: pool, MaxStreams: 1, Log: zerolog.Nop(),
	})
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.Run(rctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(dialTimeout)
	for {
		st := c.Status()
		if st.State == connector.StateConnected {
			return reconnects(c.Counts()), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("not registered within %v (%s %s)", dialTimeout, st.LastError, st.LastErrorDetail)
		}
		time.Sleep(time.Millisecond)
	}
}

// reconnects sums a connector's "reconnect:<why>" counts.
func reconnects(counts map[string]int64) int64 {
	var n int64
	for k, v := range counts {
		if strings.HasPrefix(k, "reconnect:") {
			n += v
		}
	}
	return n
}

// closingHost accepts the streams of a match-churn host and closes each at
// once: the match is what is measured, not the stream.
func closingHost(h *idleHost) {
	ln := h.c.Listener()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

// routeFor obtains a route credential from a registered host the way the
// front does for a Relay login through the broker: the connector's handoff
// publishes a route token for the session and adds it to auth.ok.
func routeFor(ctx context.Context, h *idleHost, i int) (reachCred, error) {
	sess := fmt.Sprintf("scale-%d", i)
	auth := []byte(`{"channel":"system","type":"auth","id":"1","payload":{"session_token":"x","device_id":"` + sess + `"}}`)
	ok := []byte(`{"channel":"system","type":"auth.ok","id":"1","payload":{"session_token":"` + sess + `","expires_at":null}}`)
	msg := h.c.Handoff().AuthOK(ctx, auth, ok)
	if msg == nil {
		return reachCred{}, errors.New("the connector published no route credential")
	}
	rc, err := parseRouteCredential(msg)
	if err != nil {
		return reachCred{}, err
	}
	return reachCred{rc.BrokerURL, rc.HostID, "route", wire.Secret(rc.Token)}, nil
}

// idleCPU is the broker's CPU per second over d in which the load side
// starts nothing, and the sample at its end.
func idleCPU(roots []int, d time.Duration) (float64, procSample, error) {
	s0, err := sampleProcs(roots)
	if err != nil {
		return 0, s0, err
	}
	t := time.Now()
	time.Sleep(d)
	s1, err := sampleProcs(roots)
	if err != nil {
		return 0, s1, err
	}
	return (s1.cpuMicros() - s0.cpuMicros()) / time.Since(t).Seconds(), s1, nil
}

// ---------------------------------------------------------------- reach-scale

func cmdReachScale(args []string) error {
	fs := flag.NewFlagSet("reach-scale", flag.ExitOnError)
	brokerURL := fs.String("broker-url", "", "wss://127.0.0.1:PORT/v1/connect")
	caFile := fs.String("ca-file", "", "the broker's certificate (PEM)")
	hostsPath := fs.String("hosts", "", "JSON lines of hosts (reach-hosts or add-host --json)")
	metricsAddr := fs.String("metrics", "", "the broker's metrics listener (go_goroutines)")
	idleN := fs.Int("idle-hosts", 1000, "hosts registered and held idle; the streams go to the first of them")
	levelsS := fs.String("levels", "5000,18000", "stream-table sizes at which the churn is measured")
	perHost := fs.Int("streams-per-host", 16, "idle streams per stream host (the broker's per-host limit)")
	regN := fs.Int("reg-hosts", 16, "hosts of the registration churn (one per worker)")
	matchN := fs.Int("match-hosts", 64, "hosts of the match churn; each match uses a route credential of one")
	workers := fs.Int("workers", 16, "churn operations in flight")
	par := fs.Int("parallel", 16, "registrations and stream opens in flight while filling")
	settle := fs.Duration("settle", 3*time.Second, "wait before each idle sample")
	keepalive := fs.Duration("keepalive", 0, "if set, measure the broker's CPU over this idle window at the largest level")
	baseline := fs.Duration("baseline", wire.PingInterval, "idle window before each level's churn (the broker's CPU with keepalive only); one ping interval")
	var w window
	w.flags(fs, time.Second, "broker pid")
	fs.Parse(args)
	if err := brokerLoopback(*brokerURL); err != nil {
		return err
	}
	if *metricsAddr == "" {
		return errors.New("need -metrics (the broker's metrics listener)")
	}
	if err := loopbackOnly(*metricsAddr); err != nil {
		return err
	}
	levels, err := parseLevels(*levelsS)
	if err != nil {
		return err
	}
	if *idleN < 1 || *perHost < 1 || *perHost > maxStreamsPerHst || *workers < 1 || *workers > maxChurnWorkers ||
		*regN < *workers || *matchN < *workers || *par < 1 || *par > 256 || *settle < 0 || *settle > maxDuration ||
		*keepalive < 0 || *keepalive > maxDuration || *baseline <= 0 || *baseline > maxDuration {
		return errors.New("bad -idle-hosts/-streams-per-host/-workers/-reg-hosts/-match-hosts/-parallel/-settle/-keepalive (reg and match hosts must be at least -workers)")
	}
	if top := levels[len(levels)-1]; (top+*perHost-1) / *perHost > *idleN {
		return fmt.Errorf("%d streams need %d stream hosts at %d each; -idle-hosts is %d", top, (top+*perHost-1) / *perHost, *perHost, *idleN)
	}
	total := *idleN + *matchN + *regN
	if total > maxIdleHosts {
		return fmt.Errorf("%d hosts in all; at most %d", total, maxIdleHosts)
	}
	roots, err := parsePIDs(w.pids)
	if err != nil || len(roots) == 0 {
		return fmt.Errorf("need -pids: %v", err)
	}
	pool, err := loadPool(*caFile)
	if err != nil {
		return err
	}
	lines, err := readHosts(*hostsPath, total)
	if err != nil {
		return err
	}
	idleLines, matchLines, regLines := lines[:*idleN], lines[*idleN:*idleN+*matchN], lines[*idleN+*matchN:]

	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	var clients []net.Conn
	defer func() {
		closeAll(clients)
		cancel()
		waitBounded(&runs, 10*time.Second)
	}()
	base, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	baseM, err := scrape(ctx, *metricsAddr)
	if err != nil {
		return err
	}

	// The idle hosts, measured as the first registration figure (table 0..N).
	t0 := time.Now()
	hosts, err := startHosts(ctx, &runs, *brokerURL, pool, idleLines, *perHost, *par, (*idleHost).accept)
	if err != nil {
		return err
	}
	s1, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	fmt.Println(opFigure{phase: "hosts", level: 0, ops: int64(len(hosts)), secs: time.Since(t0).Seconds(),
		cpuUS: s1.cpuMicros() - base.cpuMicros()}.line())

	// The match-churn hosts and their route credentials (not measured).
	mhosts, err := startHosts(ctx, &runs, *brokerURL, pool, matchLines, *perHost, *par, closingHost)
	if err != nil {
		return err
	}
	creds := make([]client.Config, len(mhosts))
	for i, h := range mhosts {
		rc, err := routeFor(ctx, h, i)
		if err != nil {
			return fmt.Errorf("match host %d: %w", i, err)
		}
		creds[i] = rc.config(pool)
	}

	// The idle baseline with the hosts alone, for the first fill.
	time.Sleep(*settle)
	prevIdle, _, err := idleCPU(roots, *baseline)
	if err != nil {
		return err
	}

	streams := 0
	for _, level := range levels {
		// Fill the stream table to level: each stream a bootstrap the host
		// publishes and a client match on it (two state changes).
		var jobs []*idleHost
		for i := streams; i < level; i++ {
			jobs = append(jobs, hosts[i / *perHost])
		}
		f0, err := sampleProcs(roots)
		if err != nil {
			return err
		}
		t := time.Now()
		opened, retries, err := openIdleStreams(ctx, pool, jobs, *par)
		clients = append(clients, opened...)
		last := level == levels[len(levels)-1]
		if err != nil {
			// A loaded machine may fail a fill after thousands of opens:
			// measure at the size reached, and go no further.
			if len(opened) == 0 {
				return err
			}
			fmt.Fprintf(os.Stderr, "loadgen reach-scale: the fill to %d stopped at %d streams: %v\n", level, streams+len(opened), err)
			level, last = streams+len(opened), true
			jobs = jobs[:len(opened)]
		}
		f1, err := sampleProcs(roots)
		if err != nil {
			return err
		}
		fill := opFigure{phase: "fill", level: level, ops: int64(len(jobs)), retries: retries, secs: time.Since(t).Seconds(),
			cpuUS: f1.cpuMicros() - f0.cpuMicros()}
		streams = level

		if last {
			time.Sleep(*settle)
			now, err := sampleProcs(roots)
			if err != nil {
				return err
			}
			m, err := scrape(ctx, *metricsAddr)
			if err != nil {
				return err
			}
			// What the broker itself holds: streams it closed (its 5 min
			// idle timeout, a host lost to a missed pong) show here.
			held, err := scrapeMetrics(ctx, *metricsAddr, "securelink_broker_hosts_online", "securelink_broker_streams_active")
			if err != nil {
				return err
			}
			sockets := len(hosts) + len(mhosts) + streams
			fmt.Printf("phase=idle level=%d hosts=%d streams=%d sockets=%d broker_hosts=%.0f broker_streams=%.0f rss_base_kib=%d rss_kib=%d kib_per_socket=%.1f goroutines_base=%.0f goroutines=%.0f goroutines_per_socket=%.2f fds=%.0f\n",
				level, len(hosts)+len(mhosts), streams, sockets, held[0], held[1], base.rssKiB, now.rssKiB,
				perSocket(float64(base.rssKiB), float64(now.rssKiB), sockets),
				baseM.goroutines, m.goroutines, perSocket(baseM.goroutines, m.goroutines, sockets), m.fds)
		}

		// The idle baseline at this table size: keepalive only.
		time.Sleep(*settle)
		idle, _, err := idleCPU(roots, *baseline)
		if err != nil {
			return err
		}
		fmt.Printf("phase=baseline level=%d secs=%.2f idle_us_per_s=%.0f core_pct=%.2f\n", level, baseline.Seconds(), idle, idle/1e4)
		// The table grew during the fill: its baseline is between the two.
		fill.idleUS = (prevIdle + idle) / 2
		prevIdle = idle
		fmt.Println(fill.line())

		// Registration churn at this table size.
		// (The loop's byte count carries the reconnects.)
		res, err := w.loop(*workers, func(i int) (int64, error) {
			return regChurn(ctx, *brokerURL, pool, regLines[i])
		})
		if err != nil {
			return err
		}
		reg := opFigure{phase: "register", level: level, ops: res.ok, errors: res.fail, retries: res.bytes, secs: res.secs, cpuUS: res.cpu, err: res.lastErr}

		// Match churn: a client stream opened with a route credential and
		// closed again; worker i uses the hosts i, i+workers, ... in turn.
		var turn [maxChurnWorkers]int
		res, err = w.loop(*workers, func(i int) (int64, error) {
			k := i + turn[i]**workers
			if k >= len(creds) {
				turn[i], k = 0, i
			}
			turn[i]++
			dctx, dcancel := context.WithTimeout(ctx, dialTimeout)
			defer dcancel()
			c, err := client.Dial(dctx, creds[k])
			if err != nil {
				return 0, err
			}
			return 0, c.Close()
		})
		if err != nil {
			return err
		}
		match := opFigure{phase: "match", level: level, ops: res.ok, errors: res.fail, secs: res.secs, cpuUS: res.cpu, err: res.lastErr}
		// A second baseline after the churn; the lower of the two is the
		// keepalive (the other may hold a GC cycle or a journal compaction).
		after, _, err := idleCPU(roots, *baseline)
		if err != nil {
			return err
		}
		fmt.Printf("phase=baseline_after level=%d secs=%.2f idle_us_per_s=%.0f core_pct=%.2f\n", level, baseline.Seconds(), after, after/1e4)
		reg.idleUS, match.idleUS = min(idle, after), min(idle, after)
		fmt.Println(reg.line())
		fmt.Println(match.line())
		if last {
			break
		}
	}

	if *keepalive > 0 {
		time.Sleep(*settle)
		rate, end, err := idleCPU(roots, *keepalive)
		if err != nil {
			return err
		}
		fmt.Printf("phase=keepalive level=%d sockets=%d secs=%.1f cpu_us=%.0f core_pct=%.2f rss_kib=%d\n",
			streams, len(hosts)+len(mhosts)+streams, keepalive.Seconds(), rate*keepalive.Seconds(), rate/1e4, end.rssKiB)
	}
	return nil
}

// The load and the verdict of `make soak` (bench/soak.sh starts the
// processes): steady traffic of every kind the front carries, for a bounded
// time, while the daemons' resident memory, descriptors and goroutines are
// read from their metrics listeners. The run fails on any client error or
// on growth after warm-up (see growthRule).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Bounds of the soak subcommand.
const (
	maxSoak         = 24 * time.Hour
	maxMetricsBody  = 4 << 20
	soakWSMessage   = 256
	soakWSPause     = 100 * time.Millisecond // per /relay/ws connection between echoes
	soakAPIPause    = 10 * time.Millisecond  // per /api worker between requests
	soakReachPause  = 20 * time.Millisecond  // per Reach stream between requests
	soakRetryPause  = time.Second            // after a client error, before reconnecting
	soakRequestWait = 30 * time.Second       // one request or echo, end to end
	sseInterval     = 200 * time.Millisecond // the fake upstream's SSE tick
	maxSSEStream    = 48 * time.Hour
)

// ---------------------------------------------------------------- counters

// soakStats are the client side's counters; every error is counted by
// kind with its first message (never a token: URLs and errors here carry
// none).
type soakStats struct {
	wsEchoes, apiReqs, sseEvents, reachReqs atomic.Int64
	reachDials                              atomic.Int64

	mu       sync.Mutex
	errs     map[string]int64
	firstErr map[string]string
}

func newSoakStats() *soakStats {
	return &soakStats{errs: map[string]int64{}, firstErr: map[string]string{}}
}

func (s *soakStats) fail(kind string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs[kind]++
	if _, ok := s.firstErr[kind]; !ok {
		s.firstErr[kind] = err.Error()
	}
}

func (s *soakStats) errorCount() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, v := range s.errs {
		n += v
	}
	return n
}

// ---------------------------------------------------------------- workers

// soakLoop runs one client until ctx ends: step runs the client's session
// (connect, then traffic until an error); an error is counted and the
// client reconnects after a pause, so the load stays on.
func soakLoop(ctx context.Context, wg *sync.WaitGroup, st *soakStats, kind string, session func(context.Context) error) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := session(ctx)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				err = errors.New("session ended")
			}
			st.fail(kind, err)
			select {
			case <-ctx.Done():
			case <-time.After(soakRetryPause):
			}
		}
	}()
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// wsSession is one /relay/ws client: auth, then paced echoes, each checked.
func wsSession(ctx context.Context, url string, cfgPin string, id int, st *soakStats, ready *sync.WaitGroup) error {
	cfg, err := clientTLS(cfgPin, []string{"http/1.1"})
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, soakRequestWait)
	c, err := dialWS(dctx, url, cfg)
	if err == nil {
		err = relayAuth(dctx, c, id)
	}
	cancel()
	if ready != nil {
		ready.Done()
	}
	if err != nil {
		if c != nil {
			c.CloseNow()
		}
		return err
	}
	defer c.CloseNow()
	msg := echoPayload(soakWSMessage)
	buf := make([]byte, 0, soakWSMessage+64)
	for sleepCtx(ctx, soakWSPause) {
		rctx, cancel := context.WithTimeout(ctx, soakRequestWait)
		err := c.Write(rctx, websocket.MessageText, msg)
		var rd io.Reader
		if err == nil {
			_, rd, err = c.Reader(rctx)
		}
		if err == nil {
			buf, err = readAllBounded(rd, buf[:0], maxMessage)
		}
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if !bytes.Equal(buf, msg) {
			return fmt.Errorf("echo of %d bytes differs from the %d sent", len(buf), len(msg))
		}
		st.wsEchoes.Add(1)
	}
	c.Close(websocket.StatusNormalClosure, "")
	return nil
}

// getSmall is one GET of the fake upstream's 100-byte body, checked.
func getSmall(ctx context.Context, cl *http.Client, url string) error {
	rctx, cancel := context.WithTimeout(ctx, soakRequestWait)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || n != smallBodySize {
		return fmt.Errorf("GET: HTTP %d, %d bytes (want 200, %d)", resp.StatusCode, n, smallBodySize)
	}
	return nil
}

// requestSession sends paced GETs on one client until an error.
func requestSession(cl *http.Client, url string, pause time.Duration, count *atomic.Int64) func(context.Context) error {
	return func(ctx context.Context) error {
		for sleepCtx(ctx, pause) {
			if err := getSmall(ctx, cl, url); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			count.Add(1)
		}
		return nil
	}
}

// sseSession reads the event stream and checks the events arrive in order.
func sseSession(cl *http.Client, url string, st *soakStats) func(context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Accept", "text/event-stream")
		resp, err := cl.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			return fmt.Errorf("SSE: HTTP %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		// An event stalled for this long means the stream is stuck.
		stall := time.AfterFunc(soakRequestWait, func() { resp.Body.Close() })
		defer stall.Stop()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 4096), 64<<10)
		want := 1
		for sc.Scan() {
			line := sc.Text()
			v, ok := strings.CutPrefix(line, "id: ")
			if !ok {
				continue
			}
			if n, err := strconv.Atoi(v); err != nil || n != want {
				return fmt.Errorf("SSE: event id %q, want %d", v, want)
			}
			want++
			st.sseEvents.Add(1)
			stall.Reset(soakRequestWait)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("SSE after %d events: %w", want-1, err)
		}
		return fmt.Errorf("SSE stream ended after %d events", want-1)
	}
}

// ---------------------------------------------------------------- metrics

// daemonSample is what a daemon's /metrics says about its process.
type daemonSample struct {
	rss, fds, goroutines float64
}

// scrape reads the three process series from a metrics listener (the
// Prometheus Go and process collectors every daemon registers).
func scrape(ctx context.Context, addr string) (daemonSample, error) {
	var s daemonSample
	v, err := scrapeMetrics(ctx, addr, "process_resident_memory_bytes", "process_open_fds", "go_goroutines")
	if err != nil {
		return s, err
	}
	s.rss, s.fds, s.goroutines = v[0], v[1], v[2]
	return s, nil
}

// scrapeMetrics reads the named unlabelled series from a metrics listener;
// every one must be there.
func scrapeMetrics(ctx context.Context, addr string, names ...string) ([]float64, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: HTTP %d", resp.StatusCode)
	}
	want := map[string]int{}
	for i, n := range names {
		want[n] = i
	}
	out := make([]float64, len(names))
	found := 0
	sc := bufio.NewScanner(io.LimitReader(resp.Body, maxMetricsBody))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if i, hit := want[name]; ok && hit {
			v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %q is not a number", name, val)
			}
			out[i] = v
			delete(want, name)
			found++
		}
	}
	if found != len(names) {
		return nil, fmt.Errorf("/metrics on %s lacks %s", addr, strings.Join(names, ", "))
	}
	return out, sc.Err()
}

// growthRule is the verdict: after warm-up (the first quarter of the
// samples), the median of the last quarter may exceed the warm-up median
// by at most pct percent plus slack (absolute, in the series' unit). A
// median ignores one-off GC and scheduling spikes; a leak moves it.
type growthRule struct {
	name  string
	pct   float64
	slack float64
	unit  float64 // divisor for printing (1 or MiB)
}

var soakRules = []growthRule{
	{"rss_mib", 25, 16 << 20, 1 << 20},
	{"fds", 10, 16, 1},
	{"goroutines", 10, 32, 1},
}

func (r growthRule) value(s daemonSample) float64 {
	switch r.name {
	case "rss_mib":
		return s.rss
	case "fds":
		return s.fds
	default:
		return s.goroutines
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// verdict applies the rule to the samples; it returns the lines to print
// and whether the rule held.
func (r growthRule) verdict(samples []daemonSample) (warm, last, limit float64, ok bool) {
	q := len(samples) / 4
	if q < 1 {
		q = 1
	}
	var a, b []float64
	for _, s := range samples[:q] {
		a = append(a, r.value(s))
	}
	for _, s := range samples[len(samples)-q:] {
		b = append(b, r.value(s))
	}
	warm, last = median(a), median(b)
	limit = warm*(1+r.pct/100) + r.slack
	return warm, last, limit, last <= limit
}

// ---------------------------------------------------------------- command

func cmdSoak(args []string) error {
	fs := flag.NewFlagSet("soak", flag.ExitOnError)
	addr := fs.String("addr", "", "the front's host:port")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the front")
	frontMetrics := fs.String("metrics", "", "the front's metrics.listen host:port")
	brokerMetrics := fs.String("broker-metrics", "", "the broker's metrics.listen host:port (optional)")
	creds := fs.String("reach", "", "route credential files, comma-separated (each carries 4 streams)")
	caFile := fs.String("ca-file", "", "the broker's certificate (with -reach)")
	dur := fs.Duration("duration", 10*time.Minute, "soak length after all clients connected")
	interval := fs.Duration("interval", 5*time.Second, "sampling interval")
	wsConns := fs.Int("ws", 100, "/relay/ws connections")
	apiWorkers := fs.Int("api", 4, "concurrent /api request loops (one HTTP/2 connection)")
	reachStreams := fs.Int("reach-streams", 16, "Reach streams (request loops through the broker)")
	fs.Parse(args)
	if err := loopbackOnly(*addr); err != nil {
		return err
	}
	if err := loopbackOnly(*frontMetrics); err != nil {
		return fmt.Errorf("-metrics: %w", err)
	}
	if *brokerMetrics != "" {
		if err := loopbackOnly(*brokerMetrics); err != nil {
			return fmt.Errorf("-broker-metrics: %w", err)
		}
	}
	if *dur <= 0 || *dur > maxSoak || *interval < time.Second || *interval > *dur ||
		*wsConns < 0 || *wsConns > maxConns || *apiWorkers < 0 || *apiWorkers > 256 || *reachStreams < 0 || *reachStreams > 64 {
		return errors.New("bad -duration/-interval/-ws/-api/-reach-streams")
	}
	var dialers []*frontDialer
	for _, p := range strings.Split(*creds, ",") {
		if p = strings.TrimSpace(p); p != "" {
			d, err := newFrontDialer(*addr, *pin, p, *caFile)
			if err != nil {
				return err
			}
			dialers = append(dialers, d)
		}
	}
	if *reachStreams > 0 && len(dialers) == 0 {
		return errors.New("-reach-streams needs -reach credential files")
	}
	if _, err := scrape(context.Background(), *frontMetrics); err != nil {
		return err
	}

	st := newSoakStats()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	base := "https://" + *addr

	// /relay/ws: all connected (or failed) before the clock starts.
	var ready sync.WaitGroup
	ready.Add(*wsConns)
	for i := 0; i < *wsConns; i++ {
		id := i + 1
		first := &ready
		soakLoop(ctx, &wg, st, "relay_ws", func(ctx context.Context) error {
			r := first
			first = nil
			return wsSession(ctx, "wss://"+*addr+"/relay/ws", *pin, id, st, r)
		})
	}
	// /api over one HTTP/2 connection, the SSE stream over HTTP/1.1.
	h2cfg, err := clientTLS(*pin, []string{"h2", "http/1.1"})
	if err != nil {
		return err
	}
	apiTr := &http.Transport{TLSClientConfig: h2cfg, ForceAttemptHTTP2: true, DisableCompression: true}
	defer apiTr.CloseIdleConnections()
	apiCl := &http.Client{Transport: apiTr}
	for i := 0; i < *apiWorkers; i++ {
		soakLoop(ctx, &wg, st, "api", requestSession(apiCl, base+"/api/small", soakAPIPause, &st.apiReqs))
	}
	h1cfg, err := clientTLS(*pin, []string{"http/1.1"})
	if err != nil {
		return err
	}
	sseTr := &http.Transport{TLSClientConfig: h1cfg, DisableCompression: true}
	defer sseTr.CloseIdleConnections()
	soakLoop(ctx, &wg, st, "sse", sseSession(&http.Client{Transport: sseTr}, base+"/api/sse", st))
	// Reach: each stream is one keep-alive connection through the broker.
	for i := 0; i < *reachStreams; i++ {
		d := dialers[i%len(dialers)]
		tr := &http.Transport{
			DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				st.reachDials.Add(1)
				return d.dial(ctx)
			},
			MaxConnsPerHost: 1, DisableCompression: true,
		}
		defer tr.CloseIdleConnections()
		soakLoop(ctx, &wg, st, "reach", requestSession(&http.Client{Transport: tr}, base+"/api/small", soakReachPause, &st.reachReqs))
	}
	ready.Wait()
	if n := st.errorCount(); n > 0 {
		cancel()
		waitBounded(&wg, 10*time.Second)
		return fmt.Errorf("clients failed while connecting: %s", st.describeErrors())
	}

	fmt.Printf("soak: %v, sample every %v; %d /relay/ws, %d /api loops (h2), 1 SSE, %d Reach streams over %d route credentials\n",
		*dur, *interval, *wsConns, *apiWorkers, *reachStreams, len(dialers))
	fmt.Printf("%6s %9s %6s %6s %10s %7s %7s | %9s %9s %9s %9s %6s\n",
		"t_s", "rss_mib", "fds", "gor", "broker_mib", "b_fds", "b_gor", "ws_msg/s", "api_req/s", "sse_ev", "reach/s", "errors")
	var front, broker []daemonSample
	t0 := time.Now()
	prev := [3]int64{}
	prevT := t0
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	var sampleErr error
	for time.Since(t0) < *dur {
		<-tick.C
		now := time.Now()
		f, err := scrape(ctx, *frontMetrics)
		if err != nil {
			sampleErr = fmt.Errorf("front metrics: %w", err)
			break
		}
		front = append(front, f)
		b := daemonSample{}
		if *brokerMetrics != "" {
			if b, err = scrape(ctx, *brokerMetrics); err != nil {
				sampleErr = fmt.Errorf("broker metrics: %w", err)
				break
			}
			broker = append(broker, b)
		}
		cur := [3]int64{st.wsEchoes.Load(), st.apiReqs.Load(), st.reachReqs.Load()}
		secs := now.Sub(prevT).Seconds()
		rate := func(i int) float64 { return float64(cur[i]-prev[i]) / secs }
		fmt.Printf("%6.0f %9.1f %6.0f %6.0f %10.1f %7.0f %7.0f | %9.0f %9.0f %9d %9.0f %6d\n",
			now.Sub(t0).Seconds(), f.rss/(1<<20), f.fds, f.goroutines, b.rss/(1<<20), b.fds, b.goroutines,
			rate(0), rate(1), st.sseEvents.Load(), rate(2), st.errorCount())
		prev, prevT = cur, now
	}
	cancel()
	waitBounded(&wg, 15*time.Second)

	failed := false
	fmt.Println()
	if sampleErr != nil {
		fmt.Printf("FAIL sampling: %v\n", sampleErr)
		failed = true
	}
	if len(front) < 4 {
		fmt.Printf("FAIL: %d samples; the rule needs at least 4 (raise -duration or lower -interval)\n", len(front))
		failed = true
	} else {
		fmt.Println("growth rule: median of the last quarter <= median of the first quarter (warm-up) * (1 + pct) + slack")
		fmt.Printf("%-8s %-11s %10s %10s %10s %6s %8s  %s\n", "daemon", "series", "warm-up", "last", "limit", "pct", "slack", "verdict")
		for _, d := range []struct {
			name    string
			samples []daemonSample
		}{{"front", front}, {"broker", broker}} {
			if len(d.samples) == 0 {
				continue
			}
			for _, r := range soakRules {
				warm, last, limit, ok := r.verdict(d.samples)
				v := "ok"
				if !ok {
					v = "GROWTH"
					failed = true
				}
				fmt.Printf("%-8s %-11s %10.1f %10.1f %10.1f %5.0f%% %8.0f  %s\n", d.name, r.name, warm/r.unit, last/r.unit, limit/r.unit, r.pct, r.slack/r.unit, v)
			}
		}
	}
	fmt.Printf("clients: %d /relay/ws echoes, %d /api requests, %d SSE events, %d Reach requests over %d broker dials (%d streams)\n",
		st.wsEchoes.Load(), st.apiReqs.Load(), st.sseEvents.Load(), st.reachReqs.Load(), st.reachDials.Load(), *reachStreams)
	if n := st.errorCount(); n > 0 {
		fmt.Printf("FAIL: %d client errors: %s\n", n, st.describeErrors())
		failed = true
	}
	if st.reachDials.Load() > int64(*reachStreams) {
		fmt.Printf("FAIL: %d broker dials for %d Reach streams: a stream was cut and redialled\n", st.reachDials.Load(), *reachStreams)
		failed = true
	}
	if failed {
		fmt.Println("soak: FAIL")
		os.Exit(1)
	}
	fmt.Println("soak: ok")
	return nil
}

func (s *soakStats) describeErrors() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	kinds := make([]string, 0, len(s.errs))
	for k := range s.errs {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, "%s=%d (first: %s); ", k, s.errs[k], s.firstErr[k])
	}
	return strings.TrimSuffix(b.String(), "; ")
}

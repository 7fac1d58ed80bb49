// Command loadgen is the measuring half of `make bench`: a fast loopback
// upstream that looks like the Hermes services to both fronts under test, and
// the load generators wrk cannot be (fresh TLS handshakes, WebSocket echo and
// idle WebSockets). bench/run.sh starts every process and prints the table;
// this tool only measures and prints `key=value` lines for the script.
//
// Server CPU is read from /proc (utime+stime of the server process and all
// its descendants, e.g. nginx master + worker) at the edges of the measured
// window, so connection set-up and warm-up are not counted.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// Bounds that keep every loop and buffer of the tool finite.
const (
	maxConns      = 20000   // per run, WebSocket or handshake workers
	maxSamples    = 5000000 // RTT samples kept (one connection cannot exceed this in minutes)
	maxDuration   = 10 * time.Minute
	maxMessage    = 1 << 20 // upstream and client read limit per WebSocket message
	smallBodySize = 100
	bigBodySize   = 8 << 20
	dialTimeout   = 10 * time.Second
	clkTck        = 100 // USER_HZ on Linux; /proc/<pid>/stat times are in these ticks
)

// command is one subcommand: its name, its usage lines and its entry point.
type command struct {
	name, usage string
	run         func(args []string) error
}

// commands is a function, not a variable: usage refers to it, and main's
// dispatch refers to usage.
func commands() []command {
	return []command{
		{"upstream", "-listen ADDR            fake Relay/API upstream: /small /big /sink /health /ws", cmdUpstream},
		{"proc", "-pids P[,P]             print cpu_us and rss_kib of the processes and descendants", cmdProc},
		{"freeports", "-n N                    print N free loopback TCP ports", cmdFreePorts},
		{"waitport", "-addr ADDR -timeout D   wait until ADDR accepts TCP", cmdWaitPort},
		{"get", "-url HTTPS -pin PIN     one pinned GET: print status and body length", cmdGet},
		{"handshakes", "-addr ADDR -pin PIN     fresh TLS handshakes per second", cmdHandshakes},
		{"h3", "-url HTTPS -pin PIN -conns N -size B   GET loop over HTTP/3 (QUIC): rate, MB/s, server CPU", cmdH3},
		{"h3get", "-url HTTPS -pin PIN     one pinned GET over HTTP/3: print status and body length", cmdH3Get},
		{"echo", "-url WSS -pin PIN       WebSocket echo round trips\n" +
			"             (-reach CRED -ca-file PEM: the WebSocket goes through the broker)", cmdEcho},
		{"idle", "-url WSS -pin PIN       RSS increase for idle WebSockets", cmdIdle},
		{"xfer", "-mode download|upload -addr ADDR -pin PIN [-reach CRED -ca-file PEM]\n" +
			"                                     single-stream MB/s, direct or through a broker", cmdXfer},
		{"reach-route", "-admin SOCK -addr ADDR -pin PIN -ca-file PEM -out CRED\n" +
			"                                     bootstrap -> /relay/ws via broker -> route credential", cmdReachRoute},
		{"soak", "-addr ADDR -pin PIN -metrics ADDR [-broker-metrics ADDR -reach CRED,... -ca-file PEM]\n" +
			"                                     steady mixed load; fails on client errors or resource growth", cmdSoak},
		{"reach-idle", "-broker-url WSS -ca-file PEM -hosts JSONL -pids BROKER\n" +
			"                                     broker RSS per idle host and per idle stream", cmdReachIdle},
	}
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	for _, c := range commands() {
		if c.name != os.Args[1] {
			continue
		}
		if err := c.run(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "loadgen %s: %v\n", c.name, err)
			os.Exit(1)
		}
		return
	}
	usage()
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: loadgen <command> [flags]")
	for _, c := range commands() {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", c.name, c.usage)
	}
	os.Exit(2)
}

// ---------------------------------------------------------------- upstream

func cmdUpstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:18767", "loopback address to listen on")
	fs.Parse(args)
	if err := loopbackOnly(*listen); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: upstreamHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute}
	go func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
		srv.Close()
	}()
	fmt.Printf("upstream listening %s\n", ln.Addr())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// upstreamHandler serves the routes both fronts forward to: /small and /big
// for the HTTP figures (fixed Content-Length, bodies built once), /sse for
// the soak's event stream,
// /health and /api/health for the front's availability probes, /ws for the
// Relay bridge.
func upstreamHandler() http.Handler {
	small := bytes.Repeat([]byte("s"), smallBodySize)
	big := bytes.Repeat([]byte("b"), bigBodySize)
	// Shared header values: net/http only reads them.
	textPlain, octets := []string{"text/plain"}, []string{"application/octet-stream"}
	smallLen, bigLen := []string{strconv.Itoa(len(small))}, []string{strconv.Itoa(len(big))}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Content-Type"], h["Content-Length"] = textPlain, smallLen
		w.Write(small)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Content-Type"], h["Content-Length"] = octets, bigLen
		w.Write(big)
	})
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok","version":"bench"}`)
	})
	// The Dashboard's health, with its login gate on, so the front's prober
	// sees the same upstream as available and stays quiet in the logs.
	mux.HandleFunc("/api/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok","auth_required":true}`)
	})
	mux.HandleFunc("/sink", serveSink)
	mux.HandleFunc("/ws", serveRelayWS)
	mux.HandleFunc("/sse", serveSSE)
	return mux
}

// maxSinkBody bounds one upload; the front allows 16 MiB per request.
const maxSinkBody = 64 << 20

// serveSink is the upload figure's target: it reads the body to the end
// (bounded) and answers with the byte count, so the client can check that
// every byte it sent arrived.
func serveSink(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost && r.Method != http.MethodPut {
		w.Header().Set("Allow", "POST, PUT")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	buf := sinkBufs.Get().(*[]byte)
	defer sinkBufs.Put(buf)
	var n int64
	body := io.LimitReader(r.Body, maxSinkBody+1)
	for {
		m, err := body.Read(*buf)
		n += int64(m)
		if err == io.EOF {
			break
		}
		if err != nil {
			http.Error(w, "read error", http.StatusBadRequest)
			return
		}
	}
	if n > maxSinkBody {
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, strconv.FormatInt(n, 10))
}

var sinkBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// serveRelayWS mimics the Relay's first-frame protocol: the first message must
// be a system/auth frame, answered with auth.ok and the session "s-<id>"
// (any token is accepted: authentication is not what is measured);
// everything after is echoed with its own message type.
func serveRelayWS(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		InsecureSkipVerify: true, // the front and nginx do not forward a browser Origin
		CompressionMode:    websocket.CompressionDisabled,
	})
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(maxMessage)
	ctx := r.Context()
	typ, first, err := c.Read(ctx)
	if err != nil {
		return
	}
	id, ok := parseAuthFrame(first)
	if !ok {
		c.Write(ctx, websocket.MessageText, []byte(`{"channel":"system","type":"auth.fail","payload":{"reason":"bad auth frame"}}`))
		c.Close(4001, "auth failed")
		return
	}
	// One session per auth id, as the Relay issues one per login: the Reach
	// connector keys route credentials by session.
	reply := fmt.Sprintf(`{"channel":"system","type":"auth.ok","id":%s,"payload":{"session_token":%s,"expires_at":null}}`, strconv.Quote(id), strconv.Quote("s-"+id))
	if err := c.Write(ctx, typ, []byte(reply)); err != nil {
		return
	}
	buf := make([]byte, 0, 4096)
	for {
		typ, rd, err := c.Reader(ctx)
		if err != nil {
			return
		}
		buf, err = readAllBounded(rd, buf[:0], maxMessage)
		if err != nil {
			return
		}
		if err := c.Write(ctx, typ, buf); err != nil {
			return
		}
	}
}

// parseAuthFrame is deliberately a substring check, not a JSON parse: the fake
// Relay must stay cheap so the upstream's CPU does not shape the result.
func parseAuthFrame(b []byte) (id string, ok bool) {
	if !bytes.Contains(b, []byte(`"type":"auth"`)) || !bytes.Contains(b, []byte(`"channel":"system"`)) {
		return "", false
	}
	const key = `"id":"`
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return "", true
	}
	rest := b[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 || j > 64 {
		return "", true
	}
	return string(rest[:j]), true
}

func readAllBounded(r io.Reader, buf []byte, limit int) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= limit {
				return buf, errors.New("message too large")
			}
			nb := make([]byte, len(buf), min(2*cap(buf)+512, limit))
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// ---------------------------------------------------------------- /proc

// procSample is CPU and resident memory of a process tree at one instant.
type procSample struct {
	cpuTicks uint64 // utime+stime, clock ticks, summed over the tree
	rssKiB   uint64 // VmRSS summed over the tree
	n        int    // processes found
}

func (p procSample) cpuMicros() float64 { return float64(p.cpuTicks) * 1e6 / clkTck }

func parsePIDs(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad pid %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// statFields returns the fields after the command name of /proc/<pid>/stat
// (the name may hold spaces and parentheses, so split after the last ')').
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, errors.New("malformed stat")
	}
	return strings.Fields(string(b[i+1:])), nil
}

// tree returns roots plus every live descendant (nginx workers are children
// of the master).
func tree(roots []int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := statFields(pid)
		if err != nil || len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		children[ppid] = append(children[ppid], pid)
	}
	seen := map[int]bool{}
	var out []int
	queue := append([]int(nil), roots...)
	for len(queue) > 0 && len(out) < 4096 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		out = append(out, p)
		queue = append(queue, children[p]...)
	}
	return out
}

func sampleProcs(roots []int) (procSample, error) {
	var s procSample
	for _, pid := range tree(roots) {
		f, err := statFields(pid)
		if err != nil {
			continue // exited between listing and reading
		}
		// After ')': state(0) ppid(1) ... utime(11) stime(12).
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseUint(f[11], 10, 64)
		st, _ := strconv.ParseUint(f[12], 10, 64)
		s.cpuTicks += ut + st
		s.rssKiB += vmRSS(pid)
		s.n++
	}
	if s.n == 0 {
		return s, fmt.Errorf("no live process among %v", roots)
	}
	return s, nil
}

func vmRSS(pid int) uint64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "VmRSS:") {
			fs := strings.Fields(line)
			if len(fs) >= 2 {
				v, _ := strconv.ParseUint(fs[1], 10, 64)
				return v
			}
		}
	}
	return 0
}

func cmdProc(args []string) error {
	fs := flag.NewFlagSet("proc", flag.ExitOnError)
	pids := fs.String("pids", "", "comma-separated root pids")
	fs.Parse(args)
	roots, err := parsePIDs(*pids)
	if err != nil || len(roots) == 0 {
		return fmt.Errorf("need -pids: %v", err)
	}
	s, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	fmt.Printf("cpu_us=%.0f rss_kib=%d procs=%d\n", s.cpuMicros(), s.rssKiB, s.n)
	return nil
}

// cpuMeter brackets a measured window; a nil meter measures nothing.
type cpuMeter struct {
	roots []int
	start procSample
}

// window is the measured-run flags handshakes, echo and xfer share: an
// unmeasured warm-up, then a measured duration with the server's CPU read
// at its edges.
type window struct {
	dur, warm time.Duration
	pids      string
}

func (w *window) flags(fs *flag.FlagSet, warmup time.Duration, pidsUsage string) {
	fs.DurationVar(&w.dur, "duration", 10*time.Second, "measured window")
	fs.DurationVar(&w.warm, "warmup", warmup, "unmeasured warm-up")
	fs.StringVar(&w.pids, "pids", "", pidsUsage)
}

// meter checks the window's bounds and opens the CPU meter on its pids.
func (w *window) meter() (*cpuMeter, error) {
	if w.dur <= 0 || w.dur > maxDuration || w.warm < 0 || w.warm > maxDuration {
		return nil, errors.New("bad -duration/-warmup")
	}
	return newCPUMeter(w.pids)
}

// loopResult is what window.loop counted inside the measured window.
type loopResult struct {
	ok, fail, bytes int64
	secs, cpu       float64 // measured seconds, server CPU µs
	lastErr         string
}

// loop runs workers goroutines, each calling op back to back, through the
// warm-up and the measured window; only operations that end inside the
// window count (op returns the bytes it moved).
func (w *window) loop(workers int, op func(worker int) (int64, error)) (loopResult, error) {
	var res loopResult
	meter, err := w.meter()
	if err != nil {
		return res, err
	}
	var (
		counting         atomic.Bool
		ok, fail, nbytes atomic.Int64
		lastErr          atomic.Value
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, err := op(i)
				if !counting.Load() {
					continue
				}
				if err != nil {
					fail.Add(1)
					lastErr.Store(err.Error())
					continue
				}
				ok.Add(1)
				nbytes.Add(n)
			}
		}()
	}
	time.Sleep(w.warm)
	if err := meter.begin(); err != nil {
		close(stop)
		wg.Wait()
		return res, err
	}
	counting.Store(true)
	t0 := time.Now()
	time.Sleep(w.dur)
	counting.Store(false)
	res.secs = time.Since(t0).Seconds()
	res.cpu, err = meter.end()
	close(stop)
	wg.Wait()
	res.ok, res.fail, res.bytes = ok.Load(), fail.Load(), nbytes.Load()
	res.lastErr, _ = lastErr.Load().(string)
	return res, err
}

func newCPUMeter(pids string) (*cpuMeter, error) {
	if pids == "" {
		return nil, nil
	}
	roots, err := parsePIDs(pids)
	if err != nil {
		return nil, err
	}
	return &cpuMeter{roots: roots}, nil
}

func (m *cpuMeter) begin() error {
	if m == nil {
		return nil
	}
	s, err := sampleProcs(m.roots)
	m.start = s
	return err
}

// end returns server CPU µs spent since begin.
func (m *cpuMeter) end() (float64, error) {
	if m == nil {
		return 0, nil
	}
	s, err := sampleProcs(m.roots)
	if err != nil {
		return 0, err
	}
	return s.cpuMicros() - m.start.cpuMicros(), nil
}

// ---------------------------------------------------------------- small helpers

func cmdFreePorts(args []string) error {
	fs := flag.NewFlagSet("freeports", flag.ExitOnError)
	n := fs.Int("n", 1, "how many ports")
	fs.Parse(args)
	if *n < 1 || *n > 16 {
		return errors.New("-n must be 1..16")
	}
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var ports []string
	for i := 0; i < *n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		lns = append(lns, l)
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	fmt.Println(strings.Join(ports, " "))
	return nil
}

func cmdWaitPort(args []string) error {
	fs := flag.NewFlagSet("waitport", flag.ExitOnError)
	addr := fs.String("addr", "", "host:port")
	timeout := fs.Duration("timeout", 20*time.Second, "give up after")
	fs.Parse(args)
	if err := loopbackOnly(*addr); err != nil {
		return err
	}
	deadline := time.Now().Add(min(*timeout, maxDuration))
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", *addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not accepting after %v", *addr, *timeout)
}

// loopbackOnly refuses any target that is not a loopback IP literal: the bench
// must never send traffic off the machine.
// loopbackURL accepts only https:// URLs on a loopback IP address.
func loopbackURL(u string) error {
	rest, ok := strings.CutPrefix(u, "https://")
	if !ok {
		return errors.New("-url must be https://127.0.0.1:PORT/path")
	}
	hostport, _, _ := strings.Cut(rest, "/")
	return loopbackOnly(hostport)
}

func loopbackOnly(hostport string) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return err
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s: only loopback IP addresses are allowed", hostport)
	}
	return nil
}

// ---------------------------------------------------------------- TLS client

// clientTLS is the client side the issue prescribes: X25519 only, no session
// resumption (every handshake is a full one), and trust by pin, not by CA.
func clientTLS(pin string, alpn []string) (*tls.Config, error) {
	want, err := decodePin(pin)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:             tls.VersionTLS12,
		CurvePreferences:       []tls.CurveID{tls.X25519},
		SessionTicketsDisabled: true,
		ClientSessionCache:     nil,
		NextProtos:             alpn,
		InsecureSkipVerify:     true, // replaced by the pin check below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no peer certificate")
			}
			got := sha256.Sum256(cs.PeerCertificates[0].RawSubjectPublicKeyInfo)
			if got != want {
				return errors.New("spki pin mismatch")
			}
			return nil
		},
	}, nil
}

func decodePin(pin string) ([32]byte, error) {
	var out [32]byte
	b64, ok := strings.CutPrefix(pin, "sha256/")
	if !ok {
		return out, errors.New("pin must look like sha256/<base64>")
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != 32 {
		return out, errors.New("pin must hold 32 base64 bytes")
	}
	copy(out[:], raw)
	return out, nil
}

// cmdGet is the script's sanity check before each server is measured: a 421
// or 502 counted as a "request" by wrk would make a meaningless figure.
func cmdGet(args []string) error {
	fs := flag.NewFlagSet("get", flag.ExitOnError)
	url := fs.String("url", "", "https://127.0.0.1:PORT/path")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the server")
	fs.Parse(args)
	if err := loopbackURL(*url); err != nil {
		return err
	}
	cfg, err := clientTLS(*pin, []string{"http/1.1"})
	if err != nil {
		return err
	}
	cl := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableCompression: true}}
	resp, err := cl.Get(*url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	fmt.Printf("status=%d bytes=%d proto=%s\n", resp.StatusCode, n, resp.Proto)
	return nil
}

func cmdHandshakes(args []string) error {
	fs := flag.NewFlagSet("handshakes", flag.ExitOnError)
	addr := fs.String("addr", "", "server host:port")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the server")
	conns := fs.Int("conns", 16, "concurrent handshake loops")
	var win window
	win.flags(fs, time.Second, "server pids for CPU accounting")
	fs.Parse(args)
	if err := loopbackOnly(*addr); err != nil {
		return err
	}
	if *conns < 1 || *conns > maxConns {
		return errors.New("bad -conns")
	}
	cfg, err := clientTLS(*pin, []string{"http/1.1"})
	if err != nil {
		return err
	}
	var state atomic.Value
	res, err := win.loop(*conns, func(int) (int64, error) { return 0, oneHandshake(*addr, cfg, &state) })
	if err != nil {
		return err
	}
	n, secs, cpu := res.ok, res.secs, res.cpu
	if n == 0 {
		return fmt.Errorf("no handshake succeeded (%d failed; last: %v)", res.fail, res.lastErr)
	}
	st, _ := state.Load().(tls.ConnectionState)
	fmt.Printf("ops=%d fail=%d secs=%.2f rate=%.1f cpu_us=%.0f cpu_per_op_us=%.1f tls=%s cipher=%s curve=%s\n",
		n, res.fail, secs, float64(n)/secs, cpu, cpu/float64(n),
		strings.ReplaceAll(tls.VersionName(st.Version), " ", ""), tls.CipherSuiteName(st.CipherSuite), st.CurveID)
	return nil
}

func oneHandshake(addr string, cfg *tls.Config, state *atomic.Value) error {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	c := tls.Client(raw, cfg)
	err = c.HandshakeContext(ctx)
	if err == nil && state.Load() == nil {
		state.Store(c.ConnectionState())
	}
	c.Close() // sends close_notify, so the server ends the connection quietly
	return err
}

// ---------------------------------------------------------------- WebSocket

func dialWS(ctx context.Context, url string, cfg *tls.Config) (*websocket.Conn, error) {
	tr := &http.Transport{
		TLSClientConfig:     cfg,
		DisableCompression:  true,
		MaxIdleConnsPerHost: -1,
		TLSHandshakeTimeout: dialTimeout,
	}
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient:      &http.Client{Transport: tr, Timeout: dialTimeout},
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("%w (HTTP %d)", err, resp.StatusCode)
		}
		return nil, err
	}
	c.SetReadLimit(maxMessage)
	return c, nil
}

// relayAuth sends the Relay's first frame and waits for auth.ok, as a real
// client of /relay/ws does before it can exchange messages.
func relayAuth(ctx context.Context, c *websocket.Conn, id int) error {
	frame := fmt.Sprintf(`{"channel":"system","type":"auth","id":"%d","payload":{"session_token":"x"}}`, id)
	if err := c.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
		return err
	}
	_, b, err := c.Read(ctx)
	if err != nil {
		return err
	}
	if !bytes.Contains(b, []byte(`"type":"auth.ok"`)) {
		return fmt.Errorf("unexpected first reply %.80q", b)
	}
	return nil
}

func wsTarget(url string) error {
	rest, ok := strings.CutPrefix(url, "wss://")
	if !ok {
		return errors.New("-url must be wss://127.0.0.1:PORT/path")
	}
	hostport, _, _ := strings.Cut(rest, "/")
	return loopbackOnly(hostport)
}

// echoPayload is a Relay-shaped JSON text message of exactly size bytes.
func echoPayload(size int) []byte {
	head := `{"channel":"bench","type":"echo","id":"0","payload":{"data":"`
	tail := `"}}`
	pad := size - len(head) - len(tail)
	if pad < 0 {
		return bytes.Repeat([]byte("x"), size)
	}
	return []byte(head + strings.Repeat("x", pad) + tail)
}

func cmdEcho(args []string) error {
	fs := flag.NewFlagSet("echo", flag.ExitOnError)
	url := fs.String("url", "", "wss://127.0.0.1:PORT/relay/ws")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the server")
	conns := fs.Int("conns", 1, "connections, one message in flight each")
	size := fs.Int("size", 1024, "message size in bytes")
	var win window
	win.flags(fs, time.Second, "server pids for CPU accounting")
	credPath := fs.String("reach", "", "credential file: each connection is a broker stream")
	caFile := fs.String("ca-file", "", "the broker's certificate (with -reach)")
	watch := fs.String("watch", "", "more processes to report CPU of: name=pid[,name=pid]")
	fs.Parse(args)
	if err := wsTarget(*url); err != nil {
		return err
	}
	ws, err := parseWatch(*watch)
	if err != nil {
		return err
	}
	var viaBroker *frontDialer
	if *credPath != "" {
		addr, _, _ := strings.Cut(strings.TrimPrefix(*url, "wss://"), "/")
		if viaBroker, err = newFrontDialer(addr, *pin, *credPath, *caFile); err != nil {
			return err
		}
	}
	if *conns < 1 || *conns > maxConns || *size < 1 || *size > maxMessage {
		return errors.New("bad -conns/-size")
	}
	cfg, err := clientTLS(*pin, []string{"http/1.1"})
	if err != nil {
		return err
	}
	meter, err := win.meter()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), win.warm+win.dur+time.Minute)
	defer cancel()
	cs := make([]*websocket.Conn, 0, *conns)
	defer func() {
		for _, c := range cs {
			c.CloseNow()
		}
	}()
	for i := 0; i < *conns; i++ {
		var c *websocket.Conn
		if viaBroker != nil {
			c, err = dialWSVia(ctx, *url, viaBroker.dial)
		} else {
			c, err = dialWS(ctx, *url, cfg)
		}
		if err != nil {
			return fmt.Errorf("dial %d: %w", i, err)
		}
		cs = append(cs, c)
		if err := relayAuth(ctx, c, i+1); err != nil {
			return fmt.Errorf("auth %d: %w", i, err)
		}
	}
	msg := echoPayload(*size)
	var (
		counting atomic.Bool
		stopping atomic.Bool
		total    atomic.Int64
		mu       sync.Mutex
		samples  = make([]int64, 0, 1<<16)
		firstErr atomic.Value
	)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func(c *websocket.Conn) {
			defer wg.Done()
			local := make([]int64, 0, 1<<12)
			buf := make([]byte, 0, *size+64)
			flush := func() {
				mu.Lock()
				if len(samples)+len(local) <= maxSamples {
					samples = append(samples, local...)
				}
				mu.Unlock()
				local = local[:0]
			}
			defer flush()
			for !stopping.Load() {
				t0 := time.Now()
				if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				_, rd, err := c.Reader(ctx)
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				buf, err = readAllBounded(rd, buf[:0], maxMessage)
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				rtt := time.Since(t0)
				if len(buf) != len(msg) {
					firstErr.CompareAndSwap(nil, fmt.Sprintf("echo of %d bytes, sent %d", len(buf), len(msg)))
					return
				}
				if counting.Load() {
					total.Add(1)
					local = append(local, int64(rtt))
					if len(local) == cap(local) {
						flush()
					}
				}
			}
		}(c)
	}
	time.Sleep(win.warm)
	if err := meter.begin(); err != nil {
		stopping.Store(true)
		cancel()
		wg.Wait()
		return err
	}
	ws.begin()
	self0 := selfCPUMicros()
	counting.Store(true)
	t0 := time.Now()
	time.Sleep(win.dur)
	counting.Store(false)
	secs := time.Since(t0).Seconds()
	self1 := selfCPUMicros()
	cpu, cerr := meter.end()
	watched := fmt.Sprintf(" cpu_self_us=%.0f", self1-self0) + ws.end()
	n := total.Load()
	stopping.Store(true)
	waitBounded(&wg, 5*time.Second)
	if cerr != nil {
		return cerr
	}
	if e := firstErr.Load(); e != nil && n == 0 {
		return fmt.Errorf("echo failed: %v", e)
	}
	if n == 0 {
		return errors.New("no echo completed")
	}
	mu.Lock()
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	p50, p99 := pct(samples, 0.50), pct(samples, 0.99)
	mu.Unlock()
	errNote := ""
	if e := firstErr.Load(); e != nil {
		errNote = " error=" + strconv.Quote(e.(string))
	}
	fmt.Printf("ops=%d secs=%.2f rate=%.1f p50_us=%.1f p99_us=%.1f cpu_us=%.0f cpu_per_op_us=%.2f%s%s\n",
		n, secs, float64(n)/secs, float64(p50)/1e3, float64(p99)/1e3, cpu, cpu/float64(n), watched, errNote)
	return nil
}

func waitBounded(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

func pct(sorted []int64, q float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

func cmdIdle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	url := fs.String("url", "", "wss://127.0.0.1:PORT/relay/ws")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the server")
	conns := fs.Int("conns", 1000, "idle WebSockets to open")
	par := fs.Int("parallel", 16, "dials in flight")
	settle := fs.Duration("settle", 3*time.Second, "wait before measuring RSS")
	pids := fs.String("pids", "", "server pids for RSS accounting")
	fs.Parse(args)
	if err := wsTarget(*url); err != nil {
		return err
	}
	if *conns < 1 || *conns > maxConns || *par < 1 || *par > 256 || *settle < 0 || *settle > maxDuration {
		return errors.New("bad -conns/-parallel/-settle")
	}
	roots, err := parsePIDs(*pids)
	if err != nil || len(roots) == 0 {
		return fmt.Errorf("need -pids: %v", err)
	}
	cfg, err := clientTLS(*pin, []string{"http/1.1"})
	if err != nil {
		return err
	}
	before, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *settle+5*time.Minute)
	defer cancel()
	cs := make([]*websocket.Conn, *conns)
	defer func() {
		for _, c := range cs {
			if c != nil {
				c.CloseNow()
			}
		}
	}()
	var (
		next     atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	t0 := time.Now()
	for w := 0; w < *par; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= *conns || firstErr.Load() != nil {
					return
				}
				c, err := dialWS(ctx, *url, cfg)
				if err != nil {
					firstErr.CompareAndSwap(nil, fmt.Sprintf("dial %d: %v", i, err))
					return
				}
				cs[i] = c
				if err := relayAuth(ctx, c, i+1); err != nil {
					firstErr.CompareAndSwap(nil, fmt.Sprintf("auth %d: %v", i, err))
					return
				}
				// Keep the connection read side alive (pongs, closes) without
				// touching the server: an idle client is what is measured.
				c.CloseRead(ctx)
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return errors.New(e.(string))
	}
	openSecs := time.Since(t0).Seconds()
	time.Sleep(*settle)
	after, err := sampleProcs(roots)
	if err != nil {
		return err
	}
	delta := float64(after.rssKiB) - float64(before.rssKiB)
	perK := delta / 1024 * 1000 / float64(*conns)
	fmt.Printf("conns=%d open_secs=%.2f rss_before_kib=%d rss_after_kib=%d mib_per_1000=%.1f\n",
		*conns, openSecs, before.rssKiB, after.rssKiB, perK)
	return nil
}

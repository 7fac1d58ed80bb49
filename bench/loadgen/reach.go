// Reach figures of `make bench`: the same transfers as a client of a
// rendezvous broker makes them (outer wss:// to the broker, inner pinned TLS
// to the front carried in the stream), and directly, for the ratio.
//
// Credentials travel between the script and this tool only in 0600 files
// (-reach FILE); nothing here prints or logs a token.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/pinning"
)

// Bounds of the Reach subcommands.
const (
	maxCredFile      = 64 << 10
	maxCAFile        = 1 << 20
	maxIdleHosts     = 1024
	maxStreamsPerHst = 64
	xferChunk        = 256 << 10 // one Write of the upload body / one Read of the download
	maxXferSize      = 16 << 20  // the front's request body limit
	transferTimeout  = time.Minute
	frontServerName  = "127.0.0.1" // the bench front's authority (advertise: 127.0.0.1)
)

// reachCred is what the script hands to the load side: where to register
// and with which credential. The token is a wire.Secret, so an accidental
// %v or json.Marshal of the struct redacts it.
type reachCred struct {
	BrokerURL string      `json:"broker_url"`
	HostID    string      `json:"host_id"`
	Kind      string      `json:"credential_kind"`
	Token     wire.Secret `json:"token"`
}

// credFile is the on-disk form; only writeCred and loadCred see the raw token.
type credFile struct {
	BrokerURL string `json:"broker_url"`
	HostID    string `json:"host_id"`
	Kind      string `json:"credential_kind"`
	Token     string `json:"token"`
}

func writeCred(path string, c reachCred) error {
	b, err := json.Marshal(credFile{c.BrokerURL, c.HostID, c.Kind, string(c.Token)})
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func loadCred(path string) (reachCred, error) {
	b, err := readBounded(path, maxCredFile)
	if err != nil {
		return reachCred{}, err
	}
	var f credFile
	if err := json.Unmarshal(b, &f); err != nil {
		return reachCred{}, fmt.Errorf("%s: not a credential file", path)
	}
	c := reachCred{f.BrokerURL, f.HostID, f.Kind, wire.Secret(f.Token)}
	if err := brokerLoopback(c.BrokerURL); err != nil {
		return reachCred{}, err
	}
	return c, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// brokerLoopback refuses a broker that is not on a loopback IP literal: the
// bench never sends traffic off the machine.
func brokerLoopback(raw string) error {
	u, err := wire.ParseBrokerURL(raw)
	if err != nil {
		return err
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	return loopbackOnly(net.JoinHostPort(u.Hostname(), port))
}

// loadPool trusts exactly the PEM certificates in file (the bench broker's
// self-signed certificate), not the system roots.
func loadPool(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, errors.New("need -ca-file (the broker's certificate)")
	}
	b, err := readBounded(file, maxCAFile)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", file)
	}
	return p, nil
}

func (c reachCred) config(pool *x509.CertPool) client.Config {
	return client.Config{
		BrokerURL: c.BrokerURL, HostID: c.HostID, CredentialKind: c.Kind,
		Token: c.Token, RootCAs: pool, Log: zerolog.Nop(),
	}
}

// frontDialer opens one pinned TLS connection to the front: directly over
// TCP, or as the inner TLS of a broker stream. Both use the client
// library's pinned configuration, so the two paths differ only in the
// transport under the inner TLS.
type frontDialer struct {
	addr  string         // the front's host:port; also the Host of requests
	pin   string         // sha256/<b64>
	reach *client.Config // nil: direct
	dials atomic.Int64
}

func newFrontDialer(addr, pin, credPath, caFile string) (*frontDialer, error) {
	if err := loopbackOnly(addr); err != nil {
		return nil, err
	}
	if _, err := decodePin(pin); err != nil {
		return nil, err
	}
	d := &frontDialer{addr: addr, pin: pin}
	if credPath == "" {
		return d, nil
	}
	cred, err := loadCred(credPath)
	if err != nil {
		return nil, err
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	cfg := cred.config(pool)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d.reach = &cfg
	return d, nil
}

func (d *frontDialer) via() string {
	if d.reach != nil {
		return "broker"
	}
	return "direct"
}

func (d *frontDialer) dial(ctx context.Context) (*tls.Conn, error) {
	d.dials.Add(1)
	ctx, cancel := context.WithTimeout(ctx, 2*dialTimeout)
	defer cancel()
	if d.reach != nil {
		return client.DialTLS(ctx, *d.reach, frontServerName, d.pin)
	}
	return pinning.DialPinned(ctx, d.addr, frontServerName, d.pin)
}

// dialWSVia runs a WebSocket upgrade over connections from dial, so the
// same echo code measures a direct connection and a broker stream.
func dialWSVia(ctx context.Context, wsURL string, dial func(context.Context) (*tls.Conn, error)) (*websocket.Conn, error) {
	tr := &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("plaintext refused")
		},
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		DisableCompression: true,
		MaxIdleConns:       -1,
	}
	c, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{
		HTTPClient:      &http.Client{Transport: tr, Timeout: 2 * dialTimeout},
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

// ---------------------------------------------------------------- reach-route

// adminBootstrap asks the front's admin socket for a one-stream bootstrap
// credential, as `securelink pair` does.
func adminBootstrap(ctx context.Context, sock string, ttl int) (admin.BootstrapReply, error) {
	b, _, err := admin.NewClient(sock).Bootstrap(ctx, admin.BootstrapRequest{TTLSeconds: int64(ttl)})
	if err != nil {
		return b, fmt.Errorf("POST %s: %w", admin.PathBootstrap, err)
	}
	return b, nil
}

// routeCredential is payload.route_credential of the auth.ok a /relay/ws
// connection receives when it arrived through a broker stream.
type routeCredential struct {
	Kind         string          `json:"kind"`
	BrokerURL    string          `json:"broker_url"`
	HostID       string          `json:"host_id"`
	CredentialID string          `json:"credential_id"`
	Token        string          `json:"token"`
	ExpiresAt    json.RawMessage `json:"expires_at"`
}

// parseRouteCredential reads the route credential out of an auth.ok frame.
func parseRouteCredential(frame []byte) (routeCredential, error) {
	var m struct {
		Channel string `json:"channel"`
		Type    string `json:"type"`
		Payload struct {
			RouteCredential *routeCredential `json:"route_credential"`
		} `json:"payload"`
	}
	if err := json.Unmarshal(frame, &m); err != nil {
		return routeCredential{}, errors.New("the first reply is not JSON")
	}
	if m.Channel != "system" || m.Type != "auth.ok" {
		return routeCredential{}, fmt.Errorf("the first reply is %s/%s, not system/auth.ok", m.Channel, m.Type)
	}
	rc := m.Payload.RouteCredential
	if rc == nil {
		return routeCredential{}, errors.New("auth.ok carries no payload.route_credential (did the stream arrive through the broker?)")
	}
	if rc.Kind != "broker_route" {
		return routeCredential{}, fmt.Errorf("route_credential.kind is %q, want broker_route", rc.Kind)
	}
	if !wire.ValidWireToken(rc.Token) {
		return routeCredential{}, errors.New("route_credential.token is not a valid token")
	}
	if _, err := strconv.ParseInt(string(rc.ExpiresAt), 10, 64); err != nil {
		return routeCredential{}, errors.New("route_credential.expires_at is not a JSON integer")
	}
	return *rc, nil
}

// cmdReachRoute turns a bootstrap (one stream, ever) into a route
// credential (several streams, reusable) the way a phone does: it connects
// to /relay/ws through the broker with the bootstrap, authenticates with the
// Relay, and keeps the route_credential the front adds to auth.ok.
func cmdReachRoute(args []string) error {
	fs := flag.NewFlagSet("reach-route", flag.ExitOnError)
	sock := fs.String("admin", "", "the front's admin socket (<state_dir>/admin.sock)")
	addr := fs.String("addr", "", "the front's host:port (its authority)")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the front")
	caFile := fs.String("ca-file", "", "the broker's certificate (PEM)")
	out := fs.String("out", "", "write the route credential here (0600)")
	ttl := fs.Int("ttl", int(wire.DefaultBootstrapTTL/time.Second), "bootstrap lifetime in seconds")
	device := fs.String("device", "bench", "device of the Relay login (auth id and device_id): one route credential per device")
	fs.Parse(args)
	if !validDeviceName(*device) {
		return errors.New("-device must be 1..32 letters, digits, '-' or '_'")
	}
	if *sock == "" || *out == "" {
		return errors.New("need -admin and -out")
	}
	if err := loopbackOnly(*addr); err != nil {
		return err
	}
	pool, err := loadPool(*caFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	boot, err := adminBootstrap(ctx, *sock, *ttl)
	if err != nil {
		return err
	}
	if err := brokerLoopback(boot.BrokerURL); err != nil {
		return err
	}
	cfg := reachCred{boot.BrokerURL, boot.HostID, "bootstrap", wire.Secret(boot.Token)}.config(pool)
	ws, err := dialWSVia(ctx, "wss://"+*addr+"/relay/ws", func(ctx context.Context) (*tls.Conn, error) {
		return client.DialTLS(ctx, cfg, frontServerName, *pin)
	})
	if err != nil {
		return fmt.Errorf("/relay/ws through the broker with the bootstrap: %w", err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"channel":"system","type":"auth","id":"route-`+*device+`","payload":{"session_token":"bench","device_id":"`+*device+`"}}`)); err != nil {
		return err
	}
	_, first, err := ws.Read(ctx)
	if err != nil {
		return fmt.Errorf("waiting for auth.ok: %w", err)
	}
	rc, err := parseRouteCredential(first)
	if err != nil {
		return err
	}
	if rc.BrokerURL != boot.BrokerURL || rc.HostID != boot.HostID {
		return errors.New("route_credential names another broker or host than the bootstrap")
	}
	if err := writeCred(*out, reachCred{rc.BrokerURL, rc.HostID, "route", wire.Secret(rc.Token)}); err != nil {
		return err
	}
	ws.Close(websocket.StatusNormalClosure, "")
	fmt.Printf("route credential_id=%s expires_at=%s host_id=%s broker_url=%s\n", rc.CredentialID, rc.ExpiresAt, rc.HostID, rc.BrokerURL)
	return nil
}

// validDeviceName keeps -device safe to splice into the JSON auth frame.
func validDeviceName(s string) bool {
	if len(s) == 0 || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// ---------------------------------------------------------------- xfer

// selfCPUMicros is this process's own CPU (user+system), so the script can
// show how the load core's time splits between client, front and upstream.
func selfCPUMicros() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec)*1e6 + float64(t.Usec) }
	return tv(ru.Utime) + tv(ru.Stime)
}

// watchSet is named processes whose CPU is reported next to the server's.
type watchSet struct {
	names []string
	pids  []int
	start []float64
}

func parseWatch(s string) (*watchSet, error) {
	w := &watchSet{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, pid, ok := strings.Cut(f, "=")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 || name == "" || strings.ContainsAny(name, " =") {
			return nil, fmt.Errorf("-watch wants name=pid[,name=pid], got %q", f)
		}
		w.names, w.pids = append(w.names, name), append(w.pids, n)
	}
	return w, nil
}

func (w *watchSet) begin() {
	w.start = w.start[:0]
	for _, p := range w.pids {
		s, _ := sampleProcs([]int{p})
		w.start = append(w.start, s.cpuMicros())
	}
}

func (w *watchSet) end() string {
	var b strings.Builder
	for i, p := range w.pids {
		s, _ := sampleProcs([]int{p})
		fmt.Fprintf(&b, " cpu_%s_us=%.0f", w.names[i], s.cpuMicros()-w.start[i])
	}
	return b.String()
}

// xferConn is one HTTP/1.1 keep-alive connection used for the whole run:
// "single stream" means exactly this.
type xferConn struct {
	c    *tls.Conn
	br   *bufio.Reader
	host string
	buf  []byte
}

func (x *xferConn) download(path string, moved *atomic.Int64) error {
	x.c.SetDeadline(time.Now().Add(transferTimeout))
	req := "GET " + path + " HTTP/1.1\r\nHost: " + x.host + "\r\nUser-Agent: securelink-bench\r\n\r\n"
	if _, err := io.WriteString(x.c, req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(x.br, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ContentLength <= 0 {
		return fmt.Errorf("GET %s: HTTP %d, Content-Length %d", path, resp.StatusCode, resp.ContentLength)
	}
	var got int64
	for {
		n, err := resp.Body.Read(x.buf)
		got += int64(n)
		moved.Add(int64(n))
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("GET %s after %d of %d bytes: %w", path, got, resp.ContentLength, err)
		}
	}
	if got != resp.ContentLength {
		return fmt.Errorf("GET %s: %d bytes, Content-Length %d", path, got, resp.ContentLength)
	}
	return nil
}

// upload sends size bytes and counts them in moved only once the sink
// confirmed it received every one of them.
func (x *xferConn) upload(path string, size int, moved *atomic.Int64) error {
	x.c.SetDeadline(time.Now().Add(transferTimeout))
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: securelink-bench\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", path, x.host, size)
	if _, err := io.WriteString(x.c, head); err != nil {
		return err
	}
	for sent := 0; sent < size; {
		n := min(size-sent, len(x.buf))
		if _, err := x.c.Write(x.buf[:n]); err != nil {
			return fmt.Errorf("POST %s after %d of %d bytes: %w", path, sent, size, err)
		}
		sent += n
	}
	resp, err := http.ReadResponse(x.br, nil)
	if err != nil {
		return fmt.Errorf("POST %s: reading the answer: %w", path, err)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64))
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != strconv.Itoa(size) {
		return fmt.Errorf("POST %s: HTTP %d, sink counted %q of %d bytes", path, resp.StatusCode, b, size)
	}
	moved.Add(int64(size))
	return nil
}

// cmdXfer measures single-stream bulk transfer: GET of an 8 MiB body, or
// POST of size bytes, back to back on one connection for the window.
func cmdXfer(args []string) error {
	fs := flag.NewFlagSet("xfer", flag.ExitOnError)
	mode := fs.String("mode", "download", "download (GET -path) or upload (POST -path)")
	addr := fs.String("addr", "", "the front's host:port")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the front")
	credPath := fs.String("reach", "", "credential file: go through the broker (else direct)")
	caFile := fs.String("ca-file", "", "the broker's certificate (with -reach)")
	path := fs.String("path", "", "default /api/big (download) or /api/sink (upload)")
	size := fs.Int("size", 8<<20, "upload body size in bytes")
	var win window
	win.flags(fs, 2*time.Second, "server pids for CPU accounting (the broker)")
	watch := fs.String("watch", "", "more processes to report CPU of: name=pid[,name=pid]")
	fs.Parse(args)
	if *mode != "download" && *mode != "upload" {
		return errors.New("-mode must be download or upload")
	}
	if *path == "" {
		*path = map[string]string{"download": "/api/big", "upload": "/api/sink"}[*mode]
	}
	if !strings.HasPrefix(*path, "/") || strings.ContainsAny(*path, " \r\n") {
		return errors.New("bad -path")
	}
	if *size < 1 || *size > maxXferSize {
		return errors.New("bad -size")
	}
	d, err := newFrontDialer(*addr, *pin, *credPath, *caFile)
	if err != nil {
		return err
	}
	meter, err := win.meter()
	if err != nil {
		return err
	}
	ws, err := parseWatch(*watch)
	if err != nil {
		return err
	}
	c, err := d.dial(context.Background())
	if err != nil {
		return fmt.Errorf("dial %s: %w", d.via(), err)
	}
	defer c.Close()
	x := &xferConn{c: c, br: bufio.NewReaderSize(c, xferChunk), host: *addr, buf: bytes.Repeat([]byte("u"), xferChunk)}

	var (
		moved    atomic.Int64
		done     atomic.Int64 // transfers completed
		stopping atomic.Bool
		firstErr atomic.Value
		finished = make(chan struct{})
	)
	go func() {
		defer close(finished)
		for !stopping.Load() {
			var err error
			if *mode == "download" {
				err = x.download(*path, &moved)
			} else {
				err = x.upload(*path, *size, &moved)
			}
			if err != nil {
				firstErr.Store(err.Error())
				return
			}
			done.Add(1)
		}
	}()
	time.Sleep(win.warm)
	if err := meter.begin(); err != nil {
		return err
	}
	ws.begin()
	self0 := selfCPUMicros()
	b0, n0, t0 := moved.Load(), done.Load(), time.Now()
	time.Sleep(win.dur)
	b1, n1, secs := moved.Load(), done.Load(), time.Since(t0).Seconds()
	self1 := selfCPUMicros()
	cpu, cerr := meter.end()
	watched := ws.end()
	// Let the transfer in flight finish, so the stream ends cleanly and a
	// cut would be seen.
	stopping.Store(true)
	select {
	case <-finished:
	case <-time.After(transferTimeout + 5*time.Second):
		firstErr.CompareAndSwap(nil, "the last transfer did not finish")
	}
	if cerr != nil {
		return cerr
	}
	bytesMoved := b1 - b0
	cut := 0
	errNote := ""
	if e := firstErr.Load(); e != nil {
		cut = 1
		errNote = " error=" + strconv.Quote(e.(string))
	}
	if bytesMoved <= 0 {
		return fmt.Errorf("no byte moved in the window (%d transfers before)%s", n0, errNote)
	}
	cpuPerGB := cpu / 1e6 / (float64(bytesMoved) / 1e9)
	fmt.Printf("mode=%s via=%s bytes=%d transfers=%d secs=%.2f mbs=%.1f cpu_us=%.0f cpu_s_per_gb=%.3f cpu_self_us=%.0f%s dials=%d cut=%d%s\n",
		*mode, d.via(), bytesMoved, n1-n0, secs, float64(bytesMoved)/secs/1e6, cpu, cpuPerGB, self1-self0, watched, d.dials.Load(), cut, errNote)
	return nil
}

// ---------------------------------------------------------------- reach-idle

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
	fs.Parse(args)
	if err := brokerLoopback(*brokerURL); err != nil {
		return err
	}
	if *nHosts < 1 || *nHosts > maxIdleHosts || *streamHosts < 0 || *streamHosts > *nHosts ||
		*perHost < 1 || *perHost > maxStreamsPerHst || *settle < 0 || *settle > maxDuration || *par < 1 || *par > 256 {
		return errors.New("bad -hosts-n/-stream-hosts/-streams-per-host/-settle/-parallel")
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

	before, err := sampleProcs(roots)
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
	fmt.Printf("hosts=%d streams=%d host_secs=%.2f stream_secs=%.2f rss_before_kib=%d rss_hosts_kib=%d rss_streams_kib=%d kib_per_host=%.1f kib_per_stream=%.1f%s\n",
		len(hosts), nStreams, hostSecs, streamSecs, before.rssKiB, mid.rssKiB, after.rssKiB, perHostKiB, perStreamKiB, lateNote)
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

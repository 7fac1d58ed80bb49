package proxy

// Fault injection on the front's upstream legs, with real sockets: a Relay
// process killed (SIGKILL) or frozen (SIGSTOP) while WebSockets are bridged,
// and an API upstream that dies in the middle of a response body. What the
// contract says about each: secure-link.md "`/relay/ws` bridge" (a leg that
// ends without a close frame closes the other without status; a peer that
// stops answering is dropped after the pong timeout) and "Limits and
// timeouts" (a response already started can only fail by being cut: the
// connection closed on HTTP/1.1, the stream reset on HTTP/2).

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

// helperRelayEnv makes the test binary, re-executed, serve a fake Relay in
// its own process (TestHelperRelayProcess) so that a test can kill it.
const helperRelayEnv = "SECURELINK_FAULT_RELAY"

// TestHelperRelayProcess is not a test: run by faultRelay in a child
// process, it serves the fake Relay (internal/testfake) on 127.0.0.1,
// prints its URL and serves until it is killed or its stdin closes (the
// parent died).
// With the variable set to "rst" every accepted socket has SO_LINGER 0, so
// the kernel resets the connections when the process dies instead of
// closing them with a FIN.
func TestHelperRelayProcess(t *testing.T) {
	mode := os.Getenv(helperRelayEnv)
	if mode == "" {
		t.Skip("helper process for the fault tests")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	relay := testfake.NewRelayOn(t, lingerListener{ln, mode == "rst"}, nil)
	fmt.Printf("%s\n", relay.URL)
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

type lingerListener struct {
	net.Listener
	reset bool
}

func (l lingerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil && l.reset {
		c.(*net.TCPConn).SetLinger(0)
	}
	return c, err
}

// relayProcess is a fake Relay in a child process.
type relayProcess struct {
	cmd  *exec.Cmd
	url  *url.URL
	port int
}

// faultRelay starts the child; mode is "fin" or "rst" (see
// TestHelperRelayProcess). Its stdout is read once and closed, its stderr
// is the test's: after start the child costs the parent only its stdin pipe
// and the process handle.
func faultRelay(t *testing.T, mode string) *relayProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRelayProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperRelayEnv+"="+mode)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	pr.SetReadDeadline(time.Now().Add(testTimeout))
	line, err := bufio.NewReader(pr).ReadString('\n')
	pr.Close()
	if err != nil {
		t.Fatalf("the relay process did not start: %v", err)
	}
	u, err := url.Parse(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	return &relayProcess{cmd: cmd, url: u, port: port}
}

// tcpSockets counts this process's TCP sockets (per /proc/self/fd and
// /proc/net/tcp) that are connections, not listeners, with port at either
// end: the sockets a bridged session holds on the front, on its client and
// on its Relay leg.
func tcpSockets(t *testing.T, ports ...int) int {
	t.Helper()
	mine := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("counting descriptors: %v", err)
	}
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "socket:[") {
			mine[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	want := map[int]bool{}
	for _, p := range ports {
		want[p] = true
	}
	n := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] == "0A" || !mine[f[9]] { // 0A: LISTEN
				continue
			}
			if want[hexPort(f[1])] || want[hexPort(f[2])] {
				n++
			}
		}
	}
	return n
}

func hexPort(addr string) int {
	_, p, _ := strings.Cut(addr, ":")
	n, _ := strconv.ParseInt(p, 16, 32)
	return int(n)
}

func openFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("counting descriptors: %v", err)
	}
	return len(fds)
}

// faultSessions is how many WebSockets are bridged when the Relay fails.
const faultSessions = 8

// openFaultSessions bridges n authenticated sessions through h and checks
// that each echoes.
func openFaultSessions(t *testing.T, h *harness, n int) []*websocket.Conn {
	t.Helper()
	cs := make([]*websocket.Conn, n)
	for i := range cs {
		cs[i] = h.mustDialWS("/relay/ws", "")
		if v := testfake.Authenticate(t, cs[i], testfake.GoodCode); !strings.Contains(v, `"auth.ok"`) {
			t.Fatalf("session %d: verdict %s", i, v)
		}
		wsSend(t, cs[i], websocket.MessageText, []byte("ping "+itoa(i)))
		if _, got, err := wsRead(cs[i]); err != nil || string(got) != "ping "+itoa(i) {
			t.Fatalf("session %d echo: %q %v", i, got, err)
		}
	}
	if a := h.srv.Bridge().Active(); a != n {
		t.Fatalf("bridge reports %d sessions, want %d", a, n)
	}
	return cs
}

// expectClosedWithoutStatus reads every client until its session ends and
// checks that it ended with a close frame without status (1005), the
// front's translation of a Relay leg that died without one.
func expectClosedWithoutStatus(t *testing.T, cs []*websocket.Conn) {
	t.Helper()
	ends := make(chan testfake.End, len(cs))
	for _, c := range cs {
		go func() {
			for {
				if _, _, err := wsRead(c); err != nil {
					ends <- testfake.EndOf(err)
					c.CloseNow()
					return
				}
			}
		}()
	}
	for i := range cs {
		if e := <-ends; e.Code != websocket.StatusNoStatusRcvd || e.Reason != "" {
			t.Errorf("client %d saw %+v, want a close frame without status (1005)", i, e)
		}
	}
}

// TestFaultRelayKilledWithWebSocketsOpen: the Relay process dies (SIGKILL;
// its kernel closes the sockets with a FIN, or resets them when they linger
// 0) under eight bridged sessions. Pings are an hour apart, so only the
// socket event can end the sessions: every client gets a close without
// status within the test's wait, and the front's sockets, descriptors and
// goroutines go back to what they were before the sessions.
func TestFaultRelayKilledWithWebSocketsOpen(t *testing.T) {
	for _, mode := range []string{"fin", "rst"} {
		t.Run(mode, func(t *testing.T) {
			rp := faultRelay(t, mode)
			h := newHarness(t, withOptions(func(o *Options) {
				o.Upstreams.Relay = rp.url
				o.Relay.PingInterval = time.Hour
				o.Relay.PongTimeout = 2 * time.Hour
			}))
			relayFaultRun(t, h, rp, func() {
				if err := rp.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestFaultRelayFrozenIsDroppedByPongTimeout: the Relay process stops
// (SIGSTOP) without its sockets closing, as a hung host would; the kernel
// still acknowledges bytes, so nothing but the keepalive can notice. Every
// client gets a close without status once the pong timeout passes, and the
// front's sockets, descriptors and goroutines go back to the baseline.
func TestFaultRelayFrozenIsDroppedByPongTimeout(t *testing.T) {
	rp := faultRelay(t, "fin")
	h := newHarness(t, withOptions(func(o *Options) {
		o.Upstreams.Relay = rp.url
		o.Relay.PingInterval = 200 * time.Millisecond
		o.Relay.PongTimeout = time.Second
		o.Relay.WriteTimeout = 500 * time.Millisecond
		o.Relay.HandoffTimeout = 500 * time.Millisecond
	}))
	relayFaultRun(t, h, rp, func() {
		if err := rp.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	})
}

// relayFaultRun takes the baseline, opens the sessions, injects the fault
// and checks the ends and the return to the baseline. The child is reaped
// only after the counts, so its process handle is part of both.
func relayFaultRun(t *testing.T, h *harness, rp *relayProcess, fault func()) {
	t.Helper()
	fds0, gor0 := openFDs(t), runtime.NumGoroutine()
	if n := tcpSockets(t, h.port, rp.port); n != 0 {
		t.Fatalf("%d connections before any session", n)
	}
	cs := openFaultSessions(t, h, faultSessions)
	if n := tcpSockets(t, h.port, rp.port); n < 3*faultSessions {
		t.Fatalf("%d sockets for %d sessions: the count does not see them", n, faultSessions)
	}
	fault()
	expectClosedWithoutStatus(t, cs)

	waitFor(t, "the bridge to forget its sessions", func() bool { return h.srv.Bridge().Active() == 0 })
	deadline := time.Now().Add(testTimeout)
	for {
		socks, fds, gor := tcpSockets(t, h.port, rp.port), openFDs(t), runtime.NumGoroutine()
		if socks == 0 && fds <= fds0 && gor <= gor0 {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("after the Relay failed: %d session sockets (want 0), %d descriptors (baseline %d), %d goroutines (baseline %d)\n%s",
				socks, fds, fds0, gor, gor0, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The front still bridges: a new upgrade to the dead Relay is a 502,
	// not a hang or a 101.
	rp.cmd.Process.Kill()
	rp.cmd.Wait()
	_, resp, err := h.dialWS("/relay/ws", "")
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("upgrade after the Relay died: %v (status %d), want 502", err, status)
	}
}

// dyingUpstream is an API on a bare listener that answers one forwarded
// request with a body of total bytes (declared, or chunked), sends head of
// them, then waits for die and kills the connection at the socket level
// (a reset when reset is set, else a FIN), as a crashing process would.
// Probe requests get a small 200.
type dyingUpstream struct {
	url     *url.URL
	started chan struct{} // closed when head bytes are out
	die     chan struct{}
}

func newDyingUpstream(t *testing.T, declared, reset bool, total, head int) *dyingUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &dyingUpstream{url: &url.URL{Scheme: "http", Host: ln.Addr().String()},
		started: make(chan struct{}), die: make(chan struct{})}
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		close(done)
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go u.serve(c, declared, reset, total, head, done)
		}
	}()
	return u
}

func (u *dyingUpstream) serve(c net.Conn, declared, reset bool, total, head int, done chan struct{}) {
	defer c.Close()
	br, bw := bufio.NewReader(c), bufio.NewWriter(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		if req.Header.Get("User-Agent") == probeUA {
			bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}")
			bw.Flush()
			continue
		}
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n")
		if declared {
			bw.WriteString("Content-Length: " + itoa(total) + "\r\n\r\n")
		} else {
			bw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
		}
		chunk := make([]byte, 16<<10)
		for sent := 0; sent < head; sent += len(chunk) {
			if !declared {
				fmt.Fprintf(bw, "%x\r\n", len(chunk))
			}
			bw.Write(chunk)
			if !declared {
				bw.WriteString("\r\n")
			}
		}
		if bw.Flush() != nil {
			return
		}
		close(u.started)
		select {
		case <-u.die:
		case <-done:
		}
		if reset {
			c.(*net.TCPConn).SetLinger(0)
		}
		return
	}
}

// TestFaultAPIUpstreamDiesMidDownload: an API upstream dies after sending a
// quarter of a large body, with a declared Content-Length and with a chunked
// body, closing (FIN) or resetting (RST) its connection, on both forwarding
// paths and both client protocols. The client, having already received part
// of the body, must get an error: on HTTP/1.1 the connection closed before
// the declared length or before the chunked body's end (Go reports an
// unexpected EOF), on HTTP/2 a reset stream. Never a 200 that looks
// complete.
func TestFaultAPIUpstreamDiesMidDownload(t *testing.T) {
	const total, head = 8 << 20, 2 << 20
	for _, p := range forwardPaths {
		for _, proto := range []string{"h1", "h2"} {
			for _, declared := range []bool{true, false} {
				for _, reset := range []bool{false, true} {
					name := fmt.Sprintf("%s/%s/declared=%v/reset=%v", p.name, proto, declared, reset)
					t.Run(name, func(t *testing.T) {
						up := newDyingUpstream(t, declared, reset, total, head)
						h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
						tr := &http.Transport{TLSClientConfig: h.tlsConfig(), DisableCompression: true, ForceAttemptHTTP2: proto == "h2"}
						defer tr.CloseIdleConnections()
						cl := &http.Client{Transport: tr, Timeout: testTimeout}
						resp, err := cl.Do(p.request(t, h, "/api/v1/download"))
						if err != nil {
							t.Fatalf("the answer's head: %v", err)
						}
						defer resp.Body.Close()
						wantStatus(t, "download", resp, 200)
						if want := map[string]int{"h1": 1, "h2": 2}[proto]; resp.ProtoMajor != want {
							t.Fatalf("protocol %s", resp.Proto)
						}
						if declared && resp.ContentLength != total {
							t.Fatalf("Content-Length %d, want the upstream's %d", resp.ContentLength, total)
						}
						// Mid-body: part of it has reached the client.
						if n, err := io.CopyN(io.Discard, resp.Body, head/2); err != nil {
							t.Fatalf("the first %d bytes: %d, %v", head/2, n, err)
						}
						<-up.started
						close(up.die)
						n, err := io.Copy(io.Discard, resp.Body)
						got := head/2 + n
						if err == nil {
							t.Fatalf("a body cut by the upstream's death read as complete (%d of %d bytes)", got, total)
						}
						if got >= total {
							t.Fatalf("read %d bytes, more than the upstream sent", got)
						}
						switch proto {
						case "h1":
							if !errors.Is(err, io.ErrUnexpectedEOF) {
								t.Fatalf("HTTP/1.1: %v, want an unexpected EOF", err)
							}
						case "h2":
							if !strings.Contains(err.Error(), "stream error") {
								t.Fatalf("HTTP/2: %v, want a reset stream", err)
							}
						}
					})
				}
			}
		}
	}
}

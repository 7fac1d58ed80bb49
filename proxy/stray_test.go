package proxy

// An upstream connection is reused only when the previous exchange ended
// exactly at its framing: bytes an upstream sends beyond a response (a body
// on HEAD, 204 or 304, more than its Content-Length, after the last chunk)
// must never become the answer to the next request, which may be another
// client's on another TLS connection.

import (
	"bufio"
	"bytes"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// poison is a complete response an upstream smuggles after its real one.
const poison = "HTTP/1.1 200 OK\r\nX-Poison: injected\r\nContent-Length: 8\r\n\r\npoisoned"

type strayCase struct {
	name   string
	method string // of the first request
	answer string // the first response, poison follows it
	late   bool   // the poison comes after the response, in a later write
}

var strayCases = []strayCase{
	{"body on HEAD", http.MethodHead, "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(poison)) + "\r\n\r\n", false},
	{"body on 204", http.MethodGet, "HTTP/1.1 204 No Content\r\n\r\n", false},
	{"body on 304", http.MethodGet, "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n", false},
	{"more than Content-Length", http.MethodGet, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false},
	{"after the last chunk", http.MethodGet, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", false},
	{"more than Content-Length, late", http.MethodGet, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true},
	{"body on HEAD, late", http.MethodHead, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true},
}

// strayUpstream answers /first with c.answer followed by the poison and
// every other request with "genuine". sent is signalled once the poison is
// written.
func strayUpstream(t *testing.T, c strayCase, sent chan<- struct{}) *rawUpstream {
	return newRawUpstream(t, func(req *http.Request, conn, n int, w *bufio.Writer) bool {
		if req.URL.Path != "/first" {
			w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\ngenuine")
			return true
		}
		w.WriteString(c.answer)
		if c.late {
			w.Flush()
			time.Sleep(50 * time.Millisecond)
		}
		w.WriteString(poison)
		w.Flush()
		sent <- struct{}{}
		return true
	})
}

// strayClients are the client transports: each request gets a new client,
// hence its own TLS connection to the front.
var strayClients = []struct {
	name string
	h2   bool
}{{"h1", false}, {"h2", true}}

func (h *harness) clientProto(h2 bool) *http.Client {
	tr := &http.Transport{TLSClientConfig: h.tlsConfig(), DisableCompression: true, ForceAttemptHTTP2: h2}
	h.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: testTimeout}
}

func TestStrayUpstreamBytesNeverReachTheNextClient(t *testing.T) {
	for _, p := range forwardPaths {
		for _, cl := range strayClients {
			for _, c := range strayCases {
				t.Run(p.name+"/"+cl.name+"/"+c.name, func(t *testing.T) {
					sent := make(chan struct{}, 1)
					up := strayUpstream(t, c, sent)
					h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
					first := c.method
					if p.body != "" && first == http.MethodGet {
						first = p.method
					}
					send := func(method, path string) (*http.Response, []byte) {
						var body io.Reader
						if p.body != "" {
							body = strings.NewReader(p.body)
						}
						req, err := http.NewRequest(method, h.url(path), body)
						if err != nil {
							t.Fatal(err)
						}
						resp, err := h.clientProto(cl.h2).Do(req)
						if err != nil {
							t.Fatalf("%s %s: %v", method, path, err)
						}
						defer resp.Body.Close()
						b, _ := io.ReadAll(resp.Body)
						if cl.h2 != (resp.ProtoMajor == 2) {
							t.Fatalf("client spoke %s", resp.Proto)
						}
						return resp, b
					}
					resp, _ := send(first, "/api/first")
					if resp.Header.Get("X-Poison") != "" {
						t.Fatalf("the first answer carries the poison: %v", resp.Header)
					}
					select {
					case <-sent:
					case <-time.After(testTimeout):
						t.Fatal("the upstream never sent its stray bytes")
					}
					second := http.MethodGet
					if p.body != "" {
						second = p.method
					}
					resp, body := send(second, "/api/second")
					if resp.Header.Get("X-Poison") != "" || string(body) != "genuine" {
						t.Fatalf("the next client got %d %v %q, want the upstream's genuine answer", resp.StatusCode, resp.Header, body)
					}
					if got := up.count("/second"); got != 1 {
						t.Fatalf("the upstream saw /second %d times", got)
					}
				})
			}
		}
	}
}

// The standard library's own log lines (http.Transport reports the stray
// bytes it finds on an idle connection through the global log package) go
// through the structured logger, at debug level, truncated, and never with
// the upstream's bytes verbatim.
func TestStandardLogGoesThroughTheStructuredLogTruncated(t *testing.T) {
	var stderr bytes.Buffer
	log.SetOutput(&stderr)
	flags := log.Flags()
	t.Cleanup(func() { log.SetOutput(os.Stderr); log.SetFlags(flags) })
	c := strayCase{"more than Content-Length", http.MethodPost, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false}
	sent := make(chan struct{}, 1)
	up := strayUpstream(t, c, sent)
	h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
	CaptureStandardLog(h.srv.log)
	long := poison + strings.Repeat("\x1b[31mX", 200)
	log.Printf("Unsolicited response received on idle HTTP channel starting with %s", long)
	req, _ := http.NewRequest(http.MethodPost, h.url("/api/first"), strings.NewReader("{}"))
	resp, _ := h.do(req)
	wantStatus(t, "POST", resp, 200)
	<-sent
	waitFor(t, "the transport's log line", func() bool { return strings.Count(h.logs.String(), "Unsolicited response") >= 2 })
	if stderr.Len() != 0 {
		t.Errorf("the standard log wrote %q directly", stderr.String())
	}
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if !strings.Contains(line, "Unsolicited") {
			continue
		}
		if !strings.Contains(line, `"level":"debug"`) || !strings.Contains(line, `"event":"stdlib"`) {
			t.Errorf("not a structured debug line: %s", line)
		}
		if len(line) > 400 || strings.Contains(line, "poisoned") || strings.Contains(line, "\x1b") || strings.Contains(line, `\u001b`) {
			t.Errorf("the upstream's bytes reached the log (%d bytes): %s", len(line), line)
		}
	}
}

// Below debug level a standard-library line (a TLS handshake error per bad
// client) costs no copy for a log line nobody keeps.
func TestStandardLogLineBelowDebugCostsNothing(t *testing.T) {
	var out bytes.Buffer
	l := serverErrorLog{log: zerolog.New(&out).Level(zerolog.InfoLevel), event: "http_server"}
	line := []byte("http: TLS handshake error from 192.0.2.1:4000: EOF\n")
	if n := testing.AllocsPerRun(100, func() { l.Write(line) }); n != 0 {
		t.Fatalf("%.0f allocations per line at info level, want none", n)
	}
	if out.Len() != 0 {
		t.Fatalf("a debug line was written at info level: %q", out.String())
	}
}

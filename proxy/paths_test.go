package proxy

// The forwarder has two paths: a request without a body takes the direct
// path (direct.go), one with a body the ReverseProxy path (forward.go). The
// contract does not know about paths, so each behavior here is checked on
// both: GET without a body, then POST with one.

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"testing"
	"time"
)

type forwardPath struct {
	name   string
	method string
	body   string
}

var forwardPaths = []forwardPath{
	{"direct", http.MethodGet, ""},
	{"reverseproxy", http.MethodPost, `{"q":"payload"}`},
}

func (p forwardPath) request(t *testing.T, h *harness, path string) *http.Request {
	t.Helper()
	var body io.Reader
	if p.body != "" {
		body = strings.NewReader(p.body)
	}
	req, err := http.NewRequest(p.method, h.url(path), body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// rawRequest is the request as raw HTTP/1.1 text with extra header lines.
func (p forwardPath) rawRequest(h *harness, target string, headers ...string) string {
	var b strings.Builder
	b.WriteString(p.method + " " + target + " HTTP/1.1\r\nHost: " + h.addr + "\r\n")
	for _, l := range headers {
		b.WriteString(l + "\r\n")
	}
	if p.body != "" {
		b.WriteString("Content-Length: " + strconv.Itoa(len(p.body)) + "\r\n")
	}
	b.WriteString("Connection: close\r\n\r\n" + p.body)
	return b.String()
}

func TestBothPathsApplyTheRequestHeaderPolicy(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := newHarness(t)
			resp, _ := h.raw(p.method, p.rawRequest(h, "/api/v1/x", credentialHeaders()...))
			wantStatus(t, p.method+" /api/v1/x", resp, 200)
			got := h.api.last()
			if got.Method != p.method || got.BodyLen != int64(len(p.body)) {
				t.Fatalf("api: upstream got %s with %d body bytes", got.Method, got.BodyLen)
			}
			checkStripped(t, "api", got.Header)
			if got.Header.Get("Authorization") != "Bearer api-secret-key" || len(got.Header.Values("Cookie")) != 0 {
				t.Errorf("api: Authorization %q, Cookie %q", got.Header.Get("Authorization"), got.Header.Values("Cookie"))
			}
			if got.Host != h.api.url.Host {
				t.Errorf("api: Host %q", got.Host)
			}

			resp, _ = h.rawFrom("127.0.0.2", p.method, p.rawRequest(h, "/dashboard/page", credentialHeaders()...))
			wantStatus(t, p.method+" /dashboard/page", resp, 200)
			got = h.dash.last()
			checkStripped(t, "dashboard", got.Header)
			if len(got.Header.Values("Authorization")) != 0 || got.Header.Get("Cookie") != "dash_session=cookie-secret" {
				t.Errorf("dashboard: Authorization %q, Cookie %q", got.Header.Values("Authorization"), got.Header.Get("Cookie"))
			}
			for name, v := range map[string]string{
				"X-Forwarded-Prefix": "/dashboard", "X-Forwarded-Proto": "https",
				"X-Forwarded-Host": h.addr, "X-Forwarded-For": "127.0.0.2",
			} {
				if g := got.Header.Values(name); len(g) != 1 || g[0] != v {
					t.Errorf("dashboard: %s = %q, want exactly %q", name, g, v)
				}
			}
		})
	}
}

// A client without a User-Agent is not given Go's.
func TestBothPathsAddNoUserAgent(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := newHarness(t)
			resp, _ := h.raw(p.method, p.rawRequest(h, "/api/x"))
			wantStatus(t, p.name, resp, 200)
			if ua, ok := h.api.last().Header["User-Agent"]; ok {
				t.Fatalf("upstream got User-Agent %q", ua)
			}
			resp, _ = h.raw(p.method, p.rawRequest(h, "/api/x", "User-Agent: hermes-android/1.2"))
			wantStatus(t, p.name, resp, 200)
			if ua := h.api.last().Header.Get("User-Agent"); ua != "hermes-android/1.2" {
				t.Fatalf("upstream got User-Agent %q", ua)
			}
		})
	}
}

func TestBothPathsApplyTheResponseHeaderPolicy(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := newHarness(t)
			apiHost := "127.0.0.1:" + h.api.port()
			h.api.handle(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				internalResponseHeaders(w)
				w.Header().Add("Set-Cookie", "api=1; Path=/")
				w.Header().Set("Location", "http://"+apiHost+"/v1/jobs/7?x=1")
				// Hop-by-hop response headers, and one the Connection
				// header names, never reach the client.
				w.Header().Set("Connection", "X-Private-Hop")
				w.Header().Set("X-Private-Hop", "secret")
				w.Header().Set("Keep-Alive", "timeout=5")
				w.Header().Set("Proxy-Authenticate", "Basic")
				w.Header().Set("Upgrade", "h2c")
				w.WriteHeader(http.StatusCreated)
			})
			resp, _ := h.do(p.request(t, h, "/api/x"))
			wantStatus(t, p.name, resp, http.StatusCreated)
			for _, name := range []string{"X-Hermes-Relay-Session", "X-Hermes-Proxy-Secret", "X-Hermes-Proxy-Peer",
				"Set-Cookie", "Alt-Svc", "X-Private-Hop", "Keep-Alive", "Proxy-Authenticate", "Upgrade"} {
				if v := resp.Header.Values(name); len(v) != 0 {
					t.Errorf("client received %s: %q", name, v)
				}
			}
			if resp.Header.Get("X-Upstream-Kept") != "yes" {
				t.Error("ordinary response header dropped")
			}
			if loc := resp.Header.Get("Location"); loc != "/api/v1/jobs/7?x=1" {
				t.Errorf("Location %q", loc)
			}

			h.dash.handle(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Add("Set-Cookie", "sid=abc; Path=/; Domain=127.0.0.1; HttpOnly")
				w.Header().Set("Location", "/login")
			})
			resp, _ = h.do(p.request(t, h, "/dashboard/x"))
			wantStatus(t, p.name, resp, 200)
			if c := resp.Header.Values("Set-Cookie"); len(c) != 1 || !strings.Contains(c[0], "Path=/dashboard") || strings.Contains(c[0], "Domain") {
				t.Errorf("dashboard Set-Cookie %q", c)
			}
			if loc := resp.Header.Get("Location"); loc != "/dashboard/login" {
				t.Errorf("dashboard Location %q", loc)
			}
		})
	}
}

// The same hop-by-hop response headers on the common answer (a
// Content-Length and no Connection header), the one the direct path
// parses itself rather than with http.ReadResponse: none reaches the
// client on either path (secure-link.md, response headers).
func TestBothPathsDropHopByHopHeadersOfTheCommonAnswer(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := newHarness(t)
			h.api.handle(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Keep-Alive", "timeout=5")
				w.Header().Set("Proxy-Authenticate", "Basic")
				w.Header().Set("Upgrade", "h2c")
				w.Header().Set("X-Upstream-Kept", "yes")
				w.Header().Set("Content-Length", "2")
				io.WriteString(w, "ok")
			})
			resp, body := h.do(p.request(t, h, "/api/x"))
			wantStatus(t, p.name, resp, http.StatusOK)
			for _, name := range []string{"Keep-Alive", "Proxy-Authenticate", "Upgrade"} {
				if v := resp.Header.Values(name); len(v) != 0 {
					t.Errorf("client received %s: %q", name, v)
				}
			}
			if resp.Header.Get("X-Upstream-Kept") != "yes" || string(body) != "ok" {
				t.Errorf("the answer itself: X-Upstream-Kept %q, body %q", resp.Header.Get("X-Upstream-Kept"), body)
			}
		})
	}
}

func TestBothPathsLimitResponses(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := limitedResponse(newHarness(t, withLimits(func(l *Limits) { l.MaxResponseBody = maxResp })))
			resp, body := h.do(p.request(t, h, "/api/big?declare=1&n="+strconv.Itoa(maxResp)))
			wantStatus(t, "declared response of exactly the limit", resp, 200)
			if len(body) != maxResp {
				t.Fatalf("got %d bytes", len(body))
			}
			resp, body = h.do(p.request(t, h, "/api/big?declare=1&n="+strconv.Itoa(maxResp+1)))
			wantStatus(t, "declared response over the limit", resp, http.StatusBadGateway)
			if len(body) > 64 {
				t.Fatalf("502 body is not short: %d bytes", len(body))
			}

			resp, body = h.do(p.request(t, h, "/api/big?n="+strconv.Itoa(maxResp)))
			wantStatus(t, "streamed response of exactly the limit", resp, 200)
			if len(body) != maxResp {
				t.Fatalf("got %d bytes", len(body))
			}
			resp, err := h.client().Do(p.request(t, h, "/api/big?n="+strconv.Itoa(maxResp+1)))
			if err != nil {
				return // cut before the headers
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil || n > maxResp {
				t.Fatalf("an oversize streamed response: %d bytes, err %v", n, err)
			}
		})
	}
}

// A body of unknown length is flushed per write, as an event stream is.
func TestBothPathsStreamBodiesOfUnknownLength(t *testing.T) {
	for _, p := range forwardPaths {
		for _, ct := range []string{"application/x-ndjson", "text/event-stream"} {
			t.Run(p.name+"/"+ct, func(t *testing.T) {
				h := newHarness(t)
				release := make(chan struct{})
				h.api.handle(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", ct)
					io.WriteString(w, "one\n")
					w.(http.Flusher).Flush()
					select {
					case <-release:
					case <-time.After(testTimeout):
					}
					io.WriteString(w, "two\n")
				})
				resp, err := h.client().Do(p.request(t, h, "/api/stream"))
				if err != nil {
					close(release)
					t.Fatal(err)
				}
				defer resp.Body.Close()
				br := bufio.NewReader(resp.Body)
				first := make(chan string, 1)
				go func() {
					l, _ := br.ReadString('\n')
					first <- l
				}()
				select {
				case l := <-first:
					if l != "one\n" {
						t.Errorf("first line %q", l)
					}
				case <-time.After(testTimeout):
					t.Error("the first line did not arrive while the upstream held the stream open")
				}
				close(release)
				rest, err := io.ReadAll(br)
				if err != nil || string(rest) != "two\n" {
					t.Fatalf("rest %q, err %v", rest, err)
				}
			})
		}
	}
}

func TestBothPathsTimeOutIdleUpstreams(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := newHarness(t, withLimits(func(l *Limits) { l.UpstreamIdleRead = 600 * time.Millisecond }))
			stall := make(chan struct{})
			defer close(stall)
			const ticks = 30 // 30 × 50 ms: longer than the idle limit, never idle
			h.api.handle(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				switch r.URL.Path {
				case "/partial":
					w.Header().Set("Content-Length", "100")
					io.WriteString(w, "first ten.")
					w.(http.Flusher).Flush()
				case "/flowing":
					for i := range ticks {
						io.WriteString(w, "tick "+strconv.Itoa(i)+"\n")
						w.(http.Flusher).Flush()
						time.Sleep(50 * time.Millisecond)
					}
					return
				}
				select { // then silence
				case <-stall:
				case <-r.Context().Done():
				}
			})
			resp, body := h.do(p.request(t, h, "/api/silent"))
			wantStatus(t, "upstream that never answers", resp, http.StatusBadGateway)
			if len(body) > 64 {
				t.Fatalf("502 body %q", body)
			}
			if resp, err := h.client().Do(p.request(t, h, "/api/partial")); err == nil {
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil {
					t.Fatalf("a stalled response completed: %q", b)
				}
			}
			resp, body = h.do(p.request(t, h, "/api/flowing"))
			if resp.StatusCode != 200 || strings.Count(string(body), "tick ") != ticks {
				t.Fatalf("a response that kept flowing: status %d, %d ticks", resp.StatusCode, strings.Count(string(body), "tick "))
			}
			resp, _ = h.get("/relay/health")
			wantStatus(t, "health after timeouts", resp, 200)
		})
	}
}

// Ordinary responses have a total limit; event streams only the idle limit.
func TestBothPathsLimitTheTotalButNotOfEventStreams(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := newHarness(t, withLimits(func(l *Limits) {
				l.UpstreamTotal = 400 * time.Millisecond
				l.UpstreamIdleRead = 5 * time.Second
			}))
			const ticks = 20 // 20 × 60 ms: past the total, never idle
			h.api.handle(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if r.URL.Query().Get("sse") == "1" {
					// With a parameter: the media type decides, not the whole value.
					w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
				}
				for i := range ticks {
					if _, err := io.WriteString(w, "data: "+strconv.Itoa(i)+"\n\n"); err != nil {
						return
					}
					w.(http.Flusher).Flush()
					select {
					case <-time.After(60 * time.Millisecond):
					case <-r.Context().Done():
						return
					}
				}
			})
			resp, err := h.client().Do(p.request(t, h, "/api/ticks?sse=1"))
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || strings.Count(string(body), "data: ") != ticks {
				t.Log(h.logs.String())
				t.Fatalf("event stream past the total: %d events, err %v", strings.Count(string(body), "data: "), err)
			}
			if resp, err := h.client().Do(p.request(t, h, "/api/ticks")); err == nil {
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil && strings.Count(string(body), "data: ") == ticks {
					t.Fatal("an ordinary response outlived the total limit")
				}
			}
		})
	}
}

// Informational answers reach the client before the final one, under the
// response header policy (no loopback Link); trailers, announced or not,
// after the body.
func TestBothPathsRelayInformationalAnswersAndTrailers(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := newHarness(t)
			h.api.handle(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Link", "<https://cdn.example/app.css>; rel=preload")
				w.Header().Add("Link", "<http://127.0.0.1:"+h.api.port()+"/leak.css>; rel=preload")
				w.WriteHeader(http.StatusEarlyHints)
				w.Header().Del("Link")
				w.Header().Set("Trailer", "X-Checksum")
				w.WriteHeader(200)
				io.WriteString(w, "body")
				w.Header().Set("X-Checksum", "42")
				w.Header().Set(http.TrailerPrefix+"X-Late", "7")
			})
			var early []string
			trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, hdr textproto.MIMEHeader) error {
				early = append(early, strconv.Itoa(code)+" "+strings.Join(hdr.Values("Link"), " | "))
				return nil
			}}
			req := p.request(t, h, "/api/x")
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
			resp, err := h.client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := resp.Trailer["X-Checksum"]; !ok {
				t.Errorf("the trailer was not announced in the head: %v", resp.Header)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			wantStatus(t, p.name, resp, 200)
			if err != nil || string(body) != "body" {
				t.Fatalf("body %q, err %v", body, err)
			}
			if len(early) != 1 || early[0] != "103 <https://cdn.example/app.css>; rel=preload" {
				t.Errorf("informational answers %q", early)
			}
			if resp.Trailer.Get("X-Checksum") != "42" || resp.Trailer.Get("X-Late") != "7" {
				t.Errorf("trailers %v", resp.Trailer)
			}
		})
	}
}

// A client that leaves while the upstream works cancels the upstream's
// request instead of leaving it running.
func TestBothPathsCancelTheUpstreamWhenTheClientLeaves(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			h := newHarness(t)
			arrived, canceled := make(chan struct{}, 1), make(chan struct{}, 1)
			h.api.handle(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				arrived <- struct{}{}
				select {
				case <-r.Context().Done():
					canceled <- struct{}{}
				case <-time.After(testTimeout):
				}
			})
			c, err := h.dialTLS(h.tlsConfig())
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(c, p.rawRequest(h, "/api/slow"))
			select {
			case <-arrived:
			case <-time.After(testTimeout):
				t.Fatal("the request did not reach the upstream")
			}
			c.Close()
			select {
			case <-canceled:
			case <-time.After(testTimeout):
				t.Fatal("the upstream request outlived the client")
			}
		})
	}
}

func TestBothPathsRefuseOversizedResponseHeads(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			up := newRawUpstream(t, func(req *http.Request, conn, n int, w *bufio.Writer) bool {
				w.WriteString("HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 70<<10) + "\r\nContent-Length: 2\r\n\r\nok")
				return true
			})
			h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
			resp, body := h.do(p.request(t, h, "/api/x"))
			wantStatus(t, "70 KiB response head", resp, http.StatusBadGateway)
			if len(body) > 64 {
				t.Fatalf("502 body %q", body)
			}
			up.setAnswer(nil)
			resp, _ = h.do(p.request(t, h, "/api/x"))
			wantStatus(t, "after the oversized head", resp, 200)
		})
	}
}

func TestBothPathsCloseIdleUpstreamConnections(t *testing.T) {
	for _, p := range forwardPaths {
		t.Run(p.name, func(t *testing.T) {
			up := newRawUpstream(t, nil)
			h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }),
				withLimits(func(l *Limits) { l.UpstreamIdleConn = 300 * time.Millisecond }))
			resp, _ := h.do(p.request(t, h, "/api/x"))
			wantStatus(t, p.name, resp, 200)
			up.waitClosedByFront(t, up.connOf(t, 0))

			// A reload releases the idle connections of the replaced
			// forwarder at once.
			h2 := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = up.url }))
			resp, _ = h2.do(p.request(t, h2, "/api/y"))
			wantStatus(t, p.name, resp, 200)
			if err := h2.srv.Reload(h2.opts, h2.id); err != nil {
				t.Fatal(err)
			}
			up.waitClosedByFront(t, up.connOf(t, 1))
		})
	}
}

// An upload and its answer stream both ways at once: the first event of the
// answer reaches the client while the rest of the body is still to come.
// net/http's HTTP/1 server otherwise drains the unread request body when
// the answer starts (here: waits for a body the client sends only after
// that event), or closes it under the Transport's last read, which cut a
// streamed answer to a POST after its first event.
func TestUploadAndAnswerStreamBothWays(t *testing.T) {
	h := newHarness(t)
	h.api.handle(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		n, _ := io.Copy(io.Discard, r.Body)
		io.WriteString(w, "data: got "+strconv.FormatInt(n, 10)+"\n\n")
	})
	c, err := h.dialTLS(h.tlsConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testTimeout))
	io.WriteString(c, "POST /api/v1/duplex HTTP/1.1\r\nHost: "+h.addr+"\r\nContent-Length: 10\r\n\r\n01234")
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodPost})
	if err != nil {
		t.Fatalf("no answer while the upload was incomplete: %v", err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if l, err := br.ReadString('\n'); err != nil || l != "data: one\n" {
		t.Fatalf("first event %q, err %v", l, err)
	}
	io.WriteString(c, "56789")
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: got 10\n\n" {
		t.Fatalf("rest %q, err %v", rest, err)
	}
}

// Trailers get the response header policy of their namespace: internal
// headers never reach a client as trailers, nor Set-Cookie from the API,
// announced or not, whichever protocol the client speaks.
func TestBothPathsApplyTheResponseHeaderPolicyToTrailers(t *testing.T) {
	internal := []string{"X-Hermes-Relay-Session", "X-Hermes-Proxy-Secret", "X-Hermes-Proxy-Peer"}
	for _, p := range forwardPaths {
		for _, cl := range strayClients {
			t.Run(p.name+"/"+cl.name, func(t *testing.T) {
				h := newHarness(t)
				trailing := func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
					w.Header().Set("Trailer", "X-Hermes-Relay-Session, Set-Cookie, X-Checksum")
					w.WriteHeader(200)
					io.WriteString(w, "body")
					w.(http.Flusher).Flush()
					w.Header().Set("X-Hermes-Relay-Session", "leaked-session")
					w.Header().Set("Set-Cookie", "sid=leak; Path=/; Domain=127.0.0.1")
					w.Header().Set("X-Checksum", "42")
					w.Header().Set(http.TrailerPrefix+"X-Hermes-Proxy-Secret", "leaked-secret")
					w.Header().Set(http.TrailerPrefix+"X-Hermes-Proxy-Peer", "6.6.6.6")
					w.Header().Add(http.TrailerPrefix+"Set-Cookie", "late=leak; Path=/")
				}
				h.api.handle(trailing)
				h.dash.handle(trailing)
				for _, ns := range []string{"/api", "/dashboard"} {
					resp, err := h.clientProto(cl.h2).Do(p.request(t, h, ns+"/x"))
					if err != nil {
						t.Fatal(err)
					}
					if cl.h2 != (resp.ProtoMajor == 2) {
						t.Fatalf("client spoke %s", resp.Proto)
					}
					for _, name := range internal {
						if _, ok := resp.Trailer[name]; ok {
							t.Errorf("%s: %s announced as a trailer", ns, name)
						}
					}
					body, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || string(body) != "body" {
						t.Fatalf("%s: body %q, err %v", ns, body, err)
					}
					for _, name := range internal {
						if v := resp.Trailer.Values(name); len(v) != 0 {
							t.Errorf("%s: trailer %s reached the client: %q", ns, name, v)
						}
					}
					if resp.Trailer.Get("X-Checksum") != "42" {
						t.Errorf("%s: ordinary trailer lost: %v", ns, resp.Trailer)
					}
					cookies := resp.Trailer.Values("Set-Cookie")
					switch ns {
					case "/api":
						if len(cookies) != 0 {
							t.Errorf("/api: Set-Cookie trailer reached the client: %q", cookies)
						}
					case "/dashboard":
						for _, c := range cookies {
							if !strings.Contains(c, "Path=/dashboard") || strings.Contains(c, "Domain") {
								t.Errorf("/dashboard: Set-Cookie trailer not rewritten: %q", c)
							}
						}
					}
				}
			})
		}
	}
}

// An upstream that answers before the request body has all arrived (a 401
// to an upload with a bad token) must not cost the client its connection.
// net/http's HTTP/1 server, in full duplex, finishes such a body only
// after the handler returned, and restarting its background read there
// panicked the connection's goroutine at the next request
// (golang/go#68560): the client's keep-alive connection was reset.
func TestEarlyAnswerToAPartBodyKeepsTheConnection(t *testing.T) {
	h := newHarness(t)
	h.api.handle(func(w http.ResponseWriter, r *http.Request) {
		// Answer at once: without full duplex net/http would first wait
		// for the small body.
		http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Length", "2") // the answer is whole before the body is
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, "no")
		w.(http.Flusher).Flush()
		io.Copy(io.Discard, r.Body) // in the handler: this upstream itself stays clear of the bug
	})
	c, err := h.dialTLS(h.tlsConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testTimeout))
	br := bufio.NewReader(c)
	io.WriteString(c, "POST /api/v1/upload HTTP/1.1\r\nHost: "+h.addr+"\r\nContent-Length: 10\r\n\r\n01234")
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodPost})
	if err != nil {
		t.Fatalf("no answer while the upload was incomplete: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	wantStatus(t, "the early answer", resp, http.StatusUnauthorized)
	// The rest of the body, then the next request on the same connection
	// once the body has been taken.
	io.WriteString(c, "56789")
	time.Sleep(50 * time.Millisecond) // let the front take the body's end before the next request
	io.WriteString(c, "GET /api/v1/next HTTP/1.1\r\nHost: "+h.addr+"\r\n\r\n")
	resp, err = http.ReadResponse(br, &http.Request{Method: http.MethodGet})
	if err != nil {
		t.Fatalf("the connection did not carry the next request: %v", err)
	}
	resp.Body.Close()
	wantStatus(t, "the next request", resp, http.StatusUnauthorized)
	if s := h.logs.String(); strings.Contains(s, "panic") {
		t.Fatalf("the front logged a panic: %s", s)
	}
}

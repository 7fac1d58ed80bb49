package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/hermes-securelink/securelink/pinning"
)

func TestUnknownSNIFailsHandshakeAndIsCounted(t *testing.T) {
	h := newHarness(t)
	for i, name := range []string{"evil.example", "front.example.evil", "localhost"} {
		cfg := h.tlsConfig()
		cfg.ServerName = name
		c, err := h.dialTLS(cfg)
		if err == nil {
			c.Close()
			t.Fatalf("SNI %q: handshake succeeded", name)
		}
		if !strings.Contains(err.Error(), "unrecognized name") {
			t.Errorf("SNI %q: error %v, want an unrecognized_name alert", name, err)
		}
		if got := h.srv.SNIRejected(); got != uint64(i+1) {
			t.Errorf("after SNI %q: SNIRejected = %d, want %d", name, got, i+1)
		}
	}
}

func TestEmptySNIAccepted(t *testing.T) {
	h := newHarness(t)
	// An IP server name makes Go send no SNI, like Hermes clients of an IP
	// authority.
	c, err := h.dialTLS(h.tlsConfig())
	if err != nil {
		t.Fatalf("no-SNI handshake: %v", err)
	}
	c.Close()
	resp, _ := h.get("/relay/health")
	wantStatus(t, "health without SNI", resp, 200)
	if h.srv.SNIRejected() != 0 {
		t.Fatal("an empty SNI was counted as rejected")
	}
}

func TestExtraNameSNIAccepted(t *testing.T) {
	h := newHarness(t)
	for _, name := range []string{extraName, "FRONT.Example"} {
		cfg := h.tlsConfigFor(extraName, h.id.Pin)
		cfg.ServerName = name
		c, err := h.dialTLS(cfg)
		if err != nil {
			t.Fatalf("SNI %q: %v", name, err)
		}
		if _, err := io.WriteString(c, "GET /relay/health HTTP/1.1\r\nHost: "+extraName+"\r\nConnection: close\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, "health via extra name", resp, 200)
		c.Close()
	}
	if h.srv.SNIRejected() != 0 {
		t.Fatal("an extra name SNI was counted as rejected")
	}
}

func TestWrongPinFailsOnTheClient(t *testing.T) {
	h := newHarness(t)
	other := "sha256/" + strings.Repeat("A", 43) + "="
	if _, err := h.dialTLS(h.tlsConfigFor("127.0.0.1", other)); err == nil {
		t.Fatal("a client pinned to another key completed the handshake")
	}
}

func TestTLSMinimumVersionIs12(t *testing.T) {
	h := newHarness(t)
	if v := h.srv.TLSConfig().MinVersion; v < tls.VersionTLS12 {
		t.Fatalf("server MinVersion %x", v)
	}
	cfg := h.tlsConfig()
	cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	c, err := h.dialTLS(cfg)
	if err == nil {
		c.Close()
		t.Fatal("a TLS 1.1 client completed the handshake")
	}
	// The refusal must come from the front (a remote alert), not from the
	// client declining to offer TLS 1.1.
	if !strings.Contains(err.Error(), "remote error") || !strings.Contains(err.Error(), "protocol version") {
		t.Fatalf("TLS 1.1 client: %v, want the front's protocol_version alert", err)
	}
	cfg = h.tlsConfig()
	cfg.MaxVersion = tls.VersionTLS12
	c, err = h.dialTLS(cfg)
	if err != nil {
		t.Fatalf("TLS 1.2 client: %v", err)
	}
	defer c.Close()
	if v := c.ConnectionState().Version; v != tls.VersionTLS12 {
		t.Fatalf("negotiated %x, want TLS 1.2", v)
	}
}

func TestALPNOffersH2AndHTTP11(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		offer []string
		want  string
	}{
		{[]string{"h2", "http/1.1"}, "h2"},
		{[]string{"http/1.1"}, "http/1.1"},
		{[]string{"h2"}, "h2"},
	} {
		cfg := h.tlsConfig()
		cfg.NextProtos = tc.offer
		c, err := h.dialTLS(cfg)
		if err != nil {
			t.Fatalf("offer %v: %v", tc.offer, err)
		}
		if got := c.ConnectionState().NegotiatedProtocol; got != tc.want {
			t.Errorf("offer %v: negotiated %q, want %q", tc.offer, got, tc.want)
		}
		c.Close()
	}
}

func TestHTTP2GetWorks(t *testing.T) {
	h := newHarness(t)
	tr := &http.Transport{TLSClientConfig: h.tlsConfig(), ForceAttemptHTTP2: true, DisableCompression: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: testTimeout}
	for _, p := range []string{"/relay/health", "/api/v1/x?y=%2F", "/dashboard/page"} {
		resp, err := cl.Get(h.url(p))
		if err != nil {
			t.Fatalf("GET %s over h2: %v", p, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("GET %s: protocol %s, want HTTP/2", p, resp.Proto)
		}
		wantStatus(t, "h2 GET "+p, resp, 200)
	}
	if got := h.api.last(); got.RequestURI != "/v1/x?y=%2F" || got.Proto != "HTTP/1.1" {
		t.Fatalf("API got %s %q", got.Proto, got.RequestURI)
	}
}

// HTTP/2 extended CONNECT (RFC 8441) must stay off: the server's SETTINGS
// frame must not enable it.
func TestHTTP2ExtendedConnectNotAdvertised(t *testing.T) {
	h := newHarness(t)
	cfg := h.tlsConfig()
	cfg.NextProtos = []string{"h2"}
	c, err := h.dialTLS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q", p)
	}
	c.SetDeadline(time.Now().Add(testTimeout))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading server frames: %v", err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		seen := 0
		err = sf.ForeachSetting(func(s http2.Setting) error {
			seen++
			if s.ID == http2.SettingEnableConnectProtocol && s.Val != 0 {
				return errors.New("SETTINGS_ENABLE_CONNECT_PROTOCOL is on")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if seen == 0 {
			t.Fatal("server SETTINGS frame is empty; nothing was checked")
		}
		return
	}
}

// A client that never finishes its TLS handshake is dropped: net/http derives
// the handshake deadline from ReadHeaderTimeout.
func TestStalledTLSHandshakeIsDropped(t *testing.T) {
	h := newHarness(t, withLimits(func(l *Limits) { l.ReadHeaderTimeout = 300 * time.Millisecond }))
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(testTimeout))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the front kept a connection without a TLS handshake open")
	}
}

func TestStalledRequestHeadersAreDropped(t *testing.T) {
	h := newHarness(t, withLimits(func(l *Limits) { l.ReadHeaderTimeout = 300 * time.Millisecond }))
	c, err := h.dialTLS(h.tlsConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /relay/health HTTP/1.1\r\nHost: "+h.addr+"\r\n")
	c.SetReadDeadline(time.Now().Add(testTimeout))
	_, err = io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the front kept a connection with unfinished headers open")
	}
}

func TestHTTP2PolicyMatchesHTTP1(t *testing.T) {
	h := newHarness(t)
	tr := &http.Transport{TLSClientConfig: h.tlsConfig(), ForceAttemptHTTP2: true, DisableCompression: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: testTimeout}
	do := func(req *http.Request) *http.Response {
		t.Helper()
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", req.Method, req.URL, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("not HTTP/2: %s", resp.Proto)
		}
		return resp
	}
	req, _ := http.NewRequest("GET", h.url("/api/x"), nil)
	req.Host = "evil.example"
	wantStatus(t, "h2 hostile :authority", do(req), http.StatusMisdirectedRequest)

	req, _ = http.NewRequest("GET", h.url("/api/x"), nil)
	req.Header.Set("Cookie", "c=1")
	req.Header.Set("Authorization", "Bearer k")
	wantStatus(t, "h2 API", do(req), 200)
	if got := h.api.last(); got.Header.Get("Cookie") != "" || got.Header.Get("Authorization") != "Bearer k" {
		t.Fatalf("h2 API headers %v", got.Header)
	}

	req, _ = http.NewRequest("POST", h.url("/api/upload"), &zeroReader{maxBody + 1})
	req.ContentLength = maxBody + 1
	wantStatus(t, "h2 declared oversize body", do(req), http.StatusRequestEntityTooLarge)

	req, _ = http.NewRequest("POST", h.url("/api/upload"), &zeroReader{maxBody})
	req.ContentLength = -1
	wantStatus(t, "h2 streamed body of exactly the limit", do(req), 200)
	if got := h.api.last(); got.BodyLen != maxBody {
		t.Fatalf("h2 upload: upstream read %d bytes", got.BodyLen)
	}

	req, _ = http.NewRequest("TRACE", h.url("/api/x"), nil)
	wantStatus(t, "h2 TRACE", do(req), http.StatusMethodNotAllowed)
}

func TestHTTP2OversizeStreamedResponseIsReset(t *testing.T) {
	h := limitedResponse(newHarness(t, withLimits(func(l *Limits) { l.MaxResponseBody = maxResp })))
	tr := &http.Transport{TLSClientConfig: h.tlsConfig(), ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: testTimeout}
	resp, err := cl.Get(h.url("/api/big?n=" + strconv.Itoa(maxResp+1)))
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("not HTTP/2: %s", resp.Proto)
	}
	if n, err := io.Copy(io.Discard, resp.Body); err == nil {
		t.Fatalf("an oversize h2 response completed normally (%d bytes)", n)
	}
	// The connection survives the reset of one stream.
	resp2, err := cl.Get(h.url("/relay/health"))
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	wantStatus(t, "health on the same h2 connection", resp2, 200)
}

func TestIdleKeepAliveConnectionIsClosed(t *testing.T) {
	h := newHarness(t, withLimits(func(l *Limits) { l.IdleTimeout = 300 * time.Millisecond }))
	c, err := h.dialTLS(h.tlsConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testTimeout))
	io.WriteString(c, "GET /relay/health HTTP/1.1\r\nHost: "+h.addr+"\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	wantStatus(t, "keep-alive request", resp, 200)
	if resp.Close {
		t.Fatal("the front closed a keep-alive connection after one request")
	}
	_, err = br.ReadByte()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("an idle keep-alive connection was never closed")
	}
}

// oneSessionCache offers the last session it was given under any name, as a
// client trying to carry a ticket from one server name to another would.
type oneSessionCache struct {
	mu sync.Mutex
	cs *tls.ClientSessionState
}

func (c *oneSessionCache) Get(string) (*tls.ClientSessionState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cs, c.cs != nil
}

func (c *oneSessionCache) Put(_ string, cs *tls.ClientSessionState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cs != nil {
		c.cs = cs
	}
}

// A session ticket issued under one server name is not a way around the
// unrecognized_name rule: resumed under an unknown name, the handshake
// fails and is counted, on TLS 1.3 and 1.2 alike.
func TestUnknownSNIFailsOnResumedSessions(t *testing.T) {
	for _, v := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		t.Run(tls.VersionName(v), func(t *testing.T) {
			h := newHarness(t)
			cache := &oneSessionCache{}
			cfg := func(name string) *tls.Config {
				return &tls.Config{
					ServerName: name, InsecureSkipVerify: true, // the attacker checks nothing
					ClientSessionCache: cache, MinVersion: v, MaxVersion: v, NextProtos: []string{"http/1.1"},
				}
			}
			// connect sends one request, so a TLS 1.3 ticket (sent after
			// the handshake) is read and stored.
			connect := func(name string) (tls.ConnectionState, error) {
				c, err := h.dialTLS(cfg(name))
				if err != nil {
					return tls.ConnectionState{}, err
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(testTimeout))
				io.WriteString(c, "GET /relay/health HTTP/1.1\r\nHost: "+extraName+"\r\nConnection: close\r\n\r\n")
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					return tls.ConnectionState{}, err
				}
				io.Copy(io.Discard, resp.Body)
				return c.ConnectionState(), nil
			}
			if _, err := connect(extraName); err != nil {
				t.Fatalf("first handshake under %s: %v", extraName, err)
			}
			cs, err := connect(extraName)
			if err != nil || !cs.DidResume {
				t.Fatalf("resuming under %s: resumed %v, err %v; the test would check nothing", extraName, cs.DidResume, err)
			}
			before := h.srv.SNIRejected()
			cs, err = connect("evil.example")
			if err == nil {
				t.Fatalf("a session resumed under an unknown name (resumed %v)", cs.DidResume)
			}
			if !strings.Contains(err.Error(), "unrecognized name") {
				t.Errorf("resumption under an unknown name: %v, want an unrecognized_name alert", err)
			}
			if got := h.srv.SNIRejected(); got != before+1 {
				t.Errorf("SNIRejected = %d, want %d", got, before+1)
			}
		})
	}
}

// TLS 1.2 offers only ECDHE suites with AEAD ciphers (AES-GCM,
// ChaCha20-Poly1305), for either identity key type; every other suite a
// client may offer, CBC-SHA1 among them, fails the handshake.
func TestTLS12OffersOnlyECDHEAEADSuites(t *testing.T) {
	h := newHarness(t)
	rsaCfg := h.idCfg
	rsaCfg.StateDir, rsaCfg.KeyType = t.TempDir()+"/rsa", pinning.KeyRSA3072
	rsaID, err := pinning.LoadOrCreate(rsaCfg)
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string][]uint16{
		"ecdsa": {tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256},
		"rsa":   {tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256},
	}
	for _, id := range []struct {
		name string
		id   *pinning.Identity
	}{{"ecdsa", h.id}, {"rsa", rsaID}} {
		if err := h.srv.Reload(h.opts, id.id); err != nil {
			t.Fatal(err)
		}
		for _, cs := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
			if !slices.Contains(cs.SupportedVersions, tls.VersionTLS12) {
				continue
			}
			cfg := h.tlsConfigFor("127.0.0.1", id.id.Pin)
			cfg.MaxVersion, cfg.CipherSuites = tls.VersionTLS12, []uint16{cs.ID}
			c, err := h.dialTLS(cfg)
			want := slices.Contains(allowed[id.name], cs.ID)
			if err == nil {
				got := c.ConnectionState().CipherSuite
				c.Close()
				if !want || got != cs.ID {
					t.Errorf("%s identity: TLS 1.2 handshake with only %s succeeded (negotiated %s)", id.name, cs.Name, tls.CipherSuiteName(got))
				}
				continue
			}
			if want {
				t.Errorf("%s identity: TLS 1.2 with %s: %v", id.name, cs.Name, err)
			}
			if strings.Contains(cs.Name, "ECDHE_"+strings.ToUpper(id.name)) && strings.Contains(cs.Name, "CBC") && !strings.Contains(err.Error(), "remote error") {
				t.Errorf("%s identity: %s refused by the client itself (%v), not by the front", id.name, cs.Name, err)
			}
		}
	}
}

// A session ticket does not outlive a rotation: a resumed session presents
// no certificate, so the client would keep seeing (and pinning) the old
// one. After Reload with a rotated identity, a client holding a ticket
// gets a full handshake and the new certificate.
func TestRotationEndsSessionResumption(t *testing.T) {
	for _, v := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		t.Run(tls.VersionName(v), func(t *testing.T) {
			h := newHarness(t)
			cache := &oneSessionCache{}
			connect := func() tls.ConnectionState {
				t.Helper()
				c, err := h.dialTLS(&tls.Config{
					ServerName: extraName, InsecureSkipVerify: true,
					ClientSessionCache: cache, MinVersion: v, MaxVersion: v, NextProtos: []string{"http/1.1"},
				})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(testTimeout))
				io.WriteString(c, "GET /relay/health HTTP/1.1\r\nHost: "+extraName+"\r\nConnection: close\r\n\r\n")
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				return c.ConnectionState()
			}
			connect()
			if cs := connect(); !cs.DidResume {
				t.Fatal("no resumption before the rotation; the test would check nothing")
			}
			rotated, err := pinning.Rotate(h.idCfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.srv.Reload(h.opts, rotated); err != nil {
				t.Fatal(err)
			}
			cs := connect()
			if cs.DidResume {
				t.Fatal("a session from before the rotation resumed")
			}
			if got := pinning.SPKIPin(cs.PeerCertificates[0]); got != rotated.Pin {
				t.Fatalf("after rotation the client saw pin %s, want %s", got, rotated.Pin)
			}
			if cs := connect(); !cs.DidResume {
				t.Error("sessions under the new identity no longer resume")
			}
		})
	}
}

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

func newUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(upstreamHandler())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func TestUpstreamBodies(t *testing.T) {
	srv := newUpstream(t)
	for _, tc := range []struct {
		path string
		n    int
		has  string
	}{
		{"/small", smallBodySize, ""},
		{"/big", bigBodySize, ""},
		{"/bulk?n=3", 3 * bigBodySize, ""},
		{"/health", -1, `"status":"ok"`},
		{"/api/health", -1, `"auth_required":true`},
	} {
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Errorf("%s: status %d", tc.path, resp.StatusCode)
		}
		if tc.n >= 0 && (len(b) != tc.n || resp.ContentLength != int64(tc.n)) {
			t.Errorf("%s: %d bytes, Content-Length %d, want %d", tc.path, len(b), resp.ContentLength, tc.n)
		}
		if tc.has != "" && !bytes.Contains(b, []byte(tc.has)) {
			t.Errorf("%s: body %q lacks %s", tc.path, b, tc.has)
		}
	}
	for _, q := range []string{"/bulk", "/bulk?n=0", "/bulk?n=9"} {
		resp, err := http.Get(srv.URL + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%s: status %d, want 400", q, resp.StatusCode)
		}
	}
	resp, err := http.Get(srv.URL + "/nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("/nope: status %d, want 404", resp.StatusCode)
	}
}

func dialPlain(t *testing.T, srv *httptest.Server) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	c.SetReadLimit(maxMessage)
	return c
}

func TestUpstreamRelayAuthThenEcho(t *testing.T) {
	srv := newUpstream(t)
	c := dialPlain(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := relayAuth(ctx, c, 7); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		typ  websocket.MessageType
		data []byte
	}{
		{websocket.MessageText, echoPayload(1024)},
		{websocket.MessageBinary, []byte{0, 1, 2, 255}},
		{websocket.MessageText, bytes.Repeat([]byte("y"), 100000)}, // past the default 32 KiB read limit
	} {
		if err := c.Write(ctx, m.typ, m.data); err != nil {
			t.Fatal(err)
		}
		typ, got, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if typ != m.typ || !bytes.Equal(got, m.data) {
			t.Errorf("echo of %v/%d bytes came back as %v/%d bytes", m.typ, len(m.data), typ, len(got))
		}
	}
}

func TestUpstreamRelayAuthOKCarriesID(t *testing.T) {
	srv := newUpstream(t)
	c := dialPlain(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.Write(ctx, websocket.MessageText, []byte(`{"channel":"system","type":"auth","id":"abc","payload":{"session_token":"x"}}`))
	_, b, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"channel":"system","type":"auth.ok","id":"abc","payload":{"session_token":"s-abc","expires_at":null}}`
	if string(b) != want {
		t.Errorf("auth reply %s, want %s", b, want)
	}
}

func TestUpstreamRelayRefusesNonAuthFirstFrame(t *testing.T) {
	srv := newUpstream(t)
	c := dialPlain(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"channel":"chat","type":"hello"}`)); err != nil {
		t.Fatal(err)
	}
	_, b, err := c.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"type":"auth.fail"`)) {
		t.Errorf("reply %s, want auth.fail", b)
	}
	_, _, err = c.Read(ctx)
	if websocket.CloseStatus(err) != 4001 {
		t.Errorf("close %v, want 4001", err)
	}
}

func TestEchoPayloadIsExactSize(t *testing.T) {
	for _, n := range []int{1, 10, 63, 64, 65, 1024, 4096} {
		if got := len(echoPayload(n)); got != n {
			t.Errorf("echoPayload(%d) has %d bytes", n, got)
		}
	}
}

func TestLoopbackOnly(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:9443", "127.0.0.2:1", "[::1]:9443"} {
		if err := loopbackOnly(ok); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"10.0.0.1:9443", "192.168.1.1:80", "localhost:9443", "0.0.0.0:1", "[::]:1", "8.8.8.8:53", "127.0.0.1", ""} {
		if err := loopbackOnly(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for _, bad := range []string{"ws://127.0.0.1:1/x", "wss://10.0.0.1:1/relay/ws", "wss://example.com/relay/ws"} {
		if err := wsTarget(bad); err == nil {
			t.Errorf("wsTarget(%q) accepted", bad)
		}
	}
	if err := wsTarget("wss://127.0.0.1:9443/relay/ws"); err != nil {
		t.Error(err)
	}
}

// A pinned TLS client that trusts the right key, refuses any other, never
// resumes, and offers only X25519.
func TestClientTLSPinsAndNeverResumes(t *testing.T) {
	var curves atomic.Value
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.TLS = &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		curves.Store(slices.Clone(h.SupportedCurves))
		return nil, nil
	}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the wrong-pin case fails the handshake on purpose
	srv.StartTLS()
	defer srv.Close()
	leaf := srv.Certificate()
	sum := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	pin := "sha256/" + base64.StdEncoding.EncodeToString(sum[:])
	addr := srv.Listener.Addr().String()

	cfg, err := clientTLS(pin, []string{"http/1.1"})
	if err != nil {
		t.Fatal(err)
	}
	var st atomic.Value
	for i := 0; i < 2; i++ {
		if err := oneHandshake(addr, cfg, &st); err != nil {
			t.Fatalf("handshake %d: %v", i, err)
		}
	}
	if cs := st.Load().(tls.ConnectionState); cs.DidResume || cs.CurveID != tls.X25519 {
		t.Errorf("resumed=%v curve=%v, want a full X25519 handshake", cs.DidResume, cs.CurveID)
	}
	if got := curves.Load().([]tls.CurveID); !slices.Equal(got, []tls.CurveID{tls.X25519}) {
		t.Errorf("client offered %v, want only X25519", got)
	}
	// The hybrid calibration offers only X25519MLKEM768 and gets it.
	pq := cfg.Clone()
	if pq.CurvePreferences, err = curveFlag("x25519mlkem768"); err != nil {
		t.Fatal(err)
	}
	var pqst atomic.Value
	if err := oneHandshake(addr, pq, &pqst); err != nil {
		t.Fatal(err)
	}
	if cs := pqst.Load().(tls.ConnectionState); cs.CurveID != tls.X25519MLKEM768 {
		t.Errorf("-curve x25519mlkem768 negotiated %v", cs.CurveID)
	}
	if got := curves.Load().([]tls.CurveID); !slices.Equal(got, []tls.CurveID{tls.X25519MLKEM768}) {
		t.Errorf("-curve x25519mlkem768 offered %v", got)
	}
	if _, err := curveFlag("p256"); err == nil {
		t.Error("-curve p256 accepted")
	}
	// A second pinned connection must also be a full handshake.
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.ConnectionState().DidResume {
		t.Error("second connection resumed a session")
	}
	c.Close()

	wrong := sha256.Sum256([]byte("another key"))
	bad, err := clientTLS("sha256/"+base64.StdEncoding.EncodeToString(wrong[:]), nil)
	if err != nil {
		t.Fatal(err)
	}
	var ignored atomic.Value
	if err := oneHandshake(addr, bad, &ignored); err == nil || !strings.Contains(err.Error(), "pin mismatch") {
		t.Errorf("wrong pin: %v, want a pin mismatch", err)
	}
}

func TestProcTreeCountsChildren(t *testing.T) {
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep binary:", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	self := os.Getpid()
	if got := tree([]int{self}); !slices.Contains(got, cmd.Process.Pid) || got[0] != self {
		t.Errorf("tree(%d) = %v, want it to hold the child %d", self, got, cmd.Process.Pid)
	}
	s, err := sampleProcs([]int{self})
	if err != nil {
		t.Fatal(err)
	}
	if s.n < 2 || s.rssKiB == 0 {
		t.Errorf("sample %+v: want >= 2 processes and some RSS", s)
	}
	// Scanning /proc burns CPU; the counter must move (ticks are 10 ms).
	before := s.cpuTicks
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if s2, _ := sampleProcs([]int{self}); s2.cpuTicks > before {
			break
		}
	}
	if s2, _ := sampleProcs([]int{self}); s2.cpuTicks <= before {
		t.Errorf("cpu ticks did not grow from %d", before)
	}
	if _, err := sampleProcs([]int{1 << 30}); err == nil {
		t.Error("a missing pid sampled without error")
	}
}

func TestStatFieldsSurvivesOddNames(t *testing.T) {
	// The command name of this test binary has no ')' but the parser must
	// use the last one; check it on our own stat line.
	f, err := statFields(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if ppid, _ := strconv.Atoi(f[1]); ppid != os.Getppid() {
		t.Errorf("ppid field %q, want %d", f[1], os.Getppid())
	}
}

func FuzzParseAuthFrame(f *testing.F) {
	for _, s := range []string{
		`{"channel":"system","type":"auth","id":"1","payload":{"session_token":"x"}}`,
		`{"channel":"system","type":"auth","payload":{}}`,
		`{"channel":"system","type":"auth","id":"` + strings.Repeat("a", 100) + `"}`,
		`{"channel":"system","type":"auth","id":"unterminated`,
		`{"channel":"chat","type":"auth","id":"1"}`,
		`{"type":"auth.ok"}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		id, ok := parseAuthFrame(b)
		if len(id) > 64 || strings.Contains(id, `"`) {
			t.Fatalf("id %q escapes its bound", id)
		}
		if ok && (!bytes.Contains(b, []byte(`"type":"auth"`)) || !bytes.Contains(b, []byte(`"channel":"system"`))) {
			t.Fatalf("accepted a frame that is not system/auth: %q", b)
		}
		if !ok && id != "" {
			t.Fatalf("refused frame returned id %q", id)
		}
	})
}

func FuzzDecodePin(f *testing.F) {
	sum := sha256.Sum256([]byte("k"))
	for _, s := range []string{
		"sha256/" + base64.StdEncoding.EncodeToString(sum[:]),
		"sha256/" + base64.StdEncoding.EncodeToString(sum[:31]),
		"sha1/" + base64.StdEncoding.EncodeToString(sum[:]),
		"sha256/!!!", "sha256/", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := decodePin(s)
		if err != nil {
			return
		}
		if !strings.HasPrefix(s, "sha256/") {
			t.Fatalf("accepted %q without sha256/", s)
		}
		if again := "sha256/" + base64.StdEncoding.EncodeToString(got[:]); again != s {
			// StdEncoding may accept non-canonical padding bits; the bytes
			// must still be what the string decodes to.
			raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "sha256/"))
			if !bytes.Equal(raw, got[:]) {
				t.Fatalf("%q decoded to %x", s, got)
			}
		}
	})
}

func FuzzParsePIDs(f *testing.F) {
	for _, s := range []string{"1", "1,2,3", " 4 , 5 ", "", ",", "0", "-1", "x", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pids, err := parsePIDs(s)
		if err != nil {
			return
		}
		for _, p := range pids {
			if p <= 0 {
				t.Fatalf("%q gave pid %d", s, p)
			}
		}
		if len(pids) > strings.Count(s, ",")+1 {
			t.Fatalf("%q gave %d pids", s, len(pids))
		}
	})
}

// The calibration seals and opens every record it counts: what it prints is
// CPU over real AEAD work, per byte.
func TestAEADFloorMeasuresWork(t *testing.T) {
	r, err := aeadFloor(50 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.bytes < 64*tlsRecord || r.bytes%tlsRecord != 0 {
		t.Fatalf("bytes = %d, want whole records, at least 64", r.bytes)
	}
	if r.cpuUS <= 0 || r.perGB() <= 0 {
		t.Fatalf("cpu %v µs, %v s/GB: want both > 0", r.cpuUS, r.perGB())
	}
	if !strings.Contains(r.line(), "cpu_s_per_gb=") {
		t.Fatalf("line %q lacks cpu_s_per_gb", r.line())
	}
}

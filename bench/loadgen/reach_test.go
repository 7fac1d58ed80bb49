package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/pinning"
)

// tlsUpstream serves h over TLS on 127.0.0.1 (httptest's certificate names
// 127.0.0.1) and returns its address and pin.
func tlsUpstream(t *testing.T, h http.Handler) (addr, pin string) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // wrong-pin cases fail handshakes on purpose
	srv.StartTLS()
	t.Cleanup(srv.Close)
	sum := sha256.Sum256(srv.Certificate().RawSubjectPublicKeyInfo)
	return ln.Addr().String(), "sha256/" + base64.StdEncoding.EncodeToString(sum[:])
}

func dialX(t *testing.T, addr, pin string) *xferConn {
	t.Helper()
	c, err := pinning.DialPinned(t.Context(), addr, frontServerName, pin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &xferConn{c: c, br: bufio.NewReaderSize(c, xferChunk), host: addr, buf: bytes.Repeat([]byte("u"), xferChunk)}
}

func TestSinkCountsTheBody(t *testing.T) {
	srv := newUpstream(t)
	for _, n := range []int{0, 1, 256<<10 + 7, 3 << 20} {
		resp, err := http.Post(srv.URL+"/sink", "application/octet-stream", bytes.NewReader(make([]byte, n)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != strconv.Itoa(n) {
			t.Errorf("POST %d bytes: HTTP %d %q", n, resp.StatusCode, b)
		}
	}
	resp, err := http.Get(srv.URL + "/sink")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /sink: HTTP %d, want 405", resp.StatusCode)
	}
}

// Downloads and uploads on one keep-alive connection, each checked byte for
// byte, and counted only when complete (upload: when the sink confirmed).
func TestXferOneConnectionBothWays(t *testing.T) {
	addr, pin := tlsUpstream(t, upstreamHandler())
	x := dialX(t, addr, pin)
	var moved atomic.Int64
	for i := 0; i < 3; i++ {
		if err := x.download("/big", &moved); err != nil {
			t.Fatalf("download %d: %v", i, err)
		}
		if err := x.upload("/sink", 1<<20+3, &moved); err != nil {
			t.Fatalf("upload %d: %v", i, err)
		}
	}
	if want := int64(3 * (bigBodySize + 1<<20 + 3)); moved.Load() != want {
		t.Errorf("moved %d bytes, want %d", moved.Load(), want)
	}
}

// A sink that miscounts, a short body and an error status are failures,
// never counted as moved bytes.
func TestXferRefusesWrongAnswers(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/liar", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "1")
	})
	mux.HandleFunc("/short", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, "only some")
		w.(http.Flusher).Flush()
		if hj, ok := w.(http.Hijacker); ok {
			c, _, _ := hj.Hijack()
			c.Close()
		}
	})
	mux.HandleFunc("/missing", http.NotFound)
	addr, pin := tlsUpstream(t, mux)
	var moved atomic.Int64
	if err := dialX(t, addr, pin).upload("/liar", 4096, &moved); err == nil || !strings.Contains(err.Error(), "sink counted") {
		t.Errorf("miscounting sink: %v", err)
	}
	if err := dialX(t, addr, pin).download("/short", &moved); err == nil {
		t.Error("a truncated body passed")
	}
	if err := dialX(t, addr, pin).download("/missing", &moved); err == nil || !strings.Contains(err.Error(), "HTTP 404") {
		t.Errorf("404: %v", err)
	}
	if moved.Load() != 9 {
		// The 9 bytes of the truncated body arrived before the cut; nothing
		// of the refused upload may be counted.
		t.Errorf("moved %d, want 9", moved.Load())
	}
}

// cmdXfer end to end against a direct pinned TLS server: one dial for the
// whole run, no cut, and a wrong pin fails before anything moves.
func TestCmdXferDirect(t *testing.T) {
	addr, pin := tlsUpstream(t, upstreamHandler())
	out := captureStdout(t, func() error {
		return cmdXfer([]string{"-mode", "download", "-addr", addr, "-pin", pin, "-path", "/big", "-duration", "300ms", "-warmup", "0s"})
	})
	for _, want := range []string{"mode=download", "via=direct", "dials=1", "cut=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("output %q lacks %s", out, want)
		}
	}
	out = captureStdout(t, func() error {
		return cmdXfer([]string{"-mode", "upload", "-addr", addr, "-pin", pin, "-path", "/sink", "-size", "1048576", "-duration", "300ms", "-warmup", "0s"})
	})
	if !strings.Contains(out, "mode=upload") || !strings.Contains(out, "cut=0") {
		t.Errorf("upload output %q", out)
	}
	wrong := sha256.Sum256([]byte("other"))
	err := cmdXfer([]string{"-addr", addr, "-pin", "sha256/" + base64.StdEncoding.EncodeToString(wrong[:]), "-duration", "100ms"})
	if err == nil || !strings.Contains(err.Error(), "dial direct") {
		t.Errorf("wrong pin: %v", err)
	}
	if err := cmdXfer([]string{"-addr", "10.1.2.3:443", "-pin", pin}); err == nil {
		t.Error("a non-loopback target was accepted")
	}
}

func captureStdout(t *testing.T, f func() error) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() { b, _ := io.ReadAll(r); done <- b }()
	ferr := f()
	os.Stdout = old
	w.Close()
	out := string(<-done)
	if ferr != nil {
		t.Fatalf("%v (output %q)", ferr, out)
	}
	return out
}

func TestCredFileIsPrivateAndRoundTrips(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "cred.json")
	tok := wire.NewToken()
	in := reachCred{"wss://127.0.0.1:9444/v1/connect", wire.NewID().String(), "route", tok}
	if err := writeCred(p, in); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	out, err := loadCred(p)
	if err != nil {
		t.Fatal(err)
	}
	if out != in {
		t.Error("credential changed on the way through the file")
	}
	if s := fmt.Sprintf("%v %+v %s", out, out, out.Token); strings.Contains(s, string(tok)) {
		t.Error("formatting a credential shows the token")
	}
	for _, u := range []string{"wss://10.0.0.1:9444/v1/connect", "wss://broker.example/v1/connect", "ws://127.0.0.1:1/v1/connect", "wss://127.0.0.1:1/other"} {
		b, _ := json.Marshal(credFile{u, in.HostID, "route", string(tok)})
		os.WriteFile(p, b, 0o600)
		if _, err := loadCred(p); err == nil {
			t.Errorf("broker %s accepted", u)
		}
	}
}

func TestReadHosts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "h.jsonl")
	os.WriteFile(p, []byte(`{"host_id":"a","host_token":"t1"}`+"\n\n"+`{"host_id":"b","host_token":"t2"}`+"\n"), 0o600)
	hs, err := readHosts(p, 2)
	if err != nil || len(hs) != 2 || hs[1].HostID != "b" || hs[1].Token != "t2" {
		t.Fatalf("%v %+v", err, hs)
	}
	if _, err := readHosts(p, 3); err == nil {
		t.Error("3 hosts read from a file of 2")
	}
	os.WriteFile(p, []byte(`{"host_id":"a"}`+"\n"), 0o600)
	if _, err := readHosts(p, 1); err == nil {
		t.Error("a line without a token was accepted")
	}
}

func authOK(payload string) []byte {
	return []byte(`{"channel":"system","type":"auth.ok","id":"1","payload":` + payload + `}`)
}

func TestParseRouteCredential(t *testing.T) {
	tok := string(wire.NewToken())
	good := `{"session_token":"s","route_credential":{"kind":"broker_route","broker_url":"wss://127.0.0.1:1/v1/connect","host_id":"h","credential_id":"c","token":"` + tok + `","expires_at":1790000000}}`
	rc, err := parseRouteCredential(authOK(good))
	if err != nil || rc.Token != tok || rc.CredentialID != "c" {
		t.Fatalf("%v %+v", err, rc)
	}
	for name, frame := range map[string][]byte{
		"no credential": authOK(`{"session_token":"s"}`),
		"other kind":    authOK(strings.Replace(good, "broker_route", "relay", 1)),
		"float expiry":  authOK(strings.Replace(good, "1790000000", "1790000000.5", 1)),
		"short token":   authOK(strings.Replace(good, tok, "abc", 1)),
		"auth.fail":     []byte(`{"channel":"system","type":"auth.fail","payload":{}}`),
		"not json":      []byte(`{`),
	} {
		if _, err := parseRouteCredential(frame); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func FuzzParseRouteCredential(f *testing.F) {
	tok := strings.Repeat("A", 43)
	f.Add(authOK(`{"route_credential":{"kind":"broker_route","broker_url":"wss://127.0.0.1:1/v1/connect","host_id":"h","credential_id":"c","token":"` + tok + `","expires_at":1}}`))
	f.Add(authOK(`{"route_credential":null}`))
	f.Add(authOK(`{"route_credential":{"kind":"broker_route","token":"` + tok + `","expires_at":"1"}}`))
	f.Add([]byte(`{"channel":"system","type":"auth.ok"}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, b []byte) {
		rc, err := parseRouteCredential(b)
		if err != nil {
			return
		}
		if rc.Kind != "broker_route" || !wire.ValidWireToken(rc.Token) {
			t.Fatalf("accepted %+v", rc)
		}
		if _, err := strconv.ParseInt(string(rc.ExpiresAt), 10, 64); err != nil {
			t.Fatalf("accepted expires_at %s", rc.ExpiresAt)
		}
	})
}

func FuzzParseWatch(f *testing.F) {
	for _, s := range []string{"front=1", "front=1,upstream=2", "", "x", "=1", "a=0", "a=-3", "a b=1", "a=1,,b=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w, err := parseWatch(s)
		if err != nil {
			return
		}
		if len(w.names) != len(w.pids) {
			t.Fatal("names and pids differ in length")
		}
		for i, n := range w.names {
			if n == "" || strings.ContainsAny(n, " =") || w.pids[i] <= 0 {
				t.Fatalf("%q gave %q=%d", s, n, w.pids[i])
			}
		}
	})
}

// The pinned dialer must refuse the wrong key before a request is written.
func TestFrontDialerPins(t *testing.T) {
	var hits atomic.Int64
	addr, pin := tlsUpstream(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	d, err := newFrontDialer(addr, pin, "", "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	wrong := sha256.Sum256([]byte("x"))
	d2, _ := newFrontDialer(addr, "sha256/"+base64.StdEncoding.EncodeToString(wrong[:]), "", "")
	if _, err := d2.dial(t.Context()); err == nil {
		t.Error("wrong pin dialed")
	}
	if d.dials.Load() != 1 || d2.dials.Load() != 1 || hits.Load() != 0 {
		t.Errorf("dials %d/%d hits %d", d.dials.Load(), d2.dials.Load(), hits.Load())
	}
	if _, err := newFrontDialer(addr, pin, filepath.Join(t.TempDir(), "none.json"), ""); err == nil {
		t.Error("a missing credential file was accepted")
	}
}

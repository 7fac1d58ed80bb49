package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/internal/daemon"
	"github.com/hermes-securelink/securelink/internal/testfake"
	"github.com/hermes-securelink/securelink/pinning"
)

// taggedAPI answers every request with its tag, to tell two upstreams apart.
func taggedAPI(t *testing.T, tag string, delay time.Duration) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if delay > 0 && r.URL.Path == "/slow" {
			time.Sleep(delay)
		}
		w.Write([]byte(tag))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// eitherPin trusts exactly the given pins (SPKI SHA-256), as a client that
// was re-paired mid-test would.
func eitherPin(pins ...string) *tls.Config {
	return &tls.Config{
		InsecureSkipVerify: true, // replaced by the exact pin check below
		VerifyConnection: func(cs tls.ConnectionState) error {
			sum := sha256.Sum256(cs.PeerCertificates[0].RawSubjectPublicKeyInfo)
			got := "sha256/" + base64.StdEncoding.EncodeToString(sum[:])
			for _, p := range pins {
				if got == p {
					return nil
				}
			}
			return errors.New("pin mismatch")
		},
	}
}

func rewriteAPI(t *testing.T, cfgPath, from, to string) {
	t.Helper()
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), `api: "`+from+`"`, `api: "`+to+`"`, 1)
	if s == string(b) {
		t.Fatal("api upstream not found in config")
	}
	os.WriteFile(cfgPath, []byte(s), 0o600)
}

func TestReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	relay := testfake.NewRelay(t, nil)
	apiA, apiB := taggedAPI(t, "A", 0), taggedAPI(t, "B", 0)
	cfgPath := writeConfig(t, dir, relay.URL.String())
	rewriteAPI(t, cfgPath, "http://127.0.0.1:1", apiA.URL)
	d := startDaemon(t, cfgPath)
	oldPin := d.pin

	// Rotate on disk first (the daemon keeps serving the old identity), and
	// point the API at another upstream.
	if _, se, err := runCLI(t, "pin", "--rotate", "--yes", "--config", cfgPath); err != nil {
		t.Fatalf("rotate: %v %s", err, se)
	}
	newPin := configuredPin(t, cfgPath)
	rewriteAPI(t, cfgPath, apiA.URL, apiB.URL)
	tlsCfg := eitherPin(oldPin, newPin)

	// 50 open, authenticated WebSockets through /relay/ws, on the old
	// identity (a source may hold only 5 unauthenticated ones).
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	var socks []*websocket.Conn
	for i := 0; i < 50; i++ {
		c, _, err := websocket.Dial(ctx, "wss://"+d.addr+"/relay/ws", &websocket.DialOptions{HTTPClient: wsClient})
		if err != nil {
			t.Fatalf("ws %d: %v", i, err)
		}
		defer c.CloseNow()
		if v := testfake.Authenticate(t, c, testfake.GoodCode); v != testfake.AuthOKMsg {
			t.Fatalf("ws %d: verdict %s", i, v)
		}
		socks = append(socks, c)
	}

	// A stream of HTTP requests (fresh handshakes and keep-alive) while the
	// daemon reloads.
	var failed, served atomic.Int64
	var seenB atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			tr := &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: w%2 == 0}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := c.Get("https://" + d.addr + "/api/x")
				if err != nil {
					failed.Add(1)
					t.Logf("request failed: %v", err)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
					t.Logf("status %d", resp.StatusCode)
					continue
				}
				if string(b) == "B" {
					seenB.Store(true)
				}
				served.Add(1)
			}
		}(w)
	}
	time.Sleep(300 * time.Millisecond)
	// A storm: 20 reloads while the load runs; the first applies the change.
	for range 20 {
		d.cmd.Process.Signal(syscall.SIGHUP)
		time.Sleep(25 * time.Millisecond)
	}

	// Wait until the new identity is served and the new upstream answers.
	eventually(t, 15*time.Second, func() string { return "reload not applied; daemon: " + d.stderr.String() }, seenB.Load)
	resp, err := pinnedGet(t, d.addr, newPin, "/relay/health")
	if err != nil {
		t.Fatalf("new pin not served after reload: %v", err)
	}
	resp.Body.Close()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	// Every WebSocket opened before the reload still echoes.
	for i, c := range socks {
		msg := fmt.Sprintf("still here %d", i)
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatalf("ws %d dropped by reload: %v", i, err)
		}
		_, b, err := c.Read(ctx)
		if err != nil || string(b) != msg {
			t.Fatalf("ws %d after reload: %q %v", i, b, err)
		}
	}
	if failed.Load() != 0 || served.Load() == 0 {
		t.Fatalf("%d requests failed, %d served", failed.Load(), served.Load())
	}
}

func TestGracefulStopFinishesInFlight(t *testing.T) {
	dir := t.TempDir()
	api := taggedAPI(t, "done", 1500*time.Millisecond)
	cfgPath := writeConfig(t, dir, echoRelay(t))
	rewriteAPI(t, cfgPath, "http://127.0.0.1:1", api.URL)
	d := startDaemon(t, cfgPath)

	type result struct {
		body string
		err  error
	}
	// Open WebSockets must get 1001 when the daemon stops.
	cfg, err := pinning.PinnedTLSConfig("127.0.0.1", d.pin)
	if err != nil {
		t.Fatal(err)
	}
	wsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var socks []*websocket.Conn
	for i := 0; i < 5; i++ {
		c, _, err := websocket.Dial(ctx, "wss://"+d.addr+"/relay/ws", &websocket.DialOptions{HTTPClient: wsClient})
		if err != nil {
			t.Fatalf("ws %d: %v", i, err)
		}
		defer c.CloseNow()
		socks = append(socks, c)
	}
	res := make(chan result, 1)
	go func() {
		resp, err := pinnedGet(t, d.addr, d.pin, "/api/slow")
		if err != nil {
			res <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		res <- result{string(b), err}
	}()
	time.Sleep(300 * time.Millisecond) // the request is in flight upstream
	start := time.Now()
	d.cmd.Process.Signal(syscall.SIGTERM)
	r := <-res
	if r.err != nil || r.body != "done" {
		t.Fatalf("in-flight request cut by SIGTERM: %q %v", r.body, r.err)
	}
	for i, c := range socks {
		_, _, err := c.Read(ctx)
		if websocket.CloseStatus(err) != websocket.StatusGoingAway {
			t.Fatalf("ws %d on SIGTERM: %v, want close 1001", i, err)
		}
	}
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("exit status after SIGTERM: %v", err)
	}
	if time.Since(start) > daemon.ShutdownGrace+5*time.Second {
		t.Fatalf("stop took %s, beyond the grace", time.Since(start))
	}
	// New connections are refused once stopped.
	if _, err := pinnedGet(t, d.addr, d.pin, "/relay/health"); err == nil {
		t.Fatal("daemon still answering after it exited")
	}
}

// waitReloads waits until the daemon logged n completed reloads.
func waitReloads(t *testing.T, d *daemonProc, n int) {
	t.Helper()
	eventually(t, 10*time.Second, func() string { return fmt.Sprintf("fewer than %d reloads: %s", n, d.stderr.String()) }, func() bool {
		return strings.Count(d.stderr.String(), `"event":"reloaded"`) >= n
	})
}

// A SIGHUP that changes nothing reports nothing; a reach section that really
// changed is reported (the connector keeps the settings it started with).
func TestReloadReportsOnlyRealReachChanges(t *testing.T) {
	reachSection := func(dir string, maxStreams int) string {
		tokenFile := filepath.Join(dir, "host.token")
		os.WriteFile(tokenFile, []byte(strings.Repeat("t", 43)), 0o600)
		return fmt.Sprintf("reach:\n  enabled: true\n  broker_url: \"wss://127.0.0.1:1/v1/connect\"\n  host_id: \"AAAAAAAAAAAAAAAAAAAAAA\"\n  host_token_file: %q\n  max_streams: %d\n",
			tokenFile, maxStreams)
	}
	const partial = `"event":"reload_partial"`
	t.Run("disabled", func(t *testing.T) {
		dir := t.TempDir()
		cfgPath := writeConfig(t, dir, echoRelay(t))
		d := startDaemon(t, cfgPath)
		d.cmd.Process.Signal(syscall.SIGHUP)
		waitReloads(t, d, 1)
		if strings.Contains(d.stderr.String(), partial) {
			t.Fatalf("an unchanged configuration with Reach disabled reported a partial reload:\n%s", d.stderr.String())
		}
		appendConfig(t, cfgPath, reachSection(dir, 16))
		d.cmd.Process.Signal(syscall.SIGHUP)
		waitReloads(t, d, 2)
		if !strings.Contains(d.stderr.String(), "reach settings changed") {
			t.Fatalf("enabling Reach by reload was not reported:\n%s", d.stderr.String())
		}
	})
	t.Run("enabled", func(t *testing.T) {
		dir := t.TempDir()
		cfgPath := writeConfig(t, dir, echoRelay(t))
		base, _ := os.ReadFile(cfgPath)
		appendConfig(t, cfgPath, reachSection(dir, 16))
		d := startDaemon(t, cfgPath)
		d.cmd.Process.Signal(syscall.SIGHUP)
		waitReloads(t, d, 1)
		if strings.Contains(d.stderr.String(), partial) {
			t.Fatalf("an unchanged configuration with Reach enabled reported a partial reload:\n%s", d.stderr.String())
		}
		os.WriteFile(cfgPath, append(base, reachSection(dir, 8)...), 0o600)
		d.cmd.Process.Signal(syscall.SIGHUP)
		waitReloads(t, d, 2)
		if !strings.Contains(d.stderr.String(), "reach settings changed") {
			t.Fatalf("a new reach.max_streams was not reported:\n%s", d.stderr.String())
		}
	})
}

package main

// The broker process killed with SIGKILL in the middle of a transfer that a
// client runs through `securelink connect`, and restarted with the same
// files (reach.md "Host connector", "Broker state").

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/testfake"
	"github.com/hermes-securelink/securelink/internal/trust"
	"github.com/hermes-securelink/securelink/pinning"
)

// tlsTap terminates the broker's TLS in front of a broker serving
// plaintext on loopback (the supported TLS-terminating-proxy setup) and
// records every byte of every connection as the broker process sees it.
// When the broker's side of a connection ends, the peer's connection is
// reset, not closed with a TLS alert: to the connector and the clients the
// broker's death looks like a crashed host.
type tlsTap struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	recs    []*testfake.Recorder
}

func startTLSTap(t *testing.T, certFile, keyFile, backend string) *tlsTap {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tap := &tlsTap{ln: raw, backend: backend}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
	var wg sync.WaitGroup
	t.Cleanup(func() { raw.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := raw.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				tap.serve(c.(*net.TCPConn), cfg)
			}()
		}
	}()
	return tap
}

func (tap *tlsTap) serve(raw *net.TCPConn, cfg *tls.Config) {
	defer raw.Close()
	tc := tls.Server(raw, cfg)
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	if tc.Handshake() != nil {
		return
	}
	tc.SetDeadline(time.Time{})
	be, err := net.DialTimeout("tcp", tap.backend, 5*time.Second)
	if err != nil {
		raw.SetLinger(0)
		return
	}
	defer be.Close()
	rec := &testfake.Recorder{}
	tap.mu.Lock()
	tap.recs = append(tap.recs, rec)
	tap.mu.Unlock()
	front := rec.Wrap(tc)
	go func() {
		io.Copy(be, front)
		be.Close()
	}()
	io.Copy(front, be)
	raw.SetLinger(0) // the broker's side ended: reset, as a dead host would
}

func (tap *tlsTap) addr() string { return tap.ln.Addr().String() }

// seen reports whether any connection so far carried needle where the
// broker could read it, and how many bytes the tap recorded in all.
func (tap *tlsTap) seen(needle []byte) (found bool, total int) {
	tap.mu.Lock()
	recs := append([]*testfake.Recorder(nil), tap.recs...)
	tap.mu.Unlock()
	for _, r := range recs {
		// A capture cut by the kill may end inside a frame; Contains still
		// searches what decodes.
		if ok, _ := r.Contains(needle); ok {
			found = true
		}
		total += len(r.Sent()) + len(r.Received())
	}
	return found, total
}

// TestFaultBrokerKill9MidTransfer: a client downloads a large API body
// through `securelink connect` with a route credential, and the broker
// process is killed with SIGKILL in the middle. The download fails with an
// error (never a short body read as complete); the connector registers
// again within the backoff it announced once the broker is back on the same
// files; the route credential handed out before the crash opens a stream
// through the same `connect`; and the broker never saw the body, the path,
// the pairing code or the session token.
func TestFaultBrokerKill9MidTransfer(t *testing.T) {
	const total, head = 16 << 20, 4 << 20
	marker := []byte("api-body-plaintext-marker|")
	const apiPath = "/api/v1/fault-download-path-marker"

	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	certFile, keyFile := brokerCert(t, dir)
	bport := freePort(t)
	bcfg := writeBrokerConfig(t, dir, fmt.Sprintf("listen: \"127.0.0.1:%d\"\ninsecure_plaintext: true\n", bport))
	hostID, hostToken := addHost(t, bcfg)
	broker, _, bstderr := startLineProc(t, "broker listening", "broker", "serve", "--config", bcfg)
	tap := startTLSTap(t, certFile, keyFile, fmt.Sprintf("127.0.0.1:%d", bport))

	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != strings.TrimPrefix(apiPath, "/api") {
			w.Write([]byte(`{"status":"ok"}`))
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(total))
		body := bytes.Repeat(marker, total/len(marker)+1)[:total]
		if _, err := w.Write(body[:head]); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		once.Do(func() { close(started) })
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Write(body[head:])
	}))
	t.Cleanup(api.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	relay := testfake.NewRelay(t, nil)

	tokenFile := filepath.Join(dir, "host.token")
	os.WriteFile(tokenFile, []byte(hostToken+"\n"), 0o600)
	cfgPath := writeConfig(t, dir, relay.URL.String())
	rewriteAPI(t, cfgPath, "http://127.0.0.1:1", api.URL)
	appendConfig(t, cfgPath, fmt.Sprintf("reach:\n  enabled: true\n  broker_url: \"wss://%s/v1/connect\"\n  host_id: %q\n  host_token_file: %q\n  ca_file: %q\n",
		tap.addr(), hostID, tokenFile, certFile))
	d := startDaemon(t, cfgPath)
	cl := waitReachConnected(t, dir, d)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A phone's first session: the bootstrap from the daemon, /relay/ws
	// through the broker, and the route credential in the auth.ok.
	boot, ident := bootstrapAndIdentity(t, ctx, cl)
	candidate := func(kind string, token wire.Secret, exp int64) client.Candidate {
		t.Helper()
		c, err := client.NewCandidate(1, client.CandidateBroker{ProtocolVersion: 1, URL: boot.BrokerURL, HostID: boot.HostID,
			CredentialKind: kind, Token: token, ExpiresAt: exp}, ident.URL, ident.PinSHA256, ident.CertDER)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	bootCand := candidate("bootstrap", wire.Secret(boot.Token), boot.ExpiresAt)
	ccfg := client.CandidateConfig(bootCand)
	var err error
	if ccfg.RootCAs, err = trust.BrokerRoots(certFile); err != nil {
		t.Fatal(err)
	}
	host, _ := bootCand.Authority()
	inner, err := client.DialTLS(ctx, ccfg, host, ident.PinSHA256)
	if err != nil {
		t.Fatalf("the bootstrap stream: %v", err)
	}
	_, aport, _ := net.SplitHostPort(d.addr)
	authority := net.JoinHostPort(host, aport)
	_, authOK := testfake.RelayWS(t, inner, "wss://"+authority+"/relay/ws", string(testfake.AuthFrame(testfake.GoodCode)))
	var ok struct {
		Payload struct {
			RC *struct {
				CredentialID string      `json:"credential_id"`
				Token        wire.Secret `json:"token"`
				ExpiresAt    int64       `json:"expires_at"`
			} `json:"route_credential"`
		} `json:"payload"`
	}
	if err := json.Unmarshal(authOK, &ok); err != nil || ok.Payload.RC == nil || ok.Payload.RC.Token == "" {
		t.Fatalf("auth.ok without a route credential: %v", err)
	}
	rc := ok.Payload.RC

	// `connect` with the route credential, and a download through it.
	cj, _ := candidate("route", rc.Token, rc.ExpiresAt).QRJSON()
	candFile := filepath.Join(dir, "route.json")
	os.WriteFile(candFile, cj, 0o600)
	lport := freePort(t)
	startLineProc(t, "forwarding", "connect", "--candidate", candFile, "--listen", fmt.Sprintf("127.0.0.1:%d", lport), "--ca-file", certFile)
	pinned, err := pinning.PinnedTLSConfig(host, ident.PinSHA256)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: pinned, DisableKeepAlives: true, DisableCompression: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", lport))
		}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	resp, err := hc.Get("https://" + authority + apiPath)
	if err != nil {
		t.Fatalf("download through connect: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != total {
		t.Fatalf("download: %d, Content-Length %d", resp.StatusCode, resp.ContentLength)
	}
	if n, err := io.CopyN(io.Discard, resp.Body, head/2); err != nil {
		t.Fatalf("the first %d bytes: %d %v", head/2, n, err)
	}
	<-started
	if found, n := tap.seen(marker[:16]); found || n < head/2 {
		t.Fatalf("before the kill: marker seen by the broker %v, %d bytes through the broker", found, n)
	}

	before, err := reachStatus(cl)
	if err != nil || before.State != connector.StateConnected {
		t.Fatalf("status before the kill: %+v %v", before, err)
	}
	broker.Process.Kill() // SIGKILL: no close frames, no shutdown write
	broker.Wait()
	n, err := io.Copy(io.Discard, resp.Body)
	if got := head/2 + n; err == nil || got >= total {
		t.Fatalf("the download cut by the broker's death: %d of %d bytes, error %v; want an error", got, total, err)
	}
	t.Logf("the client saw: %v", err)
	eventually(t, 20*time.Second, func() string { return "the connector did not notice the broker's death" }, func() bool {
		st, err := reachStatus(cl)
		return err == nil && st.State != connector.StateConnected
	})

	startLineProc(t, "broker listening", "broker", "serve", "--config", bcfg)
	restarted := time.Now()
	st, err := reachStatus(cl)
	if err != nil {
		t.Fatal(err)
	}
	// The connector waits at most min(60 s, 2ⁿ s)·1.25 for attempt n;
	// once the broker is up it must be back by the retry it announced
	// (or at once if it is dialing), plus a registration's worth of slack.
	due := restarted
	if st.State == connector.StateBackoff && st.RetryAt != nil {
		due = *st.RetryAt
	}
	if limit := time.Duration(1.25 * float64(time.Second) * math.Min(60, math.Pow(2, float64(st.Attempts-before.Attempts)))); due.Sub(restarted) > limit {
		t.Fatalf("after %d reconnect attempts the connector announced a retry in %v, over the contract's %v", st.Attempts-before.Attempts, due.Sub(restarted), limit)
	}
	eventually(t, time.Until(due)+10*time.Second, func() string {
		st, _ := reachStatus(cl)
		return fmt.Sprintf("the connector did not register again by its retry at %v: %+v\n%s", due, st, d.stderr.String())
	}, func() bool {
		st, err := reachStatus(cl)
		return err == nil && st.State == connector.StateConnected && st.Attempts > before.Attempts
	})
	t.Logf("registered again %v after the restart (retry announced for %v)", time.Since(restarted).Round(time.Millisecond), due.Sub(restarted).Round(time.Millisecond))

	// The route credential from before the crash still opens a stream,
	// through the same `connect`.
	hr, err := hc.Get("https://" + authority + "/relay/health")
	if err != nil {
		t.Fatalf("the route credential after the restart: %v\nbroker: %s", err, bstderr.String())
	}
	body, _ := io.ReadAll(hr.Body)
	hr.Body.Close()
	if hr.StatusCode != 200 || !strings.Contains(string(body), "hermes_secure_proxy") {
		t.Fatalf("through the restarted broker: %d %q", hr.StatusCode, body)
	}

	// Nothing inside the inner TLS reached the broker, before, during or
	// after the crash.
	for _, needle := range [][]byte{marker[:16], []byte(strings.TrimPrefix(apiPath, "/api/v1/")),
		[]byte(testfake.SessionToken), []byte(`"pairing_code"`), []byte("auth.ok"), []byte("hermes_secure_proxy")} {
		if found, _ := tap.seen(needle); found {
			t.Errorf("the broker saw %q in plaintext", needle)
		}
	}
	if found, _ := tap.seen([]byte(hostToken)); !found {
		t.Error("the tap never saw the host's registration: it records nothing")
	}
}

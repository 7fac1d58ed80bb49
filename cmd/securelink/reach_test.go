package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/pinning"
)

// reachStack is a broker, and a daemon with Reach on that registered with it.
type reachStack struct {
	dir, cfgPath, certFile string
	hostToken              string
	frontMetrics           string // host:port
	brokerMetrics          string
	d                      *daemonProc
	admin                  *admin.Client
}

func startReachStack(t *testing.T) *reachStack {
	t.Helper()
	return startReachStackWith(t, "", "")
}

// startReachStackWith adds brokerYAML to the broker's configuration and
// reachYAML (indented keys) to the front's reach block.
func startReachStackWith(t *testing.T, brokerYAML, reachYAML string) *reachStack {
	t.Helper()
	rs := launchReachStack(t, brokerYAML, reachYAML, "")
	rs.admin = waitReachConnected(t, rs.dir, rs.d)
	return rs
}

// launchReachStack starts the broker and the daemon without waiting for the
// registration; a non-empty token replaces the host token the front reads.
func launchReachStack(t *testing.T, brokerYAML, reachYAML, token string) *reachStack {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	certFile, keyFile := brokerCert(t, dir)
	bport := freePort(t)
	bmetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	fmetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	bcfg := writeBrokerConfig(t, dir, fmt.Sprintf("listen: \"127.0.0.1:%d\"\ntls: {cert_file: %s, key_file: %s}\nmetrics: {listen: %q}\n%s",
		bport, certFile, keyFile, bmetrics, brokerYAML))
	hostID, hostToken := addHost(t, bcfg)
	startLineProc(t, "broker listening", "broker", "serve", "--config", bcfg)

	tokenFile := filepath.Join(dir, "host.token")
	if token == "" {
		token = hostToken
	}
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	cfgPath := writeConfig(t, dir, echoRelay(t))
	appendConfig(t, cfgPath, fmt.Sprintf("reach:\n  enabled: true\n  broker_url: \"wss://127.0.0.1:%d/v1/connect\"\n  host_id: %q\n  host_token_file: %q\n  ca_file: %q\n%smetrics:\n  listen: %q\n",
		bport, hostID, tokenFile, certFile, reachYAML, fmetrics))
	d := startDaemon(t, cfgPath)
	return &reachStack{dir: dir, cfgPath: cfgPath, certFile: certFile, hostToken: hostToken,
		frontMetrics: fmetrics, brokerMetrics: bmetrics, d: d,
		admin: admin.NewClient(filepath.Join(dir, "state", "admin.sock"))}
}

// reachStatus is the connector's status as the daemon's admin socket reports it.
func reachStatus(cl *admin.Client) (connector.Status, error) {
	st, err := cl.Status(context.Background())
	return st.Reach, err
}

// waitReachConnected waits for the connector of the daemon whose state
// directory is dir/state to register, and returns its admin client.
func waitReachConnected(t *testing.T, dir string, d *daemonProc) *admin.Client {
	t.Helper()
	cl := admin.NewClient(filepath.Join(dir, "state", "admin.sock"))
	eventually(t, 30*time.Second, func() string { return "connector never connected: " + d.stderr.String() }, func() bool {
		st, err := reachStatus(cl)
		return err == nil && st.State == connector.StateConnected
	})
	return cl
}

// bootstrapAndIdentity asks the daemon for a fresh bootstrap and its
// identity, what `securelink pair` puts in a broker candidate.
func bootstrapAndIdentity(t *testing.T, ctx context.Context, cl *admin.Client) (admin.BootstrapReply, admin.Identity) {
	t.Helper()
	boot, _, err := cl.Bootstrap(ctx, admin.BootstrapRequest{TTLSeconds: 600})
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	ident, err := cl.Identity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return boot, ident
}

func TestReachEndToEndFromTheCLI(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is required")
	}
	rs := startReachStack(t)
	dir, certFile, d, cl := rs.dir, rs.certFile, rs.d, rs.admin
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A bootstrap from the daemon, as `securelink pair` would get it.
	boot, ident := bootstrapAndIdentity(t, ctx, cl)
	cand, err := client.NewCandidate(1, client.CandidateBroker{ProtocolVersion: 1, URL: boot.BrokerURL, HostID: boot.HostID,
		CredentialKind: "bootstrap", Token: wire.Secret(boot.Token), ExpiresAt: boot.ExpiresAt}, ident.URL, ident.PinSHA256, ident.CertDER)
	if err != nil {
		t.Fatal(err)
	}
	cj, _ := cand.QRJSON()
	candFile := filepath.Join(dir, "candidate.json")
	os.WriteFile(candFile, cj, 0o600)

	lport := freePort(t)
	startLineProc(t, "forwarding", "connect", "--candidate", candFile, "--listen", fmt.Sprintf("127.0.0.1:%d", lport), "--ca-file", certFile)

	_, aport, _ := net.SplitHostPort(d.addr)
	curl := func() ([]byte, error) {
		return exec.Command("curl", "-sS", "--max-time", "15", "-k",
			"--pinnedpubkey", "sha256//"+strings.TrimPrefix(d.pin, "sha256/"),
			"--connect-to", fmt.Sprintf("127.0.0.1:%s:127.0.0.1:%d", aport, lport),
			"https://127.0.0.1:"+aport+"/relay/health").CombinedOutput()
	}
	out, err := curl()
	if err != nil || !strings.Contains(string(out), `"surface":"hermes_secure_proxy"`) {
		t.Fatalf("curl through connect + broker: %v\n%s\ndaemon: %s", err, out, d.stderr.String())
	}
	// The bootstrap served its one connection.
	if out, err := curl(); err == nil {
		t.Fatalf("a spent bootstrap served a second connection: %s", out)
	}

	// Both processes expose their Reach state, and no credential.
	front := scrapeText(t, rs.frontMetrics)
	broker := scrapeText(t, rs.brokerMetrics)
	for _, want := range []string{"securelink_reach_connected 1", "securelink_reach_attempts_total 1", "securelink_reach_streams_completed_total", "securelink_reach_permanent_error 0", "securelink_reach_credit 1"} {
		if !hasSample(front, want) {
			t.Errorf("front metrics lack %q", want)
		}
	}
	for _, want := range []string{"securelink_broker_hosts_online 1", `securelink_broker_events_total{kind="stream",outcome="matched"} 1`} {
		if !hasSample(broker, want) {
			t.Errorf("broker metrics lack %q:\n%s", want, grepLines(broker, "securelink_broker"))
		}
	}
	for _, secret := range []string{rs.hostToken, boot.Token, boot.PairingID, ident.PinSHA256} {
		if strings.Contains(front, secret) || strings.Contains(broker, secret) {
			t.Errorf("a scrape contains a credential or identifier")
		}
	}
}

// `credit: false` in the broker's YAML, or `reach.credit: false` in the
// front's, leaves the registration on plain v1 (the default, on, is
// asserted by TestReachEndToEndFromTheCLI's metrics).
func TestReachCreditKeysTurnTheExtensionOff(t *testing.T) {
	for name, yaml := range map[string][2]string{
		"broker": {"credit: false\n", ""},
		"front":  {"", "  credit: false\n"},
	} {
		t.Run(name, func(t *testing.T) {
			rs := startReachStackWith(t, yaml[0], yaml[1])
			st, err := reachStatus(rs.admin)
			if err != nil || st.State != connector.StateConnected || st.Credit {
				t.Fatalf("status: %v %+v", err, st)
			}
			if front := scrapeText(t, rs.frontMetrics); !hasSample(front, "securelink_reach_credit 0") {
				t.Fatalf("front metrics: %s", grepLines(front, "securelink_reach"))
			}
		})
	}
}

// hasSample reports whether a sample line of the scrape text starts with
// want (name, labels and value); HELP text, which may read alike ("1
// while ..."), does not count.
func hasSample(text, want string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, want) {
			return true
		}
	}
	return false
}

func grepLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// pairReachEndpoints runs `securelink pair --json` against the fake Relay at
// relayURL and returns the QR's endpoints, which must be the direct route and
// the Reach route (index 1).
func pairReachEndpoints(t *testing.T, home, cfgPath, relayURL string) []json.RawMessage {
	t.Helper()
	so, se, err := runPairCLI(t, home, "200", "--config", cfgPath, "--relay", relayURL, "--json")
	if err != nil {
		t.Fatalf("pair with Reach: %v\n%s", err, se)
	}
	var out struct {
		Payload struct {
			Endpoints []json.RawMessage `json:"endpoints"`
		} `json:"payload"`
	}
	if err := json.Unmarshal([]byte(so), &out); err != nil || len(out.Payload.Endpoints) != 2 {
		t.Fatalf("endpoints: %v %s", err, so)
	}
	return out.Payload.Endpoints
}

// The QR that `securelink pair` prints carries a Reach route whose bootstrap
// lets a client reach the host through the broker exactly once.
func TestPairWithReachBootstrapWorksOnce(t *testing.T) {
	rs := startReachStack(t)
	secret := []byte("0123456789abcdef0123456789abcdef")
	home := newHermesHome(t, rs.dir, secret)
	mint := fakeMintRelay(t, secret, nil)
	cand, err := client.ParseCandidate(pairReachEndpoints(t, home, rs.cfgPath, mint.URL)[1])
	if err != nil {
		t.Fatalf("the QR's outbound_broker candidate: %v", err)
	}
	if cand.Proxy.PinSHA256 != rs.d.pin || cand.Broker.CredentialKind != "bootstrap" {
		t.Fatalf("candidate: %+v", cand)
	}
	pool := x509.NewCertPool()
	pemBytes, _ := os.ReadFile(rs.certFile)
	pool.AppendCertsFromPEM(pemBytes)
	cfg := client.CandidateConfig(cand)
	cfg.RootCAs = pool
	host, _ := cand.Authority()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := client.DialTLS(ctx, cfg, host, cand.Proxy.PinSHA256)
	if err != nil {
		t.Fatalf("first use of the QR's bootstrap: %v", err)
	}
	fmt.Fprintf(conn, "GET /relay/health HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", rs.d.addr)
	body, _ := io.ReadAll(conn)
	conn.Close()
	if !strings.Contains(string(body), "hermes_secure_proxy") {
		t.Fatalf("through the broker: %q", body)
	}
	if _, err := client.DialTLS(ctx, cfg, host, cand.Proxy.PinSHA256); !errors.Is(err, wire.ErrReplayed) {
		t.Fatalf("second use of a bootstrap: %v, want replayed", err)
	}
}

// pair offers the Reach route the running daemon serves, not what the file
// says after an edit that was not reloaded.
func TestPairFollowsTheDaemonsReachNotTheEditedFile(t *testing.T) {
	rs := startReachStack(t)
	secret := []byte("0123456789abcdef0123456789abcdef")
	home := newHermesHome(t, rs.dir, secret)
	mint := fakeMintRelay(t, secret, nil)
	data, err := os.ReadFile(rs.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	edited := filepath.Join(rs.dir, "edited.yaml")
	off := strings.Replace(string(data), "reach:\n  enabled: true\n", "reach:\n  enabled: false\n", 1)
	if off == string(data) {
		t.Fatal("no reach.enabled line to edit")
	}
	if err := os.WriteFile(edited, []byte(off), 0o600); err != nil {
		t.Fatal(err)
	}
	eps := pairReachEndpoints(t, home, edited, mint.URL)
	if _, err := client.ParseCandidate(eps[1]); err != nil {
		t.Fatalf("the daemon runs Reach, the QR has no usable broker route: %v", err)
	}
	_, se, err := runPairCLI(t, home, "200", "--config", edited, "--relay", mint.URL, "--json")
	if err != nil || !strings.Contains(se, "reach.enabled: false but the running daemon has Reach on") {
		t.Fatalf("pair did not say the file and the daemon differ: %v\n%s", err, se)
	}
}

func TestPairFailsWhenReachIsNotConnected(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "host.token")
	os.WriteFile(tokenFile, []byte(strings.Repeat("t", 43)), 0o600)
	cfgPath := writeConfig(t, dir, "http://127.0.0.1:1")
	appendConfig(t, cfgPath, fmt.Sprintf("reach:\n  enabled: true\n  broker_url: \"wss://127.0.0.1:%d/v1/connect\"\n  host_id: \"AAAAAAAAAAAAAAAAAAAAAA\"\n  host_token_file: %q\n",
		freePort(t), tokenFile))
	startDaemon(t, cfgPath)
	so, se, err := runPairCLI(t, dir, "200", "--config", cfgPath)
	if err == nil || !strings.Contains(se, "--no-reach") || strings.Contains(so, "hermes-relay://") {
		t.Fatalf("pair with a disconnected connector: %v\n%s\n%s", err, so, se)
	}
}

// A candidate file others can read holds a broker credential valid for up
// to 90 days: connect says so (it is the user's own file, so not refused).
func TestConnectWarnsAboutAReadableCandidate(t *testing.T) {
	dir := t.TempDir()
	id, err := pinning.LoadOrCreate(pinning.IdentityConfig{StateDir: filepath.Join(dir, "state"), Authority: pinning.Authority{Host: "127.0.0.1", Port: 9443}})
	if err != nil {
		t.Fatal(err)
	}
	cand, err := client.NewCandidate(1, client.CandidateBroker{ProtocolVersion: 1, URL: fmt.Sprintf("wss://127.0.0.1:%d/v1/connect", freePort(t)),
		HostID: "AAAAAAAAAAAAAAAAAAAAAA", CredentialKind: "route", Token: wire.NewToken(), ExpiresAt: time.Now().Add(time.Hour).Unix()},
		"https://127.0.0.1:9443", id.Pin, id.CertDERBase64())
	if err != nil {
		t.Fatal(err)
	}
	cj, _ := cand.QRJSON()
	for _, c := range []struct {
		mode os.FileMode
		warn bool
	}{{0o644, true}, {0o600, false}} {
		f := filepath.Join(dir, fmt.Sprintf("candidate-%o.json", c.mode))
		if err := os.WriteFile(f, cj, c.mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(f, c.mode)
		cmd, _, stderr := startLineProc(t, "forwarding", "connect", "--candidate", f, "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
		got := strings.Contains(stderr.String(), "warning: --candidate")
		cmd.Process.Kill()
		cmd.Wait()
		if got != c.warn {
			t.Errorf("mode %04o: warning %v, want %v: %s", c.mode, got, c.warn, stderr.String())
		}
		if strings.Contains(stderr.String(), string(cand.Broker.Token)) {
			t.Errorf("mode %04o: the warning names the token", c.mode)
		}
	}
}

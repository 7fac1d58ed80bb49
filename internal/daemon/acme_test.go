package daemon

// tls.mode acme end to end in-process: the daemon against a real ACME server
// (Pebble, internal/acme/acmetest) on loopback, its HTTP-01 and TLS-ALPN-01
// solvers validated for real by Pebble's VA.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/acme/acmetest"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/pinning"
)

const acmeName = "front.acme.test"

var regexpPort = regexp.MustCompile(`http_port: [0-9]+`)

// acmeConfig is a daemon in acme mode against tc; acmeBlock is the
// tls.acme body (indented four spaces).
func acmeConfig(t *testing.T, dir string, tc *acmetest.CA, acmeBlock string, extra string) string {
	t.Helper()
	p := writeConfig(t, dir, fmt.Sprintf("tls:\n  mode: acme\n  acme:\n    ca: %q\n    ca_root_file: %q\n%s%s", tc.DirURL, tc.RootFile, acmeBlock, extra))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, bytes.Replace(b, []byte(`advertise: "127.0.0.1"`), []byte(`advertise: "`+acmeName+`"`), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// dialACME connects as a paired client that trusts Pebble's root and checks
// the leaf pin; it returns the served chain.
func dialACME(addr string, roots *x509.CertPool, pin string) ([]*x509.Certificate, error) {
	cfg := &tls.Config{ServerName: acmeName, RootCAs: roots, MinVersion: tls.VersionTLS12,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if got := pinning.SPKIPin(cs.PeerCertificates[0]); got != pin {
				return fmt.Errorf("pin %s, want %s", got, pin)
			}
			return nil
		}}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates, nil
}

func waitStatus(t *testing.T, r *running, what string, cond func(admin.Status) bool) admin.Status {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		st, err := r.admin.Status(context.Background())
		if err == nil && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %+v %v\nlog: %s", what, st.TLS, err, tail(r.logs.String()))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(s string) string {
	if len(s) > 6000 {
		return s[len(s)-6000:]
	}
	return s
}

func tlsValid(st admin.Status) bool { return st.TLS.State == string(acme.StateValid) }

// HTTP-01: the daemon obtains a certificate for its persistent key, serves
// leaf + intermediates that verify against Pebble's root with the announced
// pin, reports it in status, /identity, the storage (what `pin` reads) and
// the metrics; a renewal then changes the leaf and keeps the pin, and
// /identity follows the new leaf.
func TestACMEHTTP01ObtainRenewKeepsPin(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{Validity: 60})
	dir := t.TempDir()
	metricsAt := fmt.Sprintf("127.0.0.1:%d", acmetest.FreePort(t))
	cfg := acmeConfig(t, dir, tc, fmt.Sprintf("    challenge: http-01\n    http_port: %d\n", tc.HTTPPort), "metrics:\n  listen: "+metricsAt+"\n")
	r := startOpts(t, cfg, Options{ACMERenewalWindowRatio: 0.95, ACMERenewCheckInterval: 250 * time.Millisecond})
	addr := r.ready.Addr.String()

	st := waitStatus(t, r, "the first certificate", tlsValid)
	if st.PinSHA256 != r.ready.Pin || st.TLS.Mode != "acme" || st.TLS.Issuer == "" || st.TLS.NotAfter == "" || st.TLS.NextRenewal == "" || st.TLS.Rotation != nil {
		t.Fatalf("status after issuance: pin %s (announced %s), tls %+v", st.PinSHA256, r.ready.Pin, st.TLS)
	}
	chain, err := dialACME(addr, tc.Roots, r.ready.Pin)
	if err != nil {
		t.Fatalf("a client trusting Pebble's root with the pin: %v", err)
	}
	if len(chain) < 2 || bytes.Equal(chain[len(chain)-1].RawIssuer, chain[len(chain)-1].RawSubject) {
		t.Fatalf("served %d certificates: want leaf + intermediates, no root", len(chain))
	}
	if _, err := dialACME(addr, x509.NewCertPool(), r.ready.Pin); err == nil {
		t.Fatal("a client trusting no root accepted the chain")
	}
	first := chain[0]
	// The key is the identity file's: the pin is what pin/pairing compute.
	e, err := config.LoadEnv(cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pinning.Load(e.IdentityConfig(r.ready.Authority))
	if err != nil || key.Pin != r.ready.Pin {
		t.Fatalf("identity file key: %v (pin %v)", err, key)
	}
	stored, err := acme.Stored(e.ACMEOptions(r.ready.Authority, key.Signer()))
	if err != nil || stored.State != acme.StateValid || stored.Pin != r.ready.Pin {
		t.Fatalf("storage (what `pin` reads): %v %+v", err, stored.CertStatus)
	}

	// Renewal: a new leaf, the same pin; /identity follows.
	var renewed *x509.Certificate
	eventually45(t, func() string { return "no renewal: " + tail(r.logs.String()) }, func() bool {
		c, err := dialACME(addr, tc.Roots, r.ready.Pin)
		if err != nil {
			return false
		}
		renewed = c[0]
		return renewed.SerialNumber.Cmp(first.SerialNumber) != 0
	})
	if pinning.SPKIPin(renewed) != pinning.SPKIPin(first) {
		t.Fatal("the pin changed at renewal")
	}
	eventually45(t, func() string { return "/identity still has the first leaf" }, func() bool {
		id, err := r.admin.Identity(context.Background())
		der, _ := base64.StdEncoding.DecodeString(id.CertDER)
		return err == nil && id.PinSHA256 == r.ready.Pin && !bytes.Equal(der, first.Raw) && id.Candidate.Validate() == nil
	})
	// Metrics: the served certificate's expiry.
	res, err := http.Get("http://" + metricsAt + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), "securelink_certificate_expiry_timestamp_seconds ") ||
		!strings.Contains(string(body), "securelink_acme_renewal_failures_total 0") {
		t.Fatalf("metrics lack the certificate series:\n%s", body)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "securelink_certificate_expiry_timestamp_seconds "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			if d := time.Unix(int64(f), 0).Sub(renewed.NotAfter); d < -2*time.Minute || d > 2*time.Minute {
				t.Fatalf("expiry metric %s, served leaf expires %s", v, renewed.NotAfter)
			}
		}
	}
}

func eventually45(t *testing.T, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Until the first certificate exists the daemon is READY and alive for the
// watchdog, every handshake fails with an alert, status says why and when
// the next try is, and /identity refuses to pair. The CA here cannot reach
// the solver (it listens where the CA does not look) until a reload fixes
// the port.
func TestACMEWaitingForTheFirstCertificate(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{})
	dir := t.TempDir()
	cfg := acmeConfig(t, dir, tc, fmt.Sprintf("    challenge: http-01\n    http_port: %d\n", acmetest.FreePort(t)), "")
	r := start(t, cfg) // READY although no certificate exists
	if err := r.ready.SelfCheck(context.Background()); err != nil {
		t.Fatalf("watchdog self-check while waiting: %v (want alive)", err)
	}
	_, err := dialACME(r.ready.Addr.String(), tc.Roots, r.ready.Pin)
	if err == nil || !strings.Contains(err.Error(), "remote error: tls") {
		t.Fatalf("handshake before the first certificate: %v, want an alert", err)
	}
	st := waitStatus(t, r, "a failed attempt", func(st admin.Status) bool { return st.TLS.NextAttempt != "" })
	if st.TLS.State != string(acme.StateWaiting) || st.TLS.Problem != string(acme.ProblemPortUnreachable) ||
		st.TLS.LastError == "" || !strings.Contains(st.TLS.Needs, "port 80") {
		t.Fatalf("status while waiting: %+v", st.TLS)
	}
	if next, err := time.Parse(time.RFC3339, st.TLS.NextAttempt); err != nil || time.Until(next) <= 0 {
		t.Fatalf("next attempt %q is not in the future", st.TLS.NextAttempt)
	}
	if _, err := r.admin.Identity(context.Background()); err == nil || !strings.Contains(err.Error(), "no certificate yet") {
		t.Fatalf("/identity while waiting: %v", err)
	}
	if !strings.Contains(r.logs.String(), `"event":"acme_waiting"`) || !strings.Contains(r.logs.String(), `"next_attempt"`) {
		t.Fatalf("the log does not say what is missing and when the next try is: %s", tail(r.logs.String()))
	}
	// Fixing the solver port and reloading rebuilds the manager, which
	// obtains the certificate; the key (and so the pin) stays.
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b = regexpPort.ReplaceAll(b, []byte(fmt.Sprintf("http_port: %d", tc.HTTPPort)))
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r.reload <- syscall.SIGHUP
	st = waitStatus(t, r, "the certificate after the reload", tlsValid)
	if st.PinSHA256 != r.ready.Pin || st.TLS.Rotation != nil {
		t.Fatalf("after the reload: pin %s, want %s; %+v", st.PinSHA256, r.ready.Pin, st.TLS)
	}
	if _, err := dialACME(r.ready.Addr.String(), tc.Roots, r.ready.Pin); err != nil {
		t.Fatalf("after the reload: %v", err)
	}
	// The self-check still fails on a front that does not answer at all.
	r.stop()
	<-r.done
	r.done <- nil
	if err := r.ready.SelfCheck(context.Background()); err == nil {
		t.Fatal("self-check passed with the front stopped")
	}
}

// Deleting the identity key is a rotation: after SIGHUP the daemon has a new
// key, reports the change in status and the log ("every client must
// re-pair"), never serves the old key's certificate, and obtains one for the
// new key (TLS-ALPN-01 here, the second challenge).
func TestACMEKeyDeletedIsReportedAsRotation(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{})
	dir := t.TempDir()
	cfg := acmeConfig(t, dir, tc, fmt.Sprintf("    challenge: tls-alpn-01\n    tls_alpn_port: %d\n    http_port: %d\n", tc.TLSPort, acmetest.FreePort(t)), "")
	r := start(t, cfg)
	waitStatus(t, r, "the first certificate (tls-alpn-01)", tlsValid)
	if _, err := dialACME(r.ready.Addr.String(), tc.Roots, r.ready.Pin); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(pinning.IdentityPath(filepath.Join(dir, "state"))); err != nil {
		t.Fatal(err)
	}
	r.reload <- syscall.SIGHUP
	st := waitStatus(t, r, "the rotation", func(st admin.Status) bool { return st.TLS.Rotation != nil })
	if st.TLS.Rotation.OldPin != r.ready.Pin || st.TLS.Rotation.NewPin == r.ready.Pin || st.PinSHA256 != st.TLS.Rotation.NewPin ||
		!strings.Contains(st.TLS.Rotation.Message, "every paired client must re-pair") {
		t.Fatalf("rotation report: %+v, status pin %s, old %s", st.TLS.Rotation, st.PinSHA256, r.ready.Pin)
	}
	if !strings.Contains(r.logs.String(), `"event":"identity_rotated"`) {
		t.Fatal("the log does not report the rotation")
	}
	if _, err := dialACME(r.ready.Addr.String(), tc.Roots, r.ready.Pin); err == nil {
		t.Fatal("the old key's certificate is still served")
	}
	newPin := st.TLS.Rotation.NewPin
	waitStatus(t, r, "a certificate for the new key", tlsValid)
	if _, err := dialACME(r.ready.Addr.String(), tc.Roots, newPin); err != nil {
		t.Fatalf("the new key's certificate: %v", err)
	}
	var alert *net.OpError
	_, err := dialACME(r.ready.Addr.String(), tc.Roots, r.ready.Pin)
	if err == nil || errors.As(err, &alert) && alert.Op == "remote error" {
		t.Fatalf("a client with the old pin: %v, want its own pin check to refuse", err)
	}
}

// DNS-01 through lego's RFC 2136 provider against a real named (TSIG): no
// port of the daemon is reachable by the CA, the TXT record is what proves
// control; the credentials file is 0600 and its secret never reaches the log.
func TestACMEDNS01RFC2136(t *testing.T) {
	ns := acmetest.StartNamed(t)
	tc := acmetest.StartCA(t, acmetest.Options{Resolver: ns.Addr})
	dir := t.TempDir()
	creds := filepath.Join(dir, "dns.env")
	if err := os.WriteFile(creds, []byte(ns.Credentials()), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := acmeConfig(t, dir, tc, fmt.Sprintf("    challenge: dns-01\n    dns_provider: rfc2136\n    dns_credentials_file: %q\n", creds), "")
	r := startOpts(t, cfg, Options{ACMEDNSResolvers: []string{ns.Addr}})
	waitStatus(t, r, "the certificate (dns-01)", tlsValid)
	if _, err := dialACME(r.ready.Addr.String(), tc.Roots, r.ready.Pin); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(r.logs.String(), ns.Secret) {
		t.Fatal("the TSIG secret reached the log")
	}
}

// A reload whose new manager cannot start (here its storage cannot be read
// for a newly added name) leaves the running manager in force: it keeps
// renewing, and status keeps describing its certificate.
func TestACMEReloadFailingAtStartKeepsTheManagerRenewing(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{Validity: 60})
	dir := t.TempDir()
	cfg := acmeConfig(t, dir, tc, fmt.Sprintf("    challenge: http-01\n    http_port: %d\n", tc.HTTPPort), "")
	r := startOpts(t, cfg, Options{ACMERenewalWindowRatio: 0.95, ACMERenewCheckInterval: 250 * time.Millisecond})
	waitStatus(t, r, "the first certificate", tlsValid)

	// The stored certificate of the name the reload adds is a directory:
	// acme.Manager.Start fails reading it.
	const added = "other.acme.test"
	served, err := filepath.Glob(filepath.Join(dir, "state", "acme", "certificates", "*", acmeName))
	if err != nil || len(served) != 1 {
		t.Fatalf("stored certificate directory of %s: %v %v", acmeName, served, err)
	}
	if err := os.MkdirAll(filepath.Join(filepath.Dir(served[0]), added, added+".crt"), 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(b, "extra_names:\n  - "+added+"\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	r.reload <- syscall.SIGHUP
	eventually45(t, func() string { return "the reload did not fail: " + tail(r.logs.String()) }, func() bool {
		return strings.Contains(r.logs.String(), `"event":"reload_failed"`)
	})
	if !strings.Contains(r.logs.String(), "acme storage") {
		t.Fatalf("the reload failed for another reason than the storage: %s", tail(r.logs.String()))
	}
	before, err := r.admin.Status(context.Background())
	if err != nil || before.TLS.State != string(acme.StateValid) {
		t.Fatalf("status after the failed reload: %+v %v", before.TLS, err)
	}
	// The running manager still renews: its certificate's expiry moves on,
	// and the front serves the renewed leaf with the same pin.
	st := waitStatus(t, r, "a renewal after the failed reload", func(st admin.Status) bool {
		return tlsValid(st) && st.TLS.NotAfter > before.TLS.NotAfter
	})
	if st.PinSHA256 != r.ready.Pin {
		t.Fatalf("pin %s after the failed reload, want %s", st.PinSHA256, r.ready.Pin)
	}
	chain, err := dialACME(r.ready.Addr.String(), tc.Roots, r.ready.Pin)
	if err != nil {
		t.Fatal(err)
	}
	if got := chain[0].NotAfter.UTC().Format(time.RFC3339); got < before.TLS.NotAfter {
		t.Fatalf("served leaf expires %s, before the failed reload's %s", got, before.TLS.NotAfter)
	}
}

// In acme mode a reload checks the tls.acme files only: turning Reach on
// in the file (a restart's change) before its host token exists is
// reported as needing a restart, as in self-signed mode, and does not fail
// the whole reload on a file the running daemon does not read.
func TestACMEReloadDoesNotFailOnAReachOnlyFile(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{})
	dir := t.TempDir()
	cfg := acmeConfig(t, dir, tc, fmt.Sprintf("    challenge: http-01\n    http_port: %d\n", tc.HTTPPort), "")
	r := startOpts(t, cfg, Options{})
	waitStatus(t, r, "the first certificate", tlsValid)
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reach := fmt.Sprintf("reach:\n  enabled: true\n  broker_url: \"wss://127.0.0.1:1/v1/connect\"\n  host_id: \"AAAAAAAAAAAAAAAAAAAAAA\"\n  host_token_file: %q\n",
		filepath.Join(dir, "not-yet-written.token"))
	if err := os.WriteFile(cfg, append(b, reach...), 0o600); err != nil {
		t.Fatal(err)
	}
	r.reload <- syscall.SIGHUP
	eventually45(t, func() string { return "no reload outcome: " + tail(r.logs.String()) }, func() bool {
		l := r.logs.String()
		return strings.Contains(l, `"event":"reload_partial"`) || strings.Contains(l, `"event":"reload_failed"`)
	})
	if l := r.logs.String(); strings.Contains(l, `"event":"reload_failed"`) {
		t.Fatalf("the reload failed on the Reach-only host token file: %s", tail(l))
	}
}

package main

// tls.mode acme with the shipped clients' own stacks: the daemon (in-process,
// with certmagic's renewal schedule shortened) obtains its certificate from
// a real ACME server on loopback (Pebble, internal/acme/acmetest); the
// desktop recipe under Bun and the Android recipe (OkHttp on a JVM that
// trusts Pebble's root) connect with the pin of the first QR before and
// after a renewal, and the built binary's `pin --json` reports that pin and
// the served leaf.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/acme/acmetest"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/internal/daemon"
	"github.com/hermes-securelink/securelink/internal/pairing"
	"github.com/hermes-securelink/securelink/pinning"
)

// acmeFront runs the daemon in-process in acme mode for the name localhost
// (Pebble's DNS answers 127.0.0.1 for every name, and the clients resolve
// localhost themselves), renewing seconds after each issuance.
func acmeFront(t *testing.T, tc *acmetest.CA) (cfgPath string, ready daemon.Ready, logs *syncWriter) {
	t.Helper()
	dir := t.TempDir()
	cfgPath = writeConfig(t, dir, echoRelay(t))
	setAdvertise(t, cfgPath, "localhost")
	appendConfig(t, cfgPath, fmt.Sprintf("tls:\n  mode: acme\n  acme:\n    ca: %q\n    ca_root_file: %q\n    challenge: http-01\n    http_port: %d\n",
		tc.DirURL, tc.RootFile, tc.HTTPPort))
	logs = &syncWriter{}
	ctx, cancel := context.WithCancel(context.Background())
	readyc := make(chan daemon.Ready, 1)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, daemon.Options{
			ConfigFlag:             cfgPath,
			NewLogger:              func(*config.Config) zerolog.Logger { return zerolog.New(logs) },
			Stderr:                 logs,
			Ready:                  func(r daemon.Ready) { readyc <- r },
			ACMERenewalWindowRatio: 0.95,
			ACMERenewCheckInterval: 250 * time.Millisecond,
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(daemon.ShutdownGrace + 5*time.Second):
			t.Error("daemon did not stop")
		}
	})
	select {
	case ready = <-readyc:
	case err := <-done:
		t.Fatalf("daemon: %v\n%s", err, logs.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("daemon not ready: %s", logs.String())
	}
	return cfgPath, ready, logs
}

// servedLeaf is the leaf the front presents to a client trusting roots.
func servedLeaf(t *testing.T, addr string, roots *x509.CertPool) (*x509.Certificate, error) {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "localhost", RootCAs: roots, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0], nil
}

func TestClientsUseTheACMECertificateAcrossRenewal(t *testing.T) {
	b := bun(t)
	java, cp := okhttp(t)
	cp = compileAndroid(t, cp) + ":" + cp
	tc := acmetest.StartCA(t, acmetest.Options{Validity: 60})
	cfgPath, ready, logs := acmeFront(t, tc)
	addr := ready.Addr.String()
	cl := admin.NewClient(ready.AdminSocket)

	var first *x509.Certificate
	eventually(t, 45*time.Second, func() string { return "no certificate: " + logs.String() }, func() bool {
		var err error
		first, err = servedLeaf(t, addr, tc.Roots)
		return err == nil
	})
	if pinning.SPKIPin(first) != ready.Pin {
		t.Fatalf("served pin %s, announced %s", pinning.SPKIPin(first), ready.Pin)
	}
	// The first QR: what /identity (and so `pair`) hands out now.
	qr, err := cl.Identity(context.Background())
	if err != nil || qr.PinSHA256 != ready.Pin {
		t.Fatalf("/identity: %+v %v", qr, err)
	}
	// `pin --json` (the built binary, reading the storage) agrees.
	so, se, err := runCLI(t, "pin", "--json", "--config", cfgPath)
	if err != nil {
		t.Fatalf("pin --json: %v %s", err, se)
	}
	var pj struct {
		Pin     string          `json:"pin_sha256"`
		CertDER string          `json:"cert_der"`
		TLS     admin.TLSStatus `json:"tls"`
	}
	if err := json.Unmarshal([]byte(so), &pj); err != nil || pj.Pin != ready.Pin || pj.TLS.Mode != "acme" || pj.TLS.State != "valid" ||
		pj.TLS.Issuer == "" || pj.TLS.NextRenewal == "" {
		t.Fatalf("pin --json: %v %s", err, so)
	}
	if der, _ := base64.StdEncoding.DecodeString(pj.CertDER); len(der) == 0 {
		t.Fatalf("pin --json has no cert_der: %s", so)
	}
	// pair: the QR carries the ACME leaf, and no note says Android refuses it.
	secret := bytes.Repeat([]byte{7}, 32)
	so, se, err = runPairCLI(t, newHermesHome(t, t.TempDir(), secret), "200", "--config", cfgPath, "--relay", fakeMintRelay(t, secret, nil).URL, "--json")
	if err != nil {
		t.Fatalf("pair: %v\n%s", err, se)
	}
	var pr struct {
		Notes []pairing.ClientNote `json:"client_notes"`
	}
	if err := json.Unmarshal([]byte(so), &pr); err != nil || len(pr.Notes) != 0 || !strings.Contains(so, qr.CertDER) {
		t.Fatalf("pair with an ACME certificate: notes %+v (%v), or the QR lacks the served leaf:\n%s", pr.Notes, err, so)
	}

	// Android: a JVM whose trust store holds Pebble's root (as a phone's
	// holds a public CA's).
	store := filepath.Join(t.TempDir(), "trust.p12")
	if out, err := exec.Command("keytool", "-importcert", "-noprompt", "-alias", "pebble", "-file", tc.IssuingRootFile,
		"-keystore", store, "-storetype", "PKCS12", "-storepass", "changeit").CombinedOutput(); err != nil {
		t.Fatalf("keytool: %v %s", err, out)
	}
	props := []string{"-Djavax.net.ssl.trustStore=" + store, "-Djavax.net.ssl.trustStorePassword=changeit", "-Djavax.net.ssl.trustStoreType=PKCS12"}
	_, port, _ := strings.Cut(addr, ":")
	healthURL := "https://localhost:" + port + "/relay/health"
	wsURL := "wss://localhost:" + port + "/relay/ws"
	// Bun anchors its WebSocket on the leaf PEM (`ca`) and still needs the
	// issuing root in its store for a CA-issued leaf (measured: without
	// NODE_EXTRA_CA_CERTS the handshake fails); a public CA's root is in
	// Bun's bundled store, Pebble's is added here.
	env := []string{"NODE_EXTRA_CA_CERTS=" + tc.IssuingRootFile}
	clients := func(when string) {
		t.Helper()
		if r := runRecipe(t, env, b, desktopRecipe, wsURL, qr.PinSHA256); !r.OK || r.Stage != "echo" {
			t.Fatalf("%s: desktop recipe (Bun) with the first QR's pin: %+v", when, r)
		}
		if r := runRecipe(t, env, b, desktopRecipe, wsURL, wrongPin); r.OK || r.Stage != "pin" {
			t.Fatalf("%s: desktop recipe with a wrong pin: %+v", when, r)
		}
		if r := runAndroid(t, java, cp, props, healthURL, qr.PinSHA256); !r.OK {
			t.Fatalf("%s: Android recipe (OkHttp) with the first QR's pin: %+v", when, r)
		}
		if r := runAndroid(t, java, cp, props, healthURL, wrongPin); r.OK || !strings.Contains(r.Error, "Certificate pinning failure") {
			t.Fatalf("%s: Android recipe with a wrong pin: %+v", when, r)
		}
	}
	clients("before renewal")

	var renewed *x509.Certificate
	eventually(t, 45*time.Second, func() string { return "no renewal: " + logs.String() }, func() bool {
		l, err := servedLeaf(t, addr, tc.Roots)
		if err == nil && l.SerialNumber.Cmp(first.SerialNumber) != 0 {
			renewed = l
		}
		return renewed != nil
	})
	if pinning.SPKIPin(renewed) != ready.Pin {
		t.Fatal("the pin changed at renewal")
	}
	clients("after renewal")
	// pin --json follows the stored (renewed) leaf and keeps the pin.
	eventually(t, 30*time.Second, func() string { return "pin --json still shows the first leaf" }, func() bool {
		so, _, err := runCLI(t, "pin", "--json", "--config", cfgPath)
		if err != nil || json.Unmarshal([]byte(so), &pj) != nil {
			return false
		}
		der, _ := base64.StdEncoding.DecodeString(pj.CertDER)
		return pj.Pin == ready.Pin && !bytes.Equal(der, first.Raw)
	})
}

// pin in acme mode, from the storage: waiting before the first certificate
// (no cert_der, what the challenge needs), then pin, issuer, expiry and next
// renewal; a key deleted under the stored certificate is reported as a
// rotation.
func TestPinInACMEMode(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{})
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, "http://127.0.0.1:1")
	setAdvertise(t, cfgPath, "front.acme.test")
	appendConfig(t, cfgPath, fmt.Sprintf("advertise_port: 9443\ntls:\n  mode: acme\n  acme:\n    ca: %q\n    ca_root_file: %q\n    challenge: http-01\n    http_port: %d\n",
		tc.DirURL, tc.RootFile, tc.HTTPPort))
	var pj struct {
		Pin     string          `json:"pin_sha256"`
		CertDER string          `json:"cert_der"`
		TLS     admin.TLSStatus `json:"tls"`
	}
	so, se, err := runCLI(t, "pin", "--json", "--config", cfgPath)
	if err != nil || json.Unmarshal([]byte(so), &pj) != nil || pj.Pin == "" || pj.CertDER != "" ||
		pj.TLS.State != "waiting_first_certificate" || !strings.Contains(pj.TLS.Needs, "http-01") {
		t.Fatalf("pin before a certificate: %v %s %s", err, so, se)
	}
	firstPin := pj.Pin

	// Obtain one into the storage, as the daemon would.
	e, err := config.LoadEnv(cfgPath, false)
	if err != nil {
		t.Fatal(err)
	}
	a := pinning.Authority{Host: "front.acme.test", Port: 9443}
	id, err := pinning.Load(e.IdentityConfig(a))
	if err != nil {
		t.Fatal(err)
	}
	o := e.ACMEOptions(a, id.Signer())
	o.Logger = zerolog.Nop()
	m, err := acme.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() string { return fmt.Sprintf("no certificate: %+v", m.Status().CertStatus) },
		func() bool { return m.Status().State == acme.StateValid })
	m.Close()
	so, se, err = runCLI(t, "pin", "--config", cfgPath)
	if err != nil {
		t.Fatalf("pin: %v %s", err, se)
	}
	for _, want := range []string{"pin_sha256   " + firstPin, "tls          acme, valid", "issuer       Pebble", "not_after    20", "next_renewal 20"} {
		if !strings.Contains(so, want) {
			t.Fatalf("pin output lacks %q:\n%s", want, so)
		}
	}
	// The key deleted: pin makes a new one and reports the rotation.
	if err := os.Remove(pinning.IdentityPath(e.StateDir)); err != nil {
		t.Fatal(err)
	}
	so, se, err = runCLI(t, "pin", "--json", "--config", cfgPath)
	if err != nil || json.Unmarshal([]byte(so), &pj) != nil || pj.Pin == firstPin || pj.TLS.Rotation == nil ||
		pj.TLS.Rotation.OldPin != firstPin || !strings.Contains(se, "every paired client must re-pair") {
		t.Fatalf("pin after the key was deleted: %v %s %s", err, so, se)
	}
}

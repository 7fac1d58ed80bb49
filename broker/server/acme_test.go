package server

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/acme/acmetest"
	"github.com/hermes-securelink/securelink/internal/metrics"
	"github.com/hermes-securelink/securelink/pinning"
)

// tls.acme: the broker obtains its endpoint's certificate from a real ACME
// server (Pebble on loopback, HTTP-01 validated for real), a client that
// trusts only Pebble's root reaches /health, and a restarted broker serves
// a certificate for the same persistent key from its storage.
func TestServeListenerACME(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{})
	const name = "broker.acme.test"
	var storage string
	e := newEnv(t, func(c *Config) {
		c.InsecurePlaintext = false
		c.ACME = ACMEConfig{Domains: []string{name}, Settings: acme.Settings{
			CA: tc.DirURL, CARootFile: tc.RootFile, Challenge: acme.ChallengeHTTP01, HTTPPort: tc.HTTPPort}}
		storage = c.ACMEDir()
	})
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: tc.Roots, ServerName: name, MinVersion: tls.VersionTLS12}}}
	serve := func() (addr string, stop func()) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- e.b.ServeListener(ctx, ln) }()
		return ln.Addr().String(), func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("ServeListener: %v", err)
			}
		}
	}
	health := func(addr string) (string, error) {
		resp, err := client.Get("https://" + addr + "/health")
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/health: %d", resp.StatusCode)
		}
		return pinning.SPKIPin(resp.TLS.PeerCertificates[0]), nil
	}
	addr, stop := serve()
	var pin string
	deadline := time.Now().Add(45 * time.Second)
	for {
		var err error
		if pin, err = health(addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ACME certificate served: %v\n%s", err, e.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// While it serves, the certificate's status and metrics are there.
	st, ok := e.b.Certificate()
	if !ok || st.State != acme.StateValid || st.NotAfter.Before(time.Now()) {
		t.Fatalf("Certificate() = %+v, %v", st, ok)
	}
	m := metrics.NewFront()
	e.b.RegisterCertificateMetrics(m)
	if got := scrapeGauge(t, m, "securelink_broker_certificate_expiry_timestamp_seconds"); got != float64(st.NotAfter.Unix()) {
		t.Errorf("expiry metric %v, want %d", got, st.NotAfter.Unix())
	}
	if got := scrapeGauge(t, m, "securelink_broker_acme_renewal_failures_total"); got != 0 {
		t.Errorf("renewal failures %v, want 0", got)
	}
	stop()
	if _, ok := e.b.Certificate(); ok {
		t.Error("Certificate() still reports a manager after ServeListener returned")
	}
	client.CloseIdleConnections()
	// A new broker on the same storage: the stored certificate at once, same key.
	e.b.Close()
	e.start()
	addr, stop = serve()
	defer stop()
	again, err := health(addr)
	if err != nil || again != pin {
		t.Fatalf("after restart: pin %s (was %s), %v", again, pin, err)
	}
	if _, err := pinning.Load(pinning.IdentityConfig{StateDir: storage, Mode: pinning.ModeACME, Authority: pinning.Authority{Host: name, Port: 443}}); err != nil {
		t.Fatalf("the broker's key is not in %s: %v", storage, err)
	}
}

// scrapeGauge gathers m and returns the value of the one series name.
func scrapeGauge(t *testing.T, m *metrics.Front, name string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) != 1 {
			continue
		}
		mt := mf.GetMetric()[0]
		if g := mt.GetGauge(); g != nil {
			return g.GetValue()
		}
		if c := mt.GetCounter(); c != nil {
			return c.GetValue()
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}

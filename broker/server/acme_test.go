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
	stop()
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

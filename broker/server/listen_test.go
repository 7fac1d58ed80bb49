package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/wire"
)

func writeTestCert(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// serveTLS runs a broker with a test certificate on a loopback listener
// until cancel; served reports ServeListener's result.
func serveTLS(t *testing.T) (e *env, ln net.Listener, pool *x509.CertPool, cancel context.CancelFunc, served chan error) {
	t.Helper()
	e = newEnv(t, func(c *Config) {
		c.InsecurePlaintext = false
		c.TLSCertFile, c.TLSKeyFile, pool = writeTestCert(t, t.TempDir())
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served = make(chan error, 1)
	go func() { served <- e.b.ServeListener(ctx, ln) }()
	return e, ln, pool, cancel, served
}

func TestServeListenerTLSAndShutdown(t *testing.T) {
	e, ln, pool, cancel, served := serveTLS(t)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: step}
	base := "https://" + ln.Addr().String()
	resp, err := client.Get(base + "/health")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health over TLS: %v %v", resp, err)
	}
	resp.Body.Close()

	dctx, dcancel := context.WithTimeout(context.Background(), step)
	defer dcancel()
	ws, _, err := websocket.Dial(dctx, "wss://"+ln.Addr().String()+wire.ConnectPath, &websocket.DialOptions{HTTPClient: client})
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := wire.Marshal(wire.Register{Role: wire.RoleHost, HostID: e.hosts[0].id, ConnectionID: wire.NewID(), CredentialKind: wire.KindHost, Token: e.hosts[0].token})
	ws.Write(dctx, websocket.MessageText, msg)
	if _, data, err := ws.Read(dctx); err != nil || !strings.Contains(string(data), `"registered"`) {
		t.Fatalf("%q %v", data, err)
	}

	cancel()
	_, _, err = ws.Read(dctx)
	if websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("host at shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(base + "/health"); err == nil {
		t.Fatal("still serving after shutdown")
	}
}

// The broker's TLS 1.2 offers only ECDHE AEAD suites, as the front's does
// (internal/tlsconf): a client offering only CBC-SHA1 is refused.
func TestServeListenerOffersOnlyAEADSuitesOnTLS12(t *testing.T) {
	_, ln, pool, cancel, served := serveTLS(t)
	defer func() { cancel(); <-served }()
	dial := func(suite uint16) error {
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{
			RootCAs: pool, MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{suite},
		})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA); err == nil {
		t.Error("TLS 1.2 with ECDHE-ECDSA-AES128-CBC-SHA was accepted")
	}
	for _, s := range []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256} {
		if err := dial(s); err != nil {
			t.Errorf("TLS 1.2 with %s: %v", tls.CipherSuiteName(s), err)
		}
	}
}

// The broker's listener sets no TCP keepalive on its sockets (its pings
// and timeouts cover every phase of a socket); net.Listen's 15 s default
// cost four setsockopt(2) per connection.
func TestListenSetsNoTCPKeepalive(t *testing.T) {
	ln, err := Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	raw, err := sc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	on, serr := -1, error(nil)
	if err := raw.Control(func(fd uintptr) { on, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if on != 0 {
		t.Fatalf("SO_KEEPALIVE is %d on an accepted socket, want 0", on)
	}
}

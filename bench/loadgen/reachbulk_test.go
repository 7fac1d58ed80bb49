package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/store"
)

// bulkBroker runs a real broker on 127.0.0.1 with a fresh self-signed
// certificate and one host; it returns its connect URL, a pool trusting
// it and the host's line.
func bulkBroker(t *testing.T) (url string, pool *x509.CertPool, host hostLine) {
	t.Helper()
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bulk test broker"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(cfg.TLSCertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(cfg.TLSKeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	cfg.HostsFile, cfg.StateFile = filepath.Join(dir, "hosts.json"), filepath.Join(dir, "state.json")
	cfg.AttemptsPerMinute = 100000
	id, tok, err := store.AddHost(cfg.HostsFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = ln.Addr().String()
	b, err := server.New(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.ServeListener(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return "wss://" + ln.Addr().String() + "/v1/connect", pool, hostLine{HostID: id, Token: string(tok)}
}

// Both directions of reach-bulk on one real broker, connector and client:
// bytes arrive checked and are counted, nothing is cut, and the echo
// counts round trips.
func TestReachBulkMovesCheckedBytesBothWays(t *testing.T) {
	url, pool, host := bulkBroker(t)
	win := window{dur: 2 * time.Second, warm: 500 * time.Millisecond}
	for _, mode := range []string{"upload", "download", "echo"} {
		ctx, cancel := context.WithCancel(context.Background())
		var runs sync.WaitGroup
		p, err := openBulkPair(ctx, &runs, url, pool, host)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if mode == "echo" {
			line, err := measureEcho(p.client, p.host, 64, 0, win, nil)
			if err != nil || kvOf(line, "ops") == "0" || kvOf(line, "mode") != "echo" {
				t.Errorf("echo: %q, %v", line, err)
			}
		} else {
			src, dst := p.client, p.host
			if mode == "download" {
				src, dst = p.host, p.client
			}
			r, err := measureBulk(src, dst, 1<<20, win, nil)
			if err != nil || r.err != "" || r.bytes <= 0 {
				t.Errorf("%s: %+v, %v", mode, r, err)
			}
			if l := r.line(mode, 1<<20); !strings.Contains(l, "cut=0") || kvOf(l, "msg_bytes") != "1048576" {
				t.Errorf("%s: line %q", mode, l)
			}
		}
		p.close()
		cancel()
		waitBounded(&runs, 10*time.Second)
	}
}

// A byte that differs from the pattern fails the run: the check is real.
func TestReachBulkNoticesAChangedByte(t *testing.T) {
	a, b := net.Pipe()
	flip := &flipConn{Conn: a}
	r, err := measureBulk(flip, b, 4096, window{dur: 100 * time.Millisecond, warm: 10 * time.Millisecond}, nil)
	if err == nil && !strings.Contains(r.err, "differs") {
		t.Fatalf("a changed byte went unnoticed: %+v", r)
	}
}

// flipConn changes one byte of its third write.
type flipConn struct {
	net.Conn
	n int
}

func (c *flipConn) Write(p []byte) (int, error) {
	c.n++
	if c.n == 3 {
		q := append([]byte(nil), p...)
		q[17] ^= 1
		return c.Conn.Write(q)
	}
	return c.Conn.Write(p)
}

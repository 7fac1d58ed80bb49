package acme

import (
	"crypto/x509"
	"encoding/pem"
	"io"
	"log"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
	"github.com/miekg/dns"
)

// testCA is a real ACME server (Pebble, in-process) on loopback. Its VA
// validates for real: HTTP-01 at 127.0.0.1:httpPort, TLS-ALPN-01 at
// 127.0.0.1:tlsPort, names and TXT records through resolver.
type testCA struct {
	dirURL   string
	rootFile string         // PEM root of the directory's HTTPS endpoint
	roots    *x509.CertPool // Pebble's issuing root
	httpPort int
	tlsPort  int
}

type caOptions struct {
	resolver string // DNS server Pebble asks; "" = a loopback one answering 127.0.0.1
	validity uint64 // certificate lifetime in seconds; 0 = Pebble's default
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startTestCA wires Pebble as cmd/pebble/main.go does. No t.Parallel: the
// knobs are environment variables read by the constructors.
func startTestCA(t *testing.T, o caOptions) *testCA {
	t.Helper()
	t.Setenv("PEBBLE_VA_NOSLEEP", "1")
	t.Setenv("PEBBLE_WFE_NONCEREJECT", "0")
	t.Setenv("PEBBLE_AUTHZREUSE", "0")
	if o.resolver == "" {
		o.resolver = startLoopbackDNS(t)
	}
	logger := log.New(io.Discard, "", 0)
	if testing.Verbose() {
		logger = log.New(os.Stderr, "pebble ", log.Lmicroseconds)
	}
	store := db.NewMemoryStore()
	profiles := map[string]ca.Profile{"default": {Description: "test", ValidityPeriod: o.validity}}
	authority := ca.New(logger, store, "", "ecdsa", 0, 1, profiles)
	tc := &testCA{httpPort: freePort(t), tlsPort: freePort(t)}
	v := va.New(logger, tc.httpPort, tc.tlsPort, false, o.resolver, store)
	w := wfe.New(logger, store, v, authority, []string{"pebble.letsencrypt.org"}, false, false, 0, 0)
	srv := httptest.NewTLSServer(w.Handler())
	t.Cleanup(srv.Close)
	tc.dirURL = srv.URL + wfe.DirectoryPath

	tc.rootFile = filepath.Join(t.TempDir(), "ca-root.pem")
	writePEM(t, tc.rootFile, srv.Certificate().Raw)
	root := authority.GetRootCert(0)
	if root == nil {
		t.Fatal("pebble has no root")
	}
	tc.roots = x509.NewCertPool()
	tc.roots.AddCert(root.Cert)
	return tc
}

func writePEM(t *testing.T, path string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

// startLoopbackDNS serves A 127.0.0.1 for every name (no AAAA), on UDP and
// TCP of one port (Pebble's VA asks over TCP), so the VA connects to the
// solvers on loopback.
func startLoopbackDNS(t *testing.T) string {
	t.Helper()
	var pc net.PacketConn
	var tl net.Listener
	for range 20 {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if tl, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
	}
	if tl == nil {
		t.Fatal("no port free for both UDP and TCP")
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		for _, q := range r.Question {
			if q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1},
					A:   net.IPv4(127, 0, 0, 1),
				})
			}
		}
		_ = w.WriteMsg(m)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: tl, Handler: h}} {
		go func() { _ = srv.ActivateAndServe() }()
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return pc.LocalAddr().String()
}

func itoa(p int) string { return strconv.Itoa(p) }

// Package acmetest runs a real ACME server for tests: Let's Encrypt's Pebble
// in-process on loopback (its VA validating for real against the solvers'
// ports), a loopback DNS server that answers 127.0.0.1 for every name, and
// Debian's named as an RFC 2136 server. Tests of internal/acme, the daemon,
// the broker and the command share it.
package acmetest

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
	"github.com/miekg/dns"
)

// CA is a real ACME server (Pebble, in-process) on loopback. Its VA
// validates for real: HTTP-01 at 127.0.0.1:HTTPPort, TLS-ALPN-01 at
// 127.0.0.1:TLSPort, names and TXT records through its resolver.
type CA struct {
	DirURL   string         // the ACME directory URL
	RootFile string         // PEM root of the directory's HTTPS endpoint (tls.acme.ca_root_file)
	Roots    *x509.CertPool // Pebble's issuing root: what clients trust
	// IssuingRootFile is that root as a PEM file (NODE_EXTRA_CA_CERTS, a
	// JVM truststore).
	IssuingRootFile string
	HTTPPort        int
	TLSPort         int
}

// Options tunes StartCA.
type Options struct {
	// Resolver is the DNS server Pebble asks; "" = StartLoopbackDNS.
	Resolver string
	// Validity is the certificate lifetime in seconds; 0 = Pebble's default.
	Validity uint64
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// StartCA wires Pebble as cmd/pebble/main.go does. No t.Parallel: the
// knobs are environment variables read by the constructors.
func StartCA(t *testing.T, o Options) *CA {
	t.Helper()
	t.Setenv("PEBBLE_VA_NOSLEEP", "1")
	t.Setenv("PEBBLE_WFE_NONCEREJECT", "0")
	t.Setenv("PEBBLE_AUTHZREUSE", "0")
	if o.Resolver == "" {
		o.Resolver = StartLoopbackDNS(t)
	}
	logger := log.New(io.Discard, "", 0)
	if testing.Verbose() {
		logger = log.New(os.Stderr, "pebble ", log.Lmicroseconds)
	}
	store := db.NewMemoryStore()
	profiles := map[string]ca.Profile{"default": {Description: "test", ValidityPeriod: o.Validity}}
	authority := ca.New(logger, store, "", "ecdsa", 0, 1, profiles)
	tc := &CA{HTTPPort: FreePort(t), TLSPort: FreePort(t)}
	v := va.New(logger, tc.HTTPPort, tc.TLSPort, false, o.Resolver, store)
	w := wfe.New(logger, store, v, authority, []string{"pebble.letsencrypt.org"}, false, false, 0, 0)
	srv := httptest.NewTLSServer(w.Handler())
	t.Cleanup(srv.Close)
	tc.DirURL = srv.URL + wfe.DirectoryPath

	dir := t.TempDir()
	tc.RootFile = filepath.Join(dir, "ca-root.pem")
	WritePEM(t, tc.RootFile, srv.Certificate().Raw)
	root := authority.GetRootCert(0)
	if root == nil {
		t.Fatal("pebble has no root")
	}
	tc.Roots = x509.NewCertPool()
	tc.Roots.AddCert(root.Cert)
	tc.IssuingRootFile = filepath.Join(dir, "issuing-root.pem")
	WritePEM(t, tc.IssuingRootFile, root.Cert.Raw)
	return tc
}

// WritePEM writes der as one CERTIFICATE block.
func WritePEM(t testing.TB, path string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

// StartLoopbackDNS serves A 127.0.0.1 for every name (no AAAA), on UDP and
// TCP of one port (Pebble's VA asks over TCP), so the VA connects to the
// solvers on loopback.
func StartLoopbackDNS(t testing.TB) string {
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

// Zone is the zone StartNamed serves.
const Zone = "acme.test"

// Named is a running named: the authoritative server of Zone.
type Named struct {
	Addr   string // 127.0.0.1:port, UDP and TCP
	Secret string // the TSIG key "acme-test" (hmac-sha256), base64
}

// Credentials is a dns_credentials_file body for lego's rfc2136 provider
// against n.
func (n Named) Credentials() string {
	return fmt.Sprintf("# RFC 2136 with TSIG\nRFC2136_NAMESERVER=%s\nRFC2136_TSIG_ALGORITHM=hmac-sha256.\n"+
		"RFC2136_TSIG_KEY=acme-test\nRFC2136_TSIG_SECRET=%s\nRFC2136_ZONES=%s\n", n.Addr, n.Secret, Zone)
}

// StartNamed runs Debian's named as the authoritative server of Zone on a
// loopback port, accepting RFC 2136 TXT updates signed with a TSIG key.
// Without named it skips, or fails when CI=true.
func StartNamed(t *testing.T) Named {
	t.Helper()
	bin, err := exec.LookPath("named")
	if err != nil {
		for _, p := range []string{"/usr/sbin/named", "/usr/local/sbin/named"} {
			if _, e := os.Stat(p); e == nil {
				bin, err = p, nil
			}
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("named (Debian bind9) is missing; scripts/ensure-test-deps.sh installs it")
		}
		t.Skip("named (Debian bind9) not installed; run scripts/ensure-test-deps.sh")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil { // named may drop to its own user
		t.Fatal(err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	secret := base64.StdEncoding.EncodeToString(raw)
	port := freeUDPTCPPort(t)
	zone := fmt.Sprintf(`$TTL 5
@ IN SOA ns.%[1]s. admin.%[1]s. 1 60 60 600 5
@ IN NS ns.%[1]s.
ns IN A 127.0.0.1
front IN A 127.0.0.1
`, Zone)
	conf := fmt.Sprintf(`options {
	directory "%[1]s";
	pid-file "%[1]s/named.pid";
	session-keyfile "%[1]s/session.key";
	managed-keys-directory "%[1]s";
	listen-on port %[2]d { 127.0.0.1; };
	listen-on-v6 { none; };
	recursion no;
	dnssec-validation no;
	notify no;
};
controls { };
key "acme-test" { algorithm hmac-sha256; secret "%[3]s"; };
zone "%[4]s" {
	type primary;
	file "%[1]s/zone.db";
	update-policy { grant acme-test zonesub TXT; };
};
`, dir, port, secret, Zone)
	for name, body := range map[string]string{"zone.db": zone, "named.conf": conf} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	logs := &SyncBuffer{}
	cmd := exec.Command(bin, "-g", "-c", filepath.Join(dir, "named.conf"))
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// Ready when it answers the zone's SOA.
	deadline := time.Now().Add(15 * time.Second)
	for {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(Zone), dns.TypeSOA)
		r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, addr)
		if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
			return Named{Addr: addr, Secret: secret}
		}
		if time.Now().After(deadline) {
			t.Fatalf("named did not come up: %v\n%s", err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freeUDPTCPPort is a loopback port free for both UDP and TCP.
func freeUDPTCPPort(t *testing.T) int {
	t.Helper()
	for range 20 {
		p := FreePort(t)
		pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			pc.Close()
			return p
		}
	}
	t.Fatal("no free port")
	return 0
}

// SyncBuffer collects output written from several goroutines.
type SyncBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.b)
}

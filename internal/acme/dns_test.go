package acme

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

const testZone = "acme.test"

// startNamed runs Debian's named as the authoritative server of testZone on
// a loopback port, accepting RFC 2136 TXT updates signed with a TSIG key. It
// returns the address and the key's secret.
func startNamed(t *testing.T) (addr, secret string) {
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
	secret = base64.StdEncoding.EncodeToString(raw)
	port := freeUDPTCPPort(t)
	zone := fmt.Sprintf(`$TTL 5
@ IN SOA ns.%[1]s. admin.%[1]s. 1 60 60 600 5
@ IN NS ns.%[1]s.
ns IN A 127.0.0.1
front IN A 127.0.0.1
`, testZone)
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
`, dir, port, secret, testZone)
	for name, body := range map[string]string{"zone.db": zone, "named.conf": conf} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	logs := &syncBuffer{}
	cmd := exec.Command(bin, "-g", "-c", filepath.Join(dir, "named.conf"))
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr = net.JoinHostPort("127.0.0.1", itoa(port))
	// Ready when it answers the zone's SOA.
	deadline := time.Now().Add(15 * time.Second)
	for {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(testZone), dns.TypeSOA)
		r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, addr)
		if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
			return addr, secret
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
		p := freePort(t)
		pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", itoa(p)))
		if err == nil {
			pc.Close()
			return p
		}
	}
	t.Fatal("no free port")
	return 0
}

func TestObtainDNS01RFC2136(t *testing.T) {
	nsAddr, secret := startNamed(t)
	tc := startTestCA(t, caOptions{resolver: nsAddr})
	key := newKey(t)
	logs := &syncBuffer{}
	o := baseOptions(t, tc, key, logs, "front."+testZone)
	o.Challenge = ChallengeDNS01
	o.HTTPPort, o.TLSALPNPort = freePort(t), freePort(t) // nothing else can succeed
	o.DNSProvider = "rfc2136"
	o.DNSResolvers = []string{nsAddr}
	o.DNSPropagationTimeout = 20 * time.Second
	o.DNSCredentialsFile = filepath.Join(t.TempDir(), "dns.env")
	creds := fmt.Sprintf("# RFC 2136 with TSIG\nRFC2136_NAMESERVER=%s\nRFC2136_TSIG_ALGORITHM=hmac-sha256.\n"+
		"RFC2136_TSIG_KEY=acme-test\nRFC2136_TSIG_SECRET=%s\nRFC2136_ZONES=%s\n", nsAddr, secret, testZone)
	if err := os.WriteFile(o.DNSCredentialsFile, []byte(creds), 0o600); err != nil {
		t.Fatal(err)
	}
	m := startManager(t, o)
	if _, set := os.LookupEnv("RFC2136_TSIG_SECRET"); set {
		t.Fatal("the TSIG secret stayed in the process environment")
	}
	st := waitFor(t, m, "certificate", valid)
	checkServed(t, serveFront(t, m), "front."+testZone, tc, m, st)
	if strings.Contains(logs.String(), secret) {
		t.Fatal("the TSIG secret reached the log")
	}
}

func TestDNSCredentialsFile(t *testing.T) {
	good := "# comment\n\nA_KEY=va=lue with spaces \r\nB=x\n"
	m, err := ParseCredentials([]byte(good))
	if err != nil || m["A_KEY"] != "va=lue with spaces" || m["B"] != "x" || len(m) != 2 {
		t.Fatalf("parse: %v %q", err, m)
	}
	for _, bad := range []string{"", "# only\n", "lower=secretvalue\n", "NOEQUALS secretvalue\n", "A=1\nA=secretvalue\n", "1A=secretvalue\n"} {
		_, err := ParseCredentials([]byte(bad))
		if err == nil {
			t.Errorf("%q accepted", bad)
		} else if strings.Contains(err.Error(), "secretvalue") {
			t.Errorf("error %q repeats a value", err)
		}
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "c.env")
	if err := os.WriteFile(p, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCredentials(p); err == nil {
		t.Fatal("a group/world-readable credentials file was accepted")
	}
	// A credential also in the environment is refused, not shadowed.
	t.Setenv("RFC2136_NAMESERVER", "127.0.0.1:1")
	if _, err := newDNSProvider("rfc2136", map[string]string{"RFC2136_NAMESERVER": "127.0.0.1:2"}); err == nil ||
		os.Getenv("RFC2136_NAMESERVER") != "127.0.0.1:1" {
		t.Fatalf("environment clash: %v", err)
	}
}

func TestValidate(t *testing.T) {
	k := newKey(t)
	base := Options{Names: []string{"front.example.net"}, Key: k, StorageDir: "/var/lib/x/acme", Challenge: ChallengeHTTP01}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(o *Options){
		"ip name":         func(o *Options) { o.Names = []string{"192.0.2.1"} },
		"no names":        func(o *Options) { o.Names = nil },
		"no key":          func(o *Options) { o.Key = nil },
		"relative store":  func(o *Options) { o.StorageDir = "acme" },
		"no challenge":    func(o *Options) { o.Challenge = "" },
		"bad challenge":   func(o *Options) { o.Challenge = "dns01" },
		"dns no provider": func(o *Options) { o.Challenge = ChallengeDNS01 },
		"dns unknown":     func(o *Options) { o.Challenge, o.DNSProvider = ChallengeDNS01, "nosuch" },
		"bad port":        func(o *Options) { o.HTTPPort = 70000 },
		"ratio":           func(o *Options) { o.RenewalWindowRatio = 1 },
		"provider w/ http": func(o *Options) {
			o.DNSProvider = "rfc2136"
		},
	}
	for name, mod := range cases {
		o := base
		mod(&o)
		err := o.Validate()
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if (name == "no challenge" || name == "bad challenge") && !strings.Contains(err.Error(), "dns-01") {
			t.Errorf("%s: %v does not name the three challenges", name, err)
		}
	}
}

package acme

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/acme/acmetest"
)

func TestObtainDNS01RFC2136(t *testing.T) {
	ns := acmetest.StartNamed(t)
	nsAddr, secret := ns.Addr, ns.Secret
	tc := acmetest.StartCA(t, acmetest.Options{Resolver: nsAddr})
	key := newKey(t)
	logs := &syncBuffer{}
	o := baseOptions(t, tc, key, logs, "front."+acmetest.Zone)
	o.Challenge = ChallengeDNS01
	o.HTTPPort, o.TLSALPNPort = acmetest.FreePort(t), acmetest.FreePort(t) // nothing else can succeed
	o.DNSProvider = "rfc2136"
	o.DNSResolvers = []string{nsAddr}
	o.DNSPropagationTimeout = 20 * time.Second
	o.DNSCredentialsFile = filepath.Join(t.TempDir(), "dns.env")
	creds := ns.Credentials()
	if err := os.WriteFile(o.DNSCredentialsFile, []byte(creds), 0o600); err != nil {
		t.Fatal(err)
	}
	m := startManager(t, o)
	if _, set := os.LookupEnv("RFC2136_TSIG_SECRET"); set {
		t.Fatal("the TSIG secret stayed in the process environment")
	}
	st := waitFor(t, m, "certificate", valid)
	checkServed(t, serveFront(t, m), "front."+acmetest.Zone, tc, m, st)
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

package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDefaultsValidate(t *testing.T) {
	c, err := Load("")
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.Listen != ":9443" || c.TLS.Mode != "self_signed" || c.Reach.MaxStreams != 16 || !c.Reach.Credit {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if c.TLS.ACME.HTTPPort != 80 || c.TLS.ACME.TLSALPNPort != 443 {
		t.Fatalf("acme port defaults: %+v", c.TLS.ACME)
	}
}

func TestUnknownKeyNamesFileAndLine(t *testing.T) {
	_, err := Parse("/etc/x.yaml", []byte("listen: \":9443\"\ntls:\n  mode: files\n  cert_fiel: /a\n"))
	if err == nil || !strings.Contains(err.Error(), "/etc/x.yaml:4:") || !strings.Contains(err.Error(), "cert_fiel") {
		t.Fatalf("want file:line error for unknown key, got %v", err)
	}
}

func TestBadValueNamesFileAndLine(t *testing.T) {
	cases := map[string]string{
		"listen: nonsense\n":                                     "c.yaml:1: listen",
		"log:\n  level: chatty\n":                                "c.yaml:2: log.level",
		"upstreams:\n  api: http://10.0.0.5:8642\n":              "c.yaml:2: upstreams.api",
		"upstreams:\n  api: https://127.0.0.1:8642\n":            "c.yaml:2: upstreams.api",
		"upstreams:\n  api: http://u:p@127.0.0.1:1\n":            "c.yaml:2: upstreams.api",
		"upstreams:\n  api: http://127.0.0.1:1/?q=1\n":           "c.yaml:2: upstreams.api",
		"upstreams:\n  api: http://127.0.0.1:1/#f\n":             "c.yaml:2: upstreams.api",
		"advertise_port: 70000\n":                                "c.yaml:1: advertise_port",
		"tls:\n  mode: files\n":                                  "c.yaml:2: tls.mode",
		"tls:\n  key_type: ed25519\n":                            "c.yaml:2: tls.key_type",
		"reach:\n  broker_url: wss://b.example/x\n":              "c.yaml:2: reach.broker_url",
		"reach:\n  broker_url: ws://b.example/v1/connect\n":      "c.yaml:2: reach.broker_url",
		"reach:\n  broker_url: wss://b.example/v1/connect?t=1\n": "c.yaml:2: reach.broker_url",
		"reach:\n  host_id: abc\n":                               "c.yaml:2: reach.host_id",
		"reach:\n  enabled: true\n":                              "reach.broker_url",
		"metrics:\n  listen: 0.0.0.0:9464\n":                     "c.yaml:2: metrics.listen",
		"advertise: \"bad host/\"\n":                             "c.yaml:1: advertise",
		"extra_names: [\"ok.example\", \"a b\"]\n":               "c.yaml:1: extra_names",
		"http3: maybe\n":                                         "c.yaml:1:",
		"reach:\n  max_streams: 0\n":                             "c.yaml:2: reach.max_streams",
		"reach:\n  credit: sometimes\n":                          "c.yaml:2:",
	}
	for in, want := range cases {
		_, err := Parse("c.yaml", []byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: want error containing %q, got %v", in, want, err)
		}
	}
}

func TestAllowRemoteOnlyPrivate(t *testing.T) {
	if _, err := Parse("c", []byte("upstreams:\n  allow_remote: true\n  api: http://172.17.0.2:8642\n")); err != nil {
		t.Fatalf("private upstream with allow_remote: %v", err)
	}
	if _, err := Parse("c", []byte("upstreams:\n  allow_remote: true\n  api: http://8.8.8.8:8642\n")); err == nil {
		t.Fatal("public upstream accepted with allow_remote")
	}
	if _, err := Parse("c", []byte("upstreams:\n  allow_remote: true\n  api: http://example.com:8642\n")); err == nil {
		t.Fatal("DNS upstream accepted with allow_remote")
	}
}

func TestLoopbackForms(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:1", "http://[::1]:1", "http://localhost:1", "http://LOCALHOST:1/base/", "http://127.1.2.3:80"} {
		p, err := ParseUpstream(u, false)
		if err != nil {
			t.Errorf("%s: %v", u, err)
			continue
		}
		if strings.HasSuffix(p.Path, "/") {
			t.Errorf("%s: trailing slash kept: %q", u, p.Path)
		}
	}
}

// tls.mode acme is validated like every other key: DNS names only, the
// challenge required (the error names all three and what each needs), the
// DNS-01 keys, the ports, and the files it names.
func TestACMEConfig(t *testing.T) {
	const ok = "advertise: front.example.net\nextra_names: [alt.example.net]\ntls:\n  mode: acme\n  acme:\n    challenge: http-01\n    http_port: 8080\n"
	c, err := Parse("c.yaml", []byte(ok))
	if err != nil {
		t.Fatalf("good acme config: %v", err)
	}
	if c.TLS.ACME.HTTPPort != 8080 || c.TLS.ACME.TLSALPNPort != 443 || c.CheckFiles() != nil {
		t.Fatalf("parsed %+v", c.TLS.ACME)
	}
	cases := map[string][]string{
		"advertise: front.example.net\ntls:\n  mode: acme\n":                                                                                 {"c.yaml:2: tls.acme.challenge", "dns-01", "http-01", "tls-alpn-01", "dns_provider", "port 80", "port 443"},
		"tls:\n  mode: acme\n  acme:\n    challenge: http-01\n":                                                                              {"c.yaml:2: tls.mode", "advertise"},
		"advertise: 192.0.2.1\ntls:\n  mode: acme\n  acme:\n    challenge: http-01\n":                                                        {"c.yaml:1: advertise", "IP address"},
		"advertise: a.example\nextra_names: [192.0.2.1]\ntls:\n  mode: acme\n  acme:\n    challenge: http-01\n":                              {"c.yaml:2: extra_names"},
		"advertise: a.example\ntls:\n  mode: acme\n  acme:\n    challenge: dns01\n":                                                          {"c.yaml:5: tls.acme.challenge", "dns-01 ("},
		"advertise: a.example\ntls:\n  mode: acme\n  acme:\n    challenge: dns-01\n":                                                         {"tls.acme.dns_provider", "required for dns-01", "tls.acme.dns_credentials_file"},
		"advertise: a.example\ntls:\n  mode: acme\n  acme:\n    challenge: dns-01\n    dns_provider: nosuch\n    dns_credentials_file: /x\n": {"c.yaml:6: tls.acme.dns_provider", "rfc2136"},
		"advertise: a.example\ntls:\n  mode: acme\n  acme:\n    challenge: http-01\n    http_port: 70000\n":                                  {"c.yaml:6: tls.acme.http_port"},
		"advertise: a.example\ntls:\n  mode: acme\n  acme:\n    challenge: http-01\n    dns_provider: rfc2136\n":                             {"c.yaml:6: tls.acme.dns_provider", "only apply to dns-01"},
		"listen: \":8443\"\nadvertise: a.example\ntls:\n  mode: acme\n  acme:\n    challenge: tls-alpn-01\n    tls_alpn_port: 8443\n":        {"c.yaml:7: tls.acme.tls_alpn_port", "own port"},
		"advertise: a.example\ntls:\n  mode: acme\n  acme:\n    challenge: http-01\n    ca: http://ca.example/dir\n":                         {"c.yaml:6: tls.acme.ca", "https"},
	}
	for in, wants := range cases {
		_, err := Parse("c.yaml", []byte(in))
		for _, want := range wants {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%q: want error containing %q, got %v", in, want, err)
			}
		}
	}
	// The credentials file must be private; its error names the key's line.
	dir := t.TempDir()
	creds := filepath.Join(dir, "dns.env")
	os.WriteFile(creds, []byte("RFC2136_NAMESERVER=127.0.0.1:53\n"), 0o644)
	c, err = Parse("c.yaml", []byte("advertise: a.example\ntls:\n  mode: acme\n  acme:\n    challenge: dns-01\n    dns_provider: rfc2136\n    dns_credentials_file: "+creds+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckFiles(); err == nil || !strings.Contains(err.Error(), "c.yaml:7: tls.acme.dns_credentials_file") {
		t.Fatalf("a 0644 credentials file: %v", err)
	}
	os.Chmod(creds, 0o600)
	if err := c.CheckFiles(); err != nil {
		t.Fatalf("a 0600 credentials file: %v", err)
	}
}

func TestResolvePathAndStateDir(t *testing.T) {
	t.Setenv(EnvConfig, "/from/env.yaml")
	if got := ResolvePath("/flag.yaml"); got != "/flag.yaml" {
		t.Fatalf("flag must win, got %q", got)
	}
	if got := ResolvePath(""); got != "/from/env.yaml" {
		t.Fatalf("env must be used, got %q", got)
	}
	t.Setenv("STATE_DIRECTORY", "/var/lib/sd:/other")
	c := Default()
	if d, _ := c.ResolveStateDir(); d != "/var/lib/sd" {
		t.Fatalf("STATE_DIRECTORY: %q", d)
	}
	t.Setenv("STATE_DIRECTORY", "")
	c.File = "/etc/securelink/config.yaml"
	if d, _ := c.ResolveStateDir(); d != "/var/lib/securelink" {
		t.Fatalf("etc config: %q", d)
	}
	c.File = ""
	t.Setenv("HOME", "/home/op")
	if d, _ := c.ResolveStateDir(); d != "/home/op/.hermes/securelink" {
		t.Fatalf("home: %q", d)
	}
	c.StateDir = "/explicit"
	if d, _ := c.ResolveStateDir(); d != "/explicit" {
		t.Fatalf("explicit: %q", d)
	}
}

func TestLoadFileAndExample(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c.yaml")
	os.WriteFile(p, []byte("advertise: Host.Example.\nextra_names: [b.example]\n"), 0o600)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.File != p || c.Advertise != "Host.Example." || !c.Reach.Credit {
		t.Fatalf("loaded %+v", c)
	}
	// reach.credit: false survives the defaults; so does an unset key next to it.
	c, err = Parse("c.yaml", []byte("reach:\n  credit: false\n"))
	if err != nil || c.Reach.Credit || c.Reach.MaxStreams != 16 {
		t.Fatalf("reach.credit: false: %v %+v", err, c.Reach)
	}
	// The shipped example must load as it is, with the defaults.
	ex, err := Load("../../config.example.yaml")
	if err != nil {
		t.Fatalf("config.example.yaml: %v", err)
	}
	if ex.TLS.Mode != "self_signed" || ex.TLS.ACME != Default().TLS.ACME {
		t.Fatalf("config.example.yaml changes tls defaults: %+v", ex.TLS)
	}
}

func TestNormalizeHost(t *testing.T) {
	cases := map[string]string{
		"Host.Example.":    "host.example",
		"[2001:db8::1]":    "2001:db8::1",
		"2001:0db8:0::1":   "2001:db8::1",
		"::ffff:192.0.2.1": "192.0.2.1",
		"bücher.example":   "xn--bcher-kva.example",
		"192.0.2.10":       "192.0.2.10",
	}
	for in, want := range cases {
		got, err := NormalizeHost(in)
		if err != nil || got != want {
			t.Errorf("%q: got %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ".", "a b", "a/b", "h:1", "fe80::1%eth0", "[::1"} {
		if _, err := NormalizeHost(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCanonicalID(t *testing.T) {
	if !CanonicalID("AAAAAAAAAAAAAAAAAAAAAA") || !CanonicalID("_____________________w") {
		t.Fatal("canonical ids refused")
	}
	for _, bad := range []string{"AAAAAAAAAAAAAAAAAAAAAB", "AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAA==", "AAAAAAAAAAAAAAAAAAAA+A"} {
		if CanonicalID(bad) {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"listen: \":9443\"\n",
		"tls:\n  mode: files\n  cert_file: a\n  key_file: b\n",
		"upstreams:\n  api: http://[::1]:1\n",
		"reach:\n  enabled: true\n  broker_url: wss://b/v1/connect\n  host_id: AAAAAAAAAAAAAAAAAAAAAA\n  host_token_file: t\n",
		"- a\n- b\n", "a: [\n", "&a x: *a\n", "extra_names: {a: 1}\n", "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") && !strings.HasPrefix(err.Error(), "config:") {
				t.Fatalf("error without file name: %v", err)
			}
			return
		}
		// Whatever parsed must satisfy the invariants the server relies on.
		for _, u := range []string{c.Upstreams.Relay, c.Upstreams.API, c.Upstreams.Dashboard} {
			if _, err := ParseUpstream(u, c.Upstreams.AllowRemote); err != nil {
				t.Fatalf("accepted invalid upstream %q", u)
			}
		}
		if _, err := ListenPort(c.Listen); err != nil {
			t.Fatalf("accepted invalid listen %q", c.Listen)
		}
	})
}

// An upstream URL is quoted back in the start error and doctor's output
// only without what may be a credential: user info, a query, or a value
// that does not parse at all.
func TestUpstreamErrorsDoNotRepeatCredentials(t *testing.T) {
	for _, raw := range []string{
		"http://hermes:S3CRETVALUE@127.0.0.1:8642",
		"http://S3CRETVALUE@127.0.0.1:8642",
		"https://user:S3CRETVALUE@127.0.0.1:8642",
		"http://127.0.0.1:8642/?key=S3CRETVALUE",
		"http://127.0.0.1:8642/#S3CRETVALUE",
		"http://user:S3CRETVALUE%zz@127.0.0.1:8642",
	} {
		_, err := ParseUpstream(raw, false)
		if err == nil {
			t.Errorf("%s accepted", raw)
			continue
		}
		if strings.Contains(err.Error(), "S3CRETVALUE") {
			t.Errorf("error repeats the credential: %v", err)
		}
		_, err = Parse("c.yaml", []byte("upstreams:\n  api: \""+raw+"\"\n"))
		if err == nil || strings.Contains(err.Error(), "S3CRETVALUE") || !strings.Contains(err.Error(), "upstreams.api") {
			t.Errorf("config error for %s: %v", raw, err)
		}
	}
}

package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

func TestDefaultConfigNeedsOnlyFilesAndTLS(t *testing.T) {
	c := DefaultConfig()
	err := c.Validate()
	for _, key := range []string{"hosts_file", "state_file", "tls"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Fatalf("missing %s not reported: %v", key, err)
		}
	}
	c.HostsFile, c.StateFile = "/x/hosts.json", "/x/state.json"
	c.TLSCertFile, c.TLSKeyFile = "/x/cert.pem", "/x/key.pem"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// max_hosts and replay_per_host deviate from the spec's 256 and 50,000
	// on purpose (docs/decisions.md "Broker defaults for a public broker").
	if c.Listen != ":9444" || c.MaxHosts != 10_000 || c.ReplayPerHost != 2_000 || c.ReplayPerCredential != 500 || c.MaxStreamsPerHost != 16 || c.MaxStreamsPerRoute != 4 ||
		c.AttemptsPerMinute != 30 || c.MaxQueueBytes != 512<<20 || c.RegisterTimeout != 10*time.Second ||
		c.PingInterval != 15*time.Second || c.PongTimeout != 45*time.Second || c.IdleTimeout != 5*time.Minute ||
		c.SlowConsumerTimeout != 10*time.Second || c.TableEntries != 1_000_000 {
		t.Fatalf("defaults differ from the spec and the recorded deviations: %+v", c)
	}
}

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.HostsFile, c.StateFile = "/x/hosts.json", "/x/state.json"
		c.InsecurePlaintext, c.Listen = true, "127.0.0.1:9444"
		return c
	}
	if c := base(); c.Validate() != nil {
		t.Fatal(c.Validate())
	}
	cases := map[string]func(*Config){
		"plaintext on all addresses": func(c *Config) { c.Listen = ":9444" },
		"plaintext on a public IP":   func(c *Config) { c.Listen = "192.0.2.1:9444" },
		"listen host name":           func(c *Config) { c.Listen = "example.com:9444" },
		"acme":                       func(c *Config) { c.ACME.Email = "a@b" },
		"metrics off loopback":       func(c *Config) { c.MetricsListen = "0.0.0.0:9464" },
		"zero streams":               func(c *Config) { c.MaxStreamsPerHost = 0 },
		"credit cap below windows":   func(c *Config) { c.MaxStreamsPerHost = 33 },
		"negative ping":              func(c *Config) { c.PingInterval = -1 },
		"pong before ping":           func(c *Config) { c.PongTimeout = c.PingInterval },
		"tiny queue":                 func(c *Config) { c.MaxQueueBytes = 1024 },
		"same files":                 func(c *Config) { c.StateFile = c.HostsFile },
		"log level":                  func(c *Config) { c.LogLevel = "loud" },
		"credential share = host's":  func(c *Config) { c.ReplayPerCredential = c.ReplayPerHost },
		"credential share > host's":  func(c *Config) { c.ReplayPerCredential, c.ReplayPerHost = 10_000, 2_000 },
	}
	for name, mutate := range cases {
		c := base()
		mutate(&c)
		if c.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	for _, l := range []string{"[::1]:9444", "localhost:1", "127.0.0.2:0"} {
		c := base()
		c.Listen = l
		if err := c.Validate(); err != nil {
			t.Errorf("loopback %s refused: %v", l, err)
		}
	}
}

func writeYAML(t *testing.T, s string) string {
	p := filepath.Join(t.TempDir(), "broker.yaml")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfig(t *testing.T) {
	p := writeYAML(t, `listen: "127.0.0.1:9555"
tls: {cert_file: "", key_file: "", acme: {email: "", ca: "", domains: []}}
insecure_plaintext: true
hosts_file: /var/lib/reach/hosts.json
state_file: /var/lib/reach/state.json
max_hosts: 10
max_streams_per_host: 8
max_streams_per_route: 2
attempts_per_minute: 60
max_queue_bytes: 67108864
credit: false
metrics: {listen: ""}
log: {level: debug, format: json}
`)
	c, err := LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:9555" || !c.InsecurePlaintext || c.MaxHosts != 10 || c.MaxStreamsPerHost != 8 ||
		c.MaxStreamsPerRoute != 2 || c.AttemptsPerMinute != 60 || c.MaxQueueBytes != 64<<20 ||
		c.LogLevel != "debug" || c.LogFormat != "json" || c.HostsFile != "/var/lib/reach/hosts.json" ||
		!c.DisableCredit {
		t.Fatalf("%+v", c)
	}
	// tls.acme with the front's keys plus domains; storage beside the state file.
	c, err = LoadConfig(writeYAML(t, "hosts_file: h\nstate_file: /var/lib/b/state.json\ntls:\n  acme:\n    domains: [Broker.Example]\n    challenge: dns-01\n    dns_provider: rfc2136\n    dns_credentials_file: /etc/b/dns.env\n    email: ops@example.net\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !c.ACME.On() || c.ACME.Challenge != "dns-01" || c.ACME.DNSProvider != "rfc2136" || c.ACME.Email != "ops@example.net" || c.ACMEDir() != "/var/lib/b/acme" {
		t.Fatalf("acme: %+v", c.ACME)
	}
	// More streams per host raise the per-host credit cap to their
	// initial windows, so a file config stays valid.
	c, err = LoadConfig(writeYAML(t, "hosts_file: h\nstate_file: s\ntls: {cert_file: c, key_file: k}\nmax_streams_per_host: 64\n"))
	if err != nil || c.HostCreditBytes != 64*wire.InitialWindow {
		t.Fatalf("max_streams_per_host 64: %v, credit cap %d", err, c.HostCreditBytes)
	}
	// Keys not written keep their defaults.
	c, err = LoadConfig(writeYAML(t, "hosts_file: h\nstate_file: s\ntls: {cert_file: c, key_file: k}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != ":9444" || c.MaxStreamsPerRoute != 4 || c.LogLevel != "info" || c.DisableCredit {
		t.Fatalf("%+v", c)
	}
	c, err = LoadConfig(writeYAML(t, "hosts_file: h\nstate_file: s\ntls: {cert_file: c, key_file: k}\ncredit: true\n"))
	if err != nil || c.DisableCredit {
		t.Fatalf("credit: true: %v %+v", err, c)
	}
}

func TestLoadConfigErrorsNameFileAndLine(t *testing.T) {
	cases := []struct {
		yaml, want string
	}{
		{"hosts_file: h\nstate_file: s\ninsecure_plaintext: true\nlisten: 127.0.0.1:1\nmax_host: 3\n", ":5: unknown key max_host"},
		{"hosts_file: h\nstate_file: s\ninsecure_plaintext: true\nlisten: 127.0.0.1:1\ntls:\n  cert_file: c\n  keyfile: k\n", ":7: unknown key keyfile"},
		{"hosts_file: h\nstate_file: s\ninsecure_plaintext: true\nlisten: 127.0.0.1:1\nmax_streams_per_host: many\n", ":5:"},
		{"hosts_file: h\nstate_file: s\ninsecure_plaintext: true\nlisten: 127.0.0.1:1\nmax_streams_per_route: 0\n", ":5: max_streams_per_route: must be"},
		{"hosts_file: h\nstate_file: s\nlisten: 0.0.0.0:1\ninsecure_plaintext: true\n", ":4: insecure_plaintext: plain ws:// is allowed only"},
		{"hosts_file: h\nstate_file: s\ninsecure_plaintext: true\nlisten: 127.0.0.1:1\ntls:\n  acme:\n    email: a@b\n", ":6: tls.acme: ACME needs TLS"},
		{"hosts_file: h\nstate_file: s\nlisten: :443\ntls:\n  acme:\n    challenge: http-01\n", ":5: tls.acme.domains: required"},
		{"hosts_file: h\nstate_file: s\nlisten: :443\ntls:\n  acme:\n    domains: [b.example]\n", ":5: tls.acme.challenge: required in acme mode"},
		{"hosts_file: h\nstate_file: s\nlisten: :443\ntls:\n  acme:\n    domains: [192.0.2.1]\n    challenge: http-01\n", ":6: tls.acme.domains: entry 1"},
		{"hosts_file: h\nstate_file: s\nlisten: :443\ntls:\n  acme:\n    domains: [b.example]\n    challenge: tls-alpn-01\n", ":5: tls.acme.tls_alpn_port: 443 is the server's own port"},
		{"hosts_file: h\nstate_file: s\nlisten: :443\ntls:\n  cert_file: c\n  key_file: k\n  acme:\n    domains: [b.example]\n    challenge: http-01\n", "not both"},
		{"hosts_file: h\nstate_file: s\ninsecure_plaintext: true\nlisten: 127.0.0.1:1\nmetrics:\n  listen: 10.0.0.1:9\n", ":6: metrics.listen: must be a loopback"},
		{"hosts_file: h\nstate_file: s\ninsecure_plaintext: true\nlisten: 127.0.0.1:1\ncredit: sometimes\n", ":5:"},
		{"- a\n- b\n", ":1: the configuration must be a mapping"},
		{"state_file: s\ninsecure_plaintext: true\nlisten: 127.0.0.1:1\n", "hosts_file: required"},
	}
	for _, c := range cases {
		p := writeYAML(t, c.yaml)
		_, err := LoadConfig(p)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%q: got %v, want %q naming the file", c.yaml, err, c.want)
		}
	}
}

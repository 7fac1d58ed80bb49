// Package config loads the front's YAML configuration.
//
// Loading is strict: an unknown key or a value of the wrong type or range is
// an error naming file:line, because a typo in a security setting that is
// silently ignored is worse than a daemon that refuses to start.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/internal/loopback"
	"github.com/hermes-securelink/securelink/internal/strictyaml"
	"github.com/hermes-securelink/securelink/pinning"
)

// DefaultPath is read when neither --config nor $SECURELINK_CONFIG names a file.
const DefaultPath = "/etc/securelink/config.yaml"

// EnvConfig names the configuration file when --config is not given.
const EnvConfig = "SECURELINK_CONFIG"

// Config is the front's configuration. Field comments give the default.
type Config struct {
	Listen        string    `yaml:"listen"`         // ":9443"
	Advertise     string    `yaml:"advertise"`      // "" = detect once and remember
	AdvertisePort int       `yaml:"advertise_port"` // 0 = the listen port
	ExtraNames    []string  `yaml:"extra_names"`    // more SAN names / accepted Host values
	StateDir      string    `yaml:"state_dir"`      // see ResolveStateDir
	TLS           TLS       `yaml:"tls"`
	HTTP3         bool      `yaml:"http3"` // also serve HTTP/3 on the listen address's UDP port
	Upstreams     Upstreams `yaml:"upstreams"`
	Relay         Relay     `yaml:"relay"`
	Reach         Reach     `yaml:"reach"`
	Admin         Admin     `yaml:"admin"`
	Metrics       Metrics   `yaml:"metrics"`
	Log           Log       `yaml:"log"`

	// File is the file the configuration came from; empty for built-in defaults.
	File string `yaml:"-"`
	// src knows the line of every key in File, for error messages.
	src *strictyaml.Source
}

// TLS selects where the front's identity comes from.
type TLS struct {
	Mode     string        `yaml:"mode"`     // self_signed | files | acme
	KeyType  string        `yaml:"key_type"` // ecdsa-p256 | rsa-3072 (self_signed, acme)
	CertFile string        `yaml:"cert_file"`
	KeyFile  string        `yaml:"key_file"`
	ACME     acme.Settings `yaml:"acme"` // acme mode; http_port 80, tls_alpn_port 443
}

// Upstreams are the three fixed loopback services. No client input selects
// an upstream: these URLs are the only ones the front ever dials.
type Upstreams struct {
	Relay       string `yaml:"relay"`     // http://127.0.0.1:8767
	API         string `yaml:"api"`       // http://127.0.0.1:8642
	Dashboard   string `yaml:"dashboard"` // http://127.0.0.1:9119
	AllowRemote bool   `yaml:"allow_remote"`
}

// Relay holds the /relay bridge settings.
type Relay struct {
	ProxySecretFile string `yaml:"proxy_secret_file"`
}

// Reach configures the outbound host connector.
type Reach struct {
	Enabled       bool   `yaml:"enabled"`
	BrokerURL     string `yaml:"broker_url"`
	HostID        string `yaml:"host_id"`
	HostTokenFile string `yaml:"host_token_file"`
	CAFile        string `yaml:"ca_file"`
	MaxStreams    int    `yaml:"max_streams"` // 16
	// Credit accepts the broker's "credit" flow-control extension when it
	// offers it (true); false keeps every stream on plain v1.
	Credit bool `yaml:"credit"` // true
}

// Admin configures the local control socket.
type Admin struct {
	Socket string `yaml:"socket"` // <state_dir>/admin.sock
}

// Metrics configures the Prometheus listener.
type Metrics struct {
	Listen string `yaml:"listen"` // "" = off; loopback only, e.g. 127.0.0.1:9464
}

// Log configures logging.
type Log struct {
	Level  string `yaml:"level"`  // info
	Format string `yaml:"format"` // auto
}

// Default returns the zero-config configuration.
func Default() *Config {
	return &Config{
		Listen: ":9443",
		TLS: TLS{Mode: "self_signed", KeyType: "ecdsa-p256",
			ACME: acme.Settings{HTTPPort: acme.DefaultHTTPPort, TLSALPNPort: acme.DefaultTLSALPNPort}},
		Upstreams: Upstreams{
			Relay:     "http://127.0.0.1:8767",
			API:       "http://127.0.0.1:8642",
			Dashboard: "http://127.0.0.1:9119",
		},
		Reach: Reach{MaxStreams: 16, Credit: true},
		Log:   Log{Level: "info", Format: "auto"},
	}
}

// ResolvePath picks the configuration file: the flag, else $SECURELINK_CONFIG,
// else DefaultPath when it exists, else "" (built-in defaults).
func ResolvePath(flag string) string {
	if flag != "" {
		return flag
	}
	if env := os.Getenv(EnvConfig); env != "" {
		return env
	}
	if _, err := os.Stat(DefaultPath); err == nil {
		return DefaultPath
	}
	return ""
}

// Load reads and validates the configuration at path; "" yields the defaults.
func Load(path string) (*Config, error) {
	if path == "" {
		c := Default()
		if err := c.Validate(); err != nil {
			return nil, err
		}
		return c, nil
	}
	data, err := strictyaml.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes data (named name in errors) over the defaults and validates it.
func Parse(name string, data []byte) (*Config, error) {
	c := Default()
	src, err := strictyaml.Decode(name, data, c)
	if err != nil {
		return nil, err
	}
	c.File, c.src = name, src
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Errorf formats an error about key, naming file:line when the key came from a file.
func (c *Config) Errorf(key, format string, args ...any) error {
	return c.src.Errorf(key, format, args...)
}

// Validate checks every key. It does not touch the filesystem or network.
func (c *Config) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := ListenPort(c.Listen); err != nil {
		add(c.Errorf("listen", "%v", err))
	}
	if c.Advertise != "" {
		if _, err := NormalizeHost(c.Advertise); err != nil {
			add(c.Errorf("advertise", "%v", err))
		}
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		add(c.Errorf("advertise_port", "must be 0..65535"))
	}
	for i, n := range c.ExtraNames {
		if _, err := NormalizeHost(n); err != nil {
			add(c.Errorf("extra_names", "entry %d: %v", i+1, err))
		}
	}
	switch c.TLS.Mode {
	case "self_signed", "acme":
	case "files":
		if c.TLS.CertFile == "" || c.TLS.KeyFile == "" {
			add(c.Errorf("tls.mode", "files mode needs tls.cert_file and tls.key_file"))
		}
	default:
		add(c.Errorf("tls.mode", "%q is not one of self_signed, files, acme", c.TLS.Mode))
	}
	switch c.TLS.KeyType {
	case "ecdsa-p256", "rsa-3072":
	default:
		add(c.Errorf("tls.key_type", "%q is not one of ecdsa-p256, rsa-3072", c.TLS.KeyType))
	}
	if c.TLS.Mode == "acme" {
		add(c.validateACME())
	}
	for _, u := range []struct{ key, val string }{
		{"upstreams.relay", c.Upstreams.Relay},
		{"upstreams.api", c.Upstreams.API},
		{"upstreams.dashboard", c.Upstreams.Dashboard},
	} {
		if _, err := ParseUpstream(u.val, c.Upstreams.AllowRemote); err != nil {
			add(c.Errorf(u.key, "%v", err))
		}
	}
	if c.Reach.BrokerURL != "" {
		if err := CheckBrokerURL(c.Reach.BrokerURL); err != nil {
			add(c.Errorf("reach.broker_url", "%v", err))
		}
	}
	if c.Reach.HostID != "" && !CanonicalID(c.Reach.HostID) {
		add(c.Errorf("reach.host_id", "must be the 22-character id printed by `securelink broker add-host`"))
	}
	if c.Reach.MaxStreams < 1 || c.Reach.MaxStreams > 64 {
		add(c.Errorf("reach.max_streams", "must be 1..64"))
	}
	if c.Reach.Enabled {
		if c.Reach.BrokerURL == "" {
			add(c.Errorf("reach.broker_url", "required when reach.enabled is true"))
		}
		if c.Reach.HostID == "" {
			add(c.Errorf("reach.host_id", "required when reach.enabled is true (from `securelink broker add-host`)"))
		}
		if c.Reach.HostTokenFile == "" {
			add(c.Errorf("reach.host_token_file", "required when reach.enabled is true"))
		}
	}
	if c.Metrics.Listen != "" {
		if err := CheckLoopbackListen(c.Metrics.Listen); err != nil {
			add(c.Errorf("metrics.listen", "%v", err))
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		add(c.Errorf("log.level", "%q is not one of debug, info, warn, error", c.Log.Level))
	}
	switch c.Log.Format {
	case "auto", "json", "console":
	default:
		add(c.Errorf("log.format", "%q is not one of auto, json, console", c.Log.Format))
	}
	return errors.Join(errs...)
}

// validateACME checks tls.mode acme: DNS names only, and the tls.acme
// block (acme.Settings.Check).
func (c *Config) validateACME() error {
	var errs []error
	if c.Advertise == "" {
		errs = append(errs, c.Errorf("tls.mode", "acme needs advertise: <the DNS name clients use> (an address is never detected for ACME)"))
	} else if isIP(c.Advertise) {
		errs = append(errs, c.Errorf("advertise", "%q is an IP address; tls.mode acme certifies DNS names only", c.Advertise))
	}
	for i, n := range c.ExtraNames {
		if isIP(n) {
			errs = append(errs, c.Errorf("extra_names", "entry %d: %q is an IP address; tls.mode acme certifies DNS names only", i+1, n))
		}
	}
	port, _ := ListenPort(c.Listen)
	for _, e := range c.TLS.ACME.Check(port) {
		errs = append(errs, c.Errorf("tls.acme."+e.Key, "%v", e.Err))
	}
	return errors.Join(errs...)
}

// CheckFiles reads the files the configuration names beyond what Validate
// checks: in acme mode the DNS credentials (0600) and the CA root, and the
// secrets serve refuses to start without — relay.proxy_secret_file when set,
// reach.host_token_file when Reach is on — with the same reader and rules
// serve uses, so doctor cannot pass a setup serve then refuses. Errors name
// file:line and never a secret. doctor runs it with its checks; serve reads
// the secrets itself and runs only CheckACMEFiles.
func (c *Config) CheckFiles() error {
	var errs []error
	if c.Relay.ProxySecretFile != "" {
		if _, _, err := atomicfile.ReadSecret(c.Relay.ProxySecretFile); err != nil {
			errs = append(errs, c.Errorf("relay.proxy_secret_file", "%v", err))
		}
	}
	if c.Reach.Enabled && c.Reach.HostTokenFile != "" {
		switch tok, _, err := atomicfile.ReadSecret(c.Reach.HostTokenFile); {
		case err != nil:
			errs = append(errs, c.Errorf("reach.host_token_file", "%v", err))
		case !wire.ValidWireToken(tok):
			errs = append(errs, c.Errorf("reach.host_token_file", "the token must be %d..%d characters", wire.MinWireToken, wire.MaxWireToken))
		}
	}
	if err := c.CheckACMEFiles(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CheckACMEFiles is CheckFiles' part for tls.mode acme (the DNS
// credentials and the CA root), which serve checks before it builds an
// ACME manager: the secrets it reads at their own places, and a reach.*
// change is a restart's, so a reload must not fail on them.
func (c *Config) CheckACMEFiles() error {
	if c.TLS.Mode != "acme" {
		return nil
	}
	var errs []error
	for _, e := range c.TLS.ACME.CheckFiles() {
		errs = append(errs, c.Errorf("tls.acme."+e.Key, "%v", e.Err))
	}
	return errors.Join(errs...)
}

func isIP(host string) bool {
	n, err := NormalizeHost(host)
	return err == nil && net.ParseIP(n) != nil
}

// ListenPort validates a host:port listen address and returns its port.
func ListenPort(addr string) (int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("%q is not host:port", addr)
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil && host != "localhost" {
			return 0, fmt.Errorf("%q: listen host must be an IP address (or empty for all)", addr)
		}
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return 0, fmt.Errorf("%q: port must be 0..65535", addr)
	}
	return p, nil
}

// NormalizeHost is the authority's host normalization (see package pinning),
// re-exported so configuration errors and the identity agree on names.
func NormalizeHost(s string) (string, error) { return pinning.NormalizeHost(s) }

// ParseUpstream checks an upstream base URL: http:// on loopback (or, with
// allowRemote, a private-network address), no user info, query or fragment.
// A trailing slash on the path is removed so tails join cleanly.
func ParseUpstream(raw string, allowRemote bool) (*url.URL, error) {
	// The value is quoted back only once it is known to hold no user
	// info, query or fragment: an operator who pasted a credential into
	// the URL must not find it in the start error or doctor's output.
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("is not a URL (the value is not repeated: it may hold a credential)")
	}
	if u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "" {
		return nil, fmt.Errorf("%q must not carry user info, a query or a fragment", (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String())
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("%q must be an http:// URL of a loopback service", raw)
	}
	host := u.Hostname()
	if host == "" {
		return nil, fmt.Errorf("%q has no host", raw)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%q has an invalid port", raw)
		}
	}
	if !IsLoopbackHost(host) {
		a, err := netip.ParseAddr(host)
		if !allowRemote {
			return nil, fmt.Errorf("%q is not on loopback (127.0.0.1, ::1 or localhost); set upstreams.allow_remote: true for a private-network service", raw)
		}
		if err != nil || !a.Unmap().IsPrivate() {
			return nil, fmt.Errorf("%q: allow_remote permits only private-network IP addresses", raw)
		}
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// IsLoopbackHost reports whether host is localhost or a loopback address.
func IsLoopbackHost(host string) bool { return loopback.Host(host) }

// CheckBrokerURL enforces the only broker URL form clients accept
// (wss://host[:port]/v1/connect and nothing else), as the wire package
// defines it.
func CheckBrokerURL(raw string) error {
	_, err := wire.ParseBrokerURL(raw)
	return err
}

// CanonicalID reports whether s is a canonical Reach identifier (the host_id form).
func CanonicalID(s string) bool {
	_, err := wire.ParseID(s)
	return err == nil
}

// CheckLoopbackListen requires host:port on a loopback IP (metrics, admin).
func CheckLoopbackListen(addr string) error {
	if err := loopback.CheckListen(addr); err != nil {
		return err
	}
	_, err := ListenPort(addr)
	return err
}

// ResolveStateDir applies the state-directory rule of the operator contract:
// the configured state_dir, else $STATE_DIRECTORY (set by systemd; the first
// entry when it lists several), else /var/lib/securelink when the
// configuration came from /etc/securelink, else ~/.hermes/securelink.
func (c *Config) ResolveStateDir() (string, error) {
	if c.StateDir != "" {
		return filepath.Abs(c.StateDir)
	}
	if sd := os.Getenv("STATE_DIRECTORY"); sd != "" {
		first, _, _ := strings.Cut(sd, ":")
		return filepath.Abs(first)
	}
	if c.File != "" {
		if abs, err := filepath.Abs(c.File); err == nil && strings.HasPrefix(abs, "/etc/securelink/") {
			return "/var/lib/securelink", nil
		}
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return "", errors.New("cannot find a state directory: set state_dir or $HOME")
	}
	return filepath.Join(home, ".hermes", "securelink"), nil
}

// AdminSocket returns the admin socket path for stateDir.
func (c *Config) AdminSocket(stateDir string) string {
	if c.Admin.Socket != "" {
		return c.Admin.Socket
	}
	return filepath.Join(stateDir, "admin.sock")
}

package server

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/loopback"
	"github.com/hermes-securelink/securelink/internal/strictyaml"
	"github.com/hermes-securelink/securelink/pinning"
)

// Config is the broker's configuration. The operator sets the first group
// through the YAML file (LoadConfig); the rest are protocol limits and
// timers with the spec's defaults, kept as fields so tests can shorten them.
type Config struct {
	// Listen is the TCP address of the HTTPS/WSS endpoint. Default ":9444".
	Listen string
	// TLSCertFile and TLSKeyFile are the PEM certificate chain and key.
	// Required unless InsecurePlaintext.
	TLSCertFile string
	TLSKeyFile  string
	// ACME, when set (ACMEConfig.On), obtains and renews the endpoint's
	// certificate instead of TLSCertFile/TLSKeyFile: storage and the
	// broker's own persistent key under <directory of StateFile>/acme.
	ACME ACMEConfig
	// InsecurePlaintext serves plain ws:// — only with a loopback Listen
	// address (tests, a TLS-terminating proxy on the same machine).
	InsecurePlaintext bool
	// HostsFile lists the hosts and their token digests. Required.
	HostsFile string
	// StateFile keeps published, consumed and revoked digests across
	// restarts. Required.
	StateFile string
	// MaxHosts bounds online hosts. Default 10,000 (wire.MaxHosts).
	MaxHosts int
	// MaxStreamsPerHost bounds one host's live streams. Default 16.
	MaxStreamsPerHost int
	// MaxStreamsPerRoute bounds the live streams of one route credential.
	// Default 4 (a client needs its Relay WebSocket and an API request).
	MaxStreamsPerRoute int
	// AttemptsPerMinute bounds connect attempts per source address (IPv4
	// address or IPv6 /64); more get HTTP 429. Default 30.
	AttemptsPerMinute int
	// MaxQueueBytes bounds all queues of the broker together. Default 512 MiB.
	MaxQueueBytes int64
	// MetricsListen serves Prometheus text at /metrics; loopback only.
	MetricsListen string
	// LogLevel (debug|info|warn|error, default info) and LogFormat
	// (auto|json|console, default auto) are for the CLI that builds the
	// logger; the broker itself only receives the logger.
	LogLevel  string
	LogFormat string

	// MaxCredentialsPerHost bounds one host's live published credentials.
	// Default 1024.
	MaxCredentialsPerHost int
	// TableEntries bounds each tracking table (replayed connection ids,
	// consumed digests, revoked digests, closed stream ids). Default 1,000,000.
	TableEntries int
	// ReplayPerCredential and ReplayPerHost bound the live client entries of
	// the replay cache (kept 24 h + 5 min each) of one credential and of all
	// of one host's credentials together; past either, that credential's or
	// host's matches get quota_exceeded until entries expire. The client
	// table is bounded by MaxHosts × ReplayPerHost. Defaults 500 and 2,000
	// (wire.ReplayPerHost says why not the spec's 10,000 and 50,000); the
	// per-credential share must be below the per-host one, else one
	// credential can spend all of its host's.
	ReplayPerCredential int
	ReplayPerHost       int
	// MaxRateSources bounds the sources the rate limiter tracks at once;
	// when it is full, the least recently seen source is forgotten.
	// Default 65536.
	MaxRateSources int
	// StreamQueueFrames and StreamQueueBytes bound each stream's queue in
	// each direction. Defaults 32 frames and 8 MiB. A credit stream's
	// client-bound queue holds up to creditQueueFrames times the frames
	// when they are large (its credit bounds their bytes).
	StreamQueueFrames int
	StreamQueueBytes  int
	// HostQueueBytes bounds all host-bound queues of one host together.
	// Default 8 MiB.
	HostQueueBytes int
	// HostCreditBytes caps what one host has committed to the broker over
	// its credit streams: the client-bound bytes queued for them plus the
	// credit the host still holds. The broker never sends a WINDOW grant
	// that would pass it (nor stops reading the host socket for it). The
	// 256 KiB initial window of each new stream counts but is the
	// protocol's: it may pass the cap only while ended streams still
	// deliver their bytes, and grants wait until the sum is back under.
	// It must hold MaxStreamsPerHost initial windows (a file config
	// raises it to that); default 8 MiB (16 × 256 KiB = 4 MiB). A stream
	// whose client keeps up may have its window grow beyond 256 KiB, up
	// to MaxStreamWindow, within this cap.
	HostCreditBytes int
	// DisableCredit makes registered offer no extension: every host runs
	// plain v1 (tests and benchmarks compare the two). YAML `credit`
	// (default true) is its negation.
	DisableCredit bool
	// ShutdownRetryAfter is the reconnect delay Close advises its hosts in
	// the close reason "shutdown retry=SECONDS" (whole seconds, at most
	// 10 min). Default 5 s: about a restart.
	ShutdownRetryAfter time.Duration
	// ClientWriteChunk is the largest message written to a client. The
	// host's DATA payloads queued for a client are coalesced into messages
	// of up to this size when the writer is free (it never waits to fill
	// one), so a bulk download reaches the Android app in few messages: it
	// drops a tunnel once 32 messages wait unread. Message boundaries mean
	// nothing on a client socket. Default 256 KiB.
	ClientWriteChunk int
	// MaxPendingReplies bounds control replies queued for a host that does
	// not read them; the host's socket is not read meanwhile. Default 64.
	MaxPendingReplies int

	// RegisterTimeout: the first message must arrive within it. Default 10 s.
	RegisterTimeout time.Duration
	// PingInterval: every socket is pinged this often. Default 15 s.
	PingInterval time.Duration
	// PongTimeout: a socket without a pong for this long is dropped.
	// Default 45 s.
	PongTimeout time.Duration
	// IdleTimeout: a stream without payload bytes in either direction for
	// this long is closed. Default 5 min.
	IdleTimeout time.Duration
	// SlowConsumerTimeout: a client that makes no progress on its full
	// client-bound queue for this long loses its stream (1013). Default 10 s.
	SlowConsumerTimeout time.Duration
	// WriteTimeout is the per-write deadline on every socket: a peer that
	// does not accept one message (at most 1 MiB to a host, ClientWriteChunk
	// to a client) within it is dropped. Default 20 s.
	WriteTimeout time.Duration
	// ShutdownGrace bounds how long Close waits for sockets to finish their
	// close handshakes before cutting them. Default 10 s.
	ShutdownGrace time.Duration
	// SweepInterval: expired credentials and table entries are swept this
	// often. Default 1 min.
	SweepInterval time.Duration

	// Cluster is the `cluster:` block (clusterconfig.go); disabled by
	// default.
	Cluster ClusterConfig
	// Shared, when set, is the cluster's shared state (cluster mode,
	// shared.go): state_file is then neither read nor written. Set by the
	// caller (broker/cluster builds it from the `cluster:` block), not YAML.
	Shared Shared
	// Forward, with Shared, relays clients to the instance holding their
	// host (forward.go); nil: a host not registered here is host_offline.
	Forward Forwarder

	// ACMERenewalWindowRatio and ACMERenewCheckInterval shorten certmagic's
	// renewal schedule (acme.Options); for tests, zero in production.
	ACMERenewalWindowRatio float64
	ACMERenewCheckInterval time.Duration

	// Now returns the wall clock used for credential expiry; nil means
	// time.Now. Tests move it forward instead of sleeping.
	Now func() time.Time

	// src locates keys in the YAML file for error messages.
	src *strictyaml.Source
}

// ACMEConfig is the tls.acme block: the front's keys (acme.Settings) and the
// names to certify, the first being what hosts and clients dial.
type ACMEConfig struct {
	acme.Settings `yaml:",inline"`
	Domains       []string `yaml:"domains"`
}

// On reports whether any tls.acme key is set.
func (a ACMEConfig) On() bool { return a.Settings.Set() || len(a.Domains) > 0 }

// DefaultConfig returns the spec's defaults. HostsFile and StateFile have no
// default and must be set.
func DefaultConfig() Config {
	return Config{
		Listen:                ":9444",
		MaxHosts:              wire.MaxHosts,
		MaxStreamsPerHost:     wire.MaxStreamsPerHost,
		MaxStreamsPerRoute:    wire.MaxStreamsPerRoute,
		AttemptsPerMinute:     wire.AttemptsPerMinute,
		MaxQueueBytes:         wire.BrokerQueueBytes,
		LogLevel:              "info",
		LogFormat:             "auto",
		MaxCredentialsPerHost: wire.MaxCredentialsPerHost,
		TableEntries:          wire.TrackingTableEntries,
		ReplayPerCredential:   wire.ReplayPerCredential,
		ReplayPerHost:         wire.ReplayPerHost,
		MaxRateSources:        65536,
		StreamQueueFrames:     wire.StreamQueueFrames,
		StreamQueueBytes:      wire.StreamQueueBytes,
		HostQueueBytes:        wire.HostQueueBytes,
		HostCreditBytes:       wire.HostQueueBytes,
		ShutdownRetryAfter:    5 * time.Second,
		ClientWriteChunk:      256 << 10,
		MaxPendingReplies:     64,
		RegisterTimeout:       wire.RegisterTimeout,
		PingInterval:          wire.PingInterval,
		PongTimeout:           wire.PongTimeout,
		IdleTimeout:           wire.IdleTimeout,
		SlowConsumerTimeout:   wire.SlowConsumerTimeout,
		WriteTimeout:          20 * time.Second,
		ShutdownGrace:         10 * time.Second,
		SweepInterval:         time.Minute,
		Cluster:               defaultCluster(),
	}
}

// Validate checks every field; errors name the YAML key (and file:line when
// the configuration came from a file).
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, c.errorf(key, format, args...))
	}
	host, port, err := net.SplitHostPort(c.Listen)
	if err != nil {
		bad("listen", "%q is not host:port", c.Listen)
	} else {
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			bad("listen", "%q: port must be 0..65535", c.Listen)
		}
		if host != "" && host != "localhost" {
			if _, err := netip.ParseAddr(host); err != nil {
				bad("listen", "%q: listen host must be an IP address (or empty for all)", c.Listen)
			}
		}
	}
	if c.InsecurePlaintext {
		if !loopback.Host(host) {
			bad("insecure_plaintext", "plain ws:// is allowed only with a loopback listen address (e.g. 127.0.0.1:9444), not %q", c.Listen)
		}
	} else if !c.ACME.On() && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
		bad("tls", "tls.cert_file and tls.key_file, or tls.acme, are required (or insecure_plaintext: true on a loopback listen address)")
	}
	if c.ACME.On() {
		c.validateACME(bad, port)
	}
	c.validateCluster(bad)
	if c.MetricsListen != "" {
		if h, _, err := net.SplitHostPort(c.MetricsListen); err != nil || !loopback.Host(h) {
			bad("metrics.listen", "must be a loopback host:port, e.g. 127.0.0.1:9465")
		}
	}
	if c.HostsFile == "" {
		bad("hosts_file", "required (created by `securelink broker add-host`)")
	}
	if c.StateFile == "" {
		bad("state_file", "required")
	}
	if c.HostsFile != "" && c.HostsFile == c.StateFile {
		bad("state_file", "must differ from hosts_file")
	}
	ints := []struct {
		key      string
		v, lo, h int
	}{
		{"max_hosts", c.MaxHosts, 1, 1 << 16},
		{"max_streams_per_host", c.MaxStreamsPerHost, 1, 1 << 16},
		{"max_streams_per_route", c.MaxStreamsPerRoute, 1, 1 << 16},
		{"attempts_per_minute", c.AttemptsPerMinute, 1, 1 << 20},
		{"max_credentials_per_host", c.MaxCredentialsPerHost, 1, 1 << 20},
		{"table_entries", c.TableEntries, 16, 1 << 28},
		{"replay_per_credential", c.ReplayPerCredential, 1, 1 << 24},
		{"replay_per_host", c.ReplayPerHost, 1, 1 << 24},
		{"max_rate_sources", c.MaxRateSources, 1, 1 << 24},
		{"stream_queue_frames", c.StreamQueueFrames, 2, 1 << 16},
		{"stream_queue_bytes", c.StreamQueueBytes, 2 * wire.MaxHostFrameIn, 1 << 30},
		{"host_queue_bytes", c.HostQueueBytes, 2 * wire.MaxHostFrameIn, 1 << 30},
		{"host_credit_bytes", c.HostCreditBytes, wire.GrantThreshold, 1 << 30},
		{"client_write_chunk", c.ClientWriteChunk, 512, wire.MaxClientFrame},
		{"max_pending_replies", c.MaxPendingReplies, 1, 1 << 16},
	}
	for _, f := range ints {
		if f.v < f.lo || f.v > f.h {
			bad(f.key, "must be %d..%d, not %d", f.lo, f.h, f.v)
		}
	}
	if c.ReplayPerCredential >= c.ReplayPerHost {
		bad("replay_per_credential", "must be below replay_per_host (%d), not %d: one credential would spend its host's whole share",
			c.ReplayPerHost, c.ReplayPerCredential)
	}
	if !c.DisableCredit && c.HostCreditBytes/wire.InitialWindow < c.MaxStreamsPerHost {
		// Else streams that hold their initial window unused could keep the
		// cap full while another stream waits for a grant forever.
		bad("host_credit_bytes", "must hold max_streams_per_host initial windows of 256 KiB (%d), not %d (or set credit: false)",
			c.MaxStreamsPerHost*wire.InitialWindow, c.HostCreditBytes)
	}
	if c.ShutdownRetryAfter < 0 || c.ShutdownRetryAfter > wire.MaxAdvisedRetry {
		bad("shutdown_retry_after", "must be 0..%v", wire.MaxAdvisedRetry)
	}
	if c.MaxQueueBytes < 4*wire.MaxHostFrameIn || c.MaxQueueBytes > 1<<40 {
		bad("max_queue_bytes", "must be at least %d bytes", 4*wire.MaxHostFrameIn)
	}
	durs := []struct {
		key string
		v   time.Duration
	}{
		{"register_timeout", c.RegisterTimeout},
		{"ping_interval", c.PingInterval},
		{"pong_timeout", c.PongTimeout},
		{"idle_timeout", c.IdleTimeout},
		{"slow_consumer_timeout", c.SlowConsumerTimeout},
		{"write_timeout", c.WriteTimeout},
		{"shutdown_grace", c.ShutdownGrace},
		{"sweep_interval", c.SweepInterval},
	}
	for _, d := range durs {
		if d.v <= 0 {
			bad(d.key, "must be a positive duration")
		}
	}
	if c.PongTimeout > 0 && c.PongTimeout <= c.PingInterval {
		bad("pong_timeout", "must be longer than ping_interval")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	switch c.LogFormat {
	case "auto", "json", "console":
	default:
		bad("log.format", "%q is not one of auto, json, console", c.LogFormat)
	}
	return errors.Join(errs...)
}

// validateACME checks tls.acme: DNS names, the shared tls.acme rules, and
// not both ACME and certificate files.
func (c *Config) validateACME(bad func(key, format string, args ...any), listenPort string) {
	if c.InsecurePlaintext {
		bad("tls.acme", "ACME needs TLS; it does not go with insecure_plaintext")
	}
	if c.TLSCertFile != "" || c.TLSKeyFile != "" {
		bad("tls.acme", "set tls.acme or tls.cert_file/key_file, not both")
	}
	if len(c.ACME.Domains) == 0 {
		bad("tls.acme.domains", "required: the broker's DNS names (the first is what hosts and clients dial)")
	}
	for i, d := range c.ACME.Domains {
		n, err := pinning.NormalizeHost(d)
		if err != nil {
			bad("tls.acme.domains", "entry %d: %v", i+1, err)
		} else if net.ParseIP(n) != nil {
			bad("tls.acme.domains", "entry %d: %q is an IP address; ACME certifies DNS names only", i+1, d)
		}
	}
	port, _ := strconv.Atoi(listenPort)
	for _, e := range c.ACME.Check(port) {
		bad("tls.acme."+e.Key, "%v", e.Err)
	}
}

// ACMEDir is the broker's ACME storage (and its persistent key):
// <directory of state_file>/acme.
func (c *Config) ACMEDir() string { return filepath.Join(filepath.Dir(c.StateFile), "acme") }

// MaxStreamWindow is how far the broker lets a credit stream's host→client
// window grow (growLocked): what one stream may queue (StreamQueueBytes),
// leaving every other stream of the host its initial window under
// HostCreditBytes. Defaults: min(8 MiB, 8 MiB − 15 × 256 KiB) = 4.25 MiB.
func (c *Config) MaxStreamWindow() int {
	return max(wire.InitialWindow, min(c.StreamQueueBytes, c.HostCreditBytes-(c.MaxStreamsPerHost-1)*wire.InitialWindow))
}

func (c *Config) errorf(key, format string, args ...any) error {
	if c.src == nil {
		return fmt.Errorf("broker config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	return c.src.Errorf(key, format, args...)
}

func (c *Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// ---------------------------------------------------------------------------
// YAML file

// fileConfig is the YAML form (spec/operations.md "Broker configuration").
// Pointers tell "absent" from "zero" so defaults survive.
type fileConfig struct {
	Listen            *string     `yaml:"listen"`
	TLS               fileTLS     `yaml:"tls"`
	InsecurePlaintext *bool       `yaml:"insecure_plaintext"`
	HostsFile         *string     `yaml:"hosts_file"`
	StateFile         *string     `yaml:"state_file"`
	MaxHosts          *int        `yaml:"max_hosts"`
	MaxStreamsPerHost *int        `yaml:"max_streams_per_host"`
	MaxStreamsPerRt   *int        `yaml:"max_streams_per_route"`
	AttemptsPerMinute *int        `yaml:"attempts_per_minute"`
	MaxQueueBytes     *int64      `yaml:"max_queue_bytes"`
	Credit            *bool       `yaml:"credit"` // false sets DisableCredit
	Metrics           fileMetrics `yaml:"metrics"`
	Log               fileLog     `yaml:"log"`
	// Cluster is decoded over its defaults (ParseConfig).
	Cluster ClusterConfig `yaml:"cluster"`
}

type fileTLS struct {
	CertFile *string    `yaml:"cert_file"`
	KeyFile  *string    `yaml:"key_file"`
	ACME     ACMEConfig `yaml:"acme"`
}

type fileMetrics struct {
	Listen string `yaml:"listen"`
}

type fileLog struct {
	Level  *string `yaml:"level"`
	Format *string `yaml:"format"`
}

// LoadConfig reads the broker's YAML configuration over the defaults and
// validates it. Unknown keys, wrong types and bad values are errors naming
// file:line.
func LoadConfig(path string) (*Config, error) {
	data, err := strictyaml.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("broker config: %w", err)
	}
	return ParseConfig(path, data)
}

// ParseConfig decodes data (named name in errors) over DefaultConfig and
// validates the result.
func ParseConfig(name string, data []byte) (*Config, error) {
	c := DefaultConfig()
	fc := fileConfig{Cluster: c.Cluster}
	src, err := strictyaml.Decode(name, data, &fc)
	if err != nil {
		return nil, err
	}
	c.src = src
	fc.apply(&c)
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (fc *fileConfig) apply(c *Config) {
	set := func(dst *string, src *string) {
		if src != nil {
			*dst = *src
		}
	}
	setInt := func(dst *int, src *int) {
		if src != nil {
			*dst = *src
		}
	}
	set(&c.Listen, fc.Listen)
	set(&c.TLSCertFile, fc.TLS.CertFile)
	set(&c.TLSKeyFile, fc.TLS.KeyFile)
	c.ACME = fc.TLS.ACME
	if fc.InsecurePlaintext != nil {
		c.InsecurePlaintext = *fc.InsecurePlaintext
	}
	set(&c.HostsFile, fc.HostsFile)
	set(&c.StateFile, fc.StateFile)
	setInt(&c.MaxHosts, fc.MaxHosts)
	setInt(&c.MaxStreamsPerHost, fc.MaxStreamsPerHost)
	// The per-host credit cap is not in the file: it grows with the
	// streams a host may have (Validate).
	c.HostCreditBytes = max(c.HostCreditBytes, c.MaxStreamsPerHost*wire.InitialWindow)
	setInt(&c.MaxStreamsPerRoute, fc.MaxStreamsPerRt)
	setInt(&c.AttemptsPerMinute, fc.AttemptsPerMinute)
	if fc.MaxQueueBytes != nil {
		c.MaxQueueBytes = *fc.MaxQueueBytes
	}
	if fc.Credit != nil {
		c.DisableCredit = !*fc.Credit
	}
	c.MetricsListen = fc.Metrics.Listen
	set(&c.LogLevel, fc.Log.Level)
	set(&c.LogFormat, fc.Log.Format)
	c.Cluster = fc.Cluster
}

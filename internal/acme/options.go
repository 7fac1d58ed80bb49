// Package acme obtains and renews the front's certificate from an ACME CA
// with certmagic in managed mode (never on-demand), for a fixed list of DNS
// names, always with the appliance's persistent identity key, so the SPKI pin
// clients hold survives every renewal.
//
// The package is the self-contained core of `tls.mode: acme`
// (spec/secure-link.md "ACME mode"): the daemon builds a Manager from the
// configuration, serves Manager.GetCertificate, and reads Manager.Status for
// `status`, `pin`, `doctor` and the metrics.
package acme

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/pinning"
)

// Challenge kinds (tls.acme.challenge).
const (
	ChallengeHTTP01    = "http-01"
	ChallengeTLSALPN01 = "tls-alpn-01"
	ChallengeDNS01     = "dns-01"
)

// DefaultCA is Let's Encrypt's production directory, used when Options.CA is
// empty.
const DefaultCA = "https://acme-v02.api.letsencrypt.org/directory"

const (
	// DefaultHTTPPort is where the HTTP-01 solver listens by default.
	DefaultHTTPPort = 80
	// DefaultTLSALPNPort is where the TLS-ALPN-01 solver listens by default.
	DefaultTLSALPNPort = 443
	// maxPEMFile bounds the CA root file read.
	maxPEMFile = 1 << 20
)

// ChallengeHelp names the three challenges and what each needs; a start error
// about tls.acme.challenge quotes it.
const ChallengeHelp = `tls.acme.challenge must be one of: ` +
	`dns-01 (a DNS provider API; works behind NAT and for names resolving to private addresses; ` +
	`needs tls.acme.dns_provider and tls.acme.dns_credentials_file), ` +
	`http-01 (the CA must reach port 80 of the name; the solver listens on tls.acme.http_port, default 80), ` +
	`tls-alpn-01 (the CA must reach port 443 of the name; the solver listens on tls.acme.tls_alpn_port, default 443)`

// Options configures a Manager. Zero values take the documented defaults.
type Options struct {
	// Names are the DNS names to certify; Names[0] is the authority (what
	// clients connect to, and the certificate served for an empty SNI), the
	// rest are extra_names. IP addresses are refused. Required.
	Names []string

	// Key is the persistent identity key every certificate is issued for
	// (*ecdsa.PrivateKey, *rsa.PrivateKey or ed25519.PrivateKey). Required.
	Key crypto.Signer

	// StorageDir holds certmagic's storage (account, certificates, locks):
	// <state_dir>/acme. Created 0700; files are written 0600. Required.
	StorageDir string

	// CA is the ACME directory URL (default DefaultCA). It must be https
	// unless the host is a loopback or internal host (certmagic's rule).
	CA string
	// CARootFile is a PEM file of roots that sign the directory's own HTTPS
	// endpoint (a private CA); empty = the system roots.
	CARootFile string
	// Email is the optional contact given to the CA. Empty never prompts.
	Email string

	// Challenge is ChallengeHTTP01, ChallengeTLSALPN01 or ChallengeDNS01.
	// Required.
	Challenge string
	// ListenHost is the address the HTTP-01 and TLS-ALPN-01 solvers bind
	// (default: all addresses).
	ListenHost string
	// HTTPPort is where the HTTP-01 solver listens (default 80); the CA
	// always connects to port 80, so anything else must be forwarded.
	HTTPPort int
	// TLSALPNPort is where the TLS-ALPN-01 solver listens (default 443);
	// it must not be the front's own port.
	TLSALPNPort int
	// DNSProvider is a lego DNS provider name (see DNSProviders) for dns-01.
	DNSProvider string
	// DNSCredentialsFile is the 0600 KEY=VALUE file with that provider's
	// settings, in lego's variable names (see ParseCredentials).
	DNSCredentialsFile string
	// DNSResolvers ("host:port") are asked for the dns-01 TXT record before
	// the CA is told to look, and are the resolvers lego uses for its own
	// lookups (zone apex, CNAME). Empty = the zone's authoritative
	// nameservers, found through the system resolvers.
	DNSResolvers []string
	// DNSPropagationTimeout bounds that wait (default: the provider's own
	// timeout, else 2 minutes).
	DNSPropagationTimeout time.Duration

	// RenewalWindowRatio overrides certmagic's renewal window (the fraction
	// of the lifetime before expiry when renewal starts; default 1/3). When
	// set, ACME Renewal Information (ARI) is not consulted, so the ratio
	// alone decides. For tests.
	RenewalWindowRatio float64
	// RenewCheckInterval overrides how often certmagic checks for renewal
	// (default 10 minutes). For tests.
	RenewCheckInterval time.Duration

	// OnEvent, when set, is called (from a certmagic goroutine; keep it
	// short) when a certificate is installed or the key changed.
	OnEvent func(Event)
	// Logger receives everything certmagic and lego log, bridged from zap
	// and slog; nothing is printed to stdout.
	Logger zerolog.Logger
}

// checked is Options with defaults applied and derived values resolved.
type checked struct {
	Options
	key  crypto.Signer
	spki []byte // DER of the identity key's SubjectPublicKeyInfo
	pin  string
}

// Validate reports the first problem with o, naming the tls.acme key an
// operator would fix. It does not touch the network or the storage.
func (o Options) Validate() error {
	_, err := o.check()
	return err
}

func (o Options) check() (checked, error) {
	c := checked{Options: o}
	if len(c.Names) == 0 {
		return c, errors.New("acme: no names to certify (the authority must be a DNS name)")
	}
	seen := map[string]bool{}
	names := make([]string, 0, len(c.Names))
	for _, n := range c.Names {
		n = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(n), "."))
		if n == "" {
			return c, errors.New("acme: empty name")
		}
		if net.ParseIP(strings.Trim(n, "[]")) != nil {
			return c, fmt.Errorf("acme: %q is an IP address; ACME mode certifies DNS names only (advertise must be a DNS name)", n)
		}
		if strings.Contains(n, "*") {
			return c, fmt.Errorf("acme: %q: wildcard names are not requested", n)
		}
		norm, err := pinning.NormalizeHost(n)
		if err != nil {
			return c, fmt.Errorf("acme: %q: %w", n, err)
		}
		if !seen[norm] {
			seen[norm] = true
			names = append(names, norm)
		}
	}
	c.Names = names

	if c.Key == nil {
		return c, errors.New("acme: no identity key")
	}
	c.key = c.Key
	switch c.key.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey, ed25519.PrivateKey:
	default:
		return c, fmt.Errorf("acme: identity key type %T is not supported", c.key)
	}
	spki, err := x509.MarshalPKIXPublicKey(c.key.Public())
	if err != nil {
		return c, fmt.Errorf("acme: identity key: %w", err)
	}
	c.spki = spki
	c.pin = pinning.SPKIPin(&x509.Certificate{RawSubjectPublicKeyInfo: spki})

	if c.StorageDir == "" {
		return c, errors.New("acme: no storage directory")
	}
	if !filepath.IsAbs(c.StorageDir) {
		return c, fmt.Errorf("acme: storage directory %q must be absolute", c.StorageDir)
	}

	// The rules of the tls.acme block, as config validation applies them:
	// one set, so the manager cannot accept what the configuration refuses
	// (before, a plain http:// CA passed here).
	if errs := (Settings{CA: c.CA, Challenge: c.Challenge, HTTPPort: c.HTTPPort, TLSALPNPort: c.TLSALPNPort,
		DNSProvider: c.DNSProvider, DNSCredentialsFile: c.DNSCredentialsFile}).Check(0); len(errs) > 0 {
		return c, fmt.Errorf("tls.acme.%s: %w", errs[0].Key, errs[0].Err)
	}
	if c.CA == "" {
		c.CA = DefaultCA
	}
	if c.CARootFile != "" {
		if _, err := readRoots(c.CARootFile); err != nil {
			return c, err
		}
	}
	if c.Challenge == ChallengeDNS01 {
		if _, err := ReadCredentials(c.DNSCredentialsFile); err != nil {
			return c, err
		}
		for _, r := range c.DNSResolvers {
			if _, _, err := net.SplitHostPort(r); err != nil {
				return c, fmt.Errorf("acme: DNS resolver %q: want host:port", r)
			}
		}
	}
	if c.HTTPPort == 0 {
		c.HTTPPort = DefaultHTTPPort
	}
	if c.TLSALPNPort == 0 {
		c.TLSALPNPort = DefaultTLSALPNPort
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"http_port", c.HTTPPort}, {"tls_alpn_port", c.TLSALPNPort}} {
		if p.v < 1 || p.v > 65535 {
			return c, fmt.Errorf("tls.acme.%s %d: want 1-65535", p.name, p.v)
		}
	}
	if c.RenewalWindowRatio < 0 || c.RenewalWindowRatio >= 1 {
		return c, fmt.Errorf("acme: renewal window ratio %v: want 0 (default) or a fraction below 1", c.RenewalWindowRatio)
	}
	if c.RenewCheckInterval < 0 || c.DNSPropagationTimeout < 0 {
		return c, errors.New("acme: negative interval")
	}
	return c, nil
}

// readRoots loads the PEM certificates of path into a pool.
func readRoots(path string) (*x509.CertPool, error) {
	data, err := readBounded(path, maxPEMFile)
	if err != nil {
		return nil, fmt.Errorf("tls.acme.ca_root_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("tls.acme.ca_root_file %s: no PEM certificate", path)
	}
	return pool, nil
}

// readBounded reads a public file of at most max bytes.
func readBounded(path string, max int64) ([]byte, error) {
	data, _, err := atomicfile.ReadPrivate(path, max, 0)
	return data, err
}

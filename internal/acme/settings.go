package acme

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Settings is the tls.acme block of both configuration files, the front's
// and the broker's (operations.md); the broker adds its own domains list.
// Zero ports mean the defaults.
type Settings struct {
	Email              string `yaml:"email"`
	CA                 string `yaml:"ca"`
	CARootFile         string `yaml:"ca_root_file"`
	Challenge          string `yaml:"challenge"`
	HTTPPort           int    `yaml:"http_port"`
	TLSALPNPort        int    `yaml:"tls_alpn_port"`
	DNSProvider        string `yaml:"dns_provider"`
	DNSCredentialsFile string `yaml:"dns_credentials_file"`
}

// SettingError is one problem in a tls.acme block; Key is relative to it
// ("challenge", "dns_provider"), so the caller can name file:line.
type SettingError struct {
	Key string
	Err error
}

// Set reports whether any key of the block is set (the broker turns ACME on
// by setting it).
func (s Settings) Set() bool { return s != (Settings{}) }

// Check validates the block without touching the filesystem or network.
// servingPort, when not 0, is the TCP port the server itself listens on:
// the TLS-ALPN-01 solver cannot share it.
func (s Settings) Check(servingPort int) []SettingError {
	var errs []SettingError
	bad := func(key string, err error) { errs = append(errs, SettingError{key, err}) }
	if s.CA != "" {
		if u, err := url.Parse(s.CA); err != nil || u.Scheme != "https" || u.Host == "" {
			bad("ca", fmt.Errorf("%q: want the CA's https:// directory URL, e.g. %s", s.CA, DefaultCA))
		}
	}
	switch s.Challenge {
	case "":
		bad("challenge", errors.New("required in acme mode: "+ChallengeHelp))
	case ChallengeHTTP01, ChallengeTLSALPN01:
		if s.DNSProvider != "" || s.DNSCredentialsFile != "" {
			bad("dns_provider", fmt.Errorf("dns_provider and dns_credentials_file only apply to dns-01, not %s", s.Challenge))
		}
	case ChallengeDNS01:
		if s.DNSProvider == "" {
			bad("dns_provider", fmt.Errorf("required for dns-01 (one of: %s)", strings.Join(DNSProviders(), ", ")))
		} else if !slices.Contains(DNSProviders(), s.DNSProvider) {
			bad("dns_provider", fmt.Errorf("%q is not built in (available: %s)", s.DNSProvider, strings.Join(DNSProviders(), ", ")))
		}
		if s.DNSCredentialsFile == "" {
			bad("dns_credentials_file", errors.New("required for dns-01: a 0600 file of KEY=VALUE lines in the provider's lego variable names"))
		}
	default:
		bad("challenge", fmt.Errorf("%q: %s", s.Challenge, ChallengeHelp))
	}
	for _, p := range []struct {
		key string
		v   int
	}{{"http_port", s.HTTPPort}, {"tls_alpn_port", s.TLSALPNPort}} {
		if p.v < 0 || p.v > 65535 {
			bad(p.key, fmt.Errorf("%d: want 1..65535 (0 = the default)", p.v))
		}
	}
	if s.Challenge == ChallengeTLSALPN01 && servingPort != 0 && s.tlsALPNPort() == servingPort {
		bad("tls_alpn_port", fmt.Errorf("%d is the server's own port; the TLS-ALPN-01 solver needs a port of its own (forward 443 to it)", servingPort))
	}
	return errs
}

// CheckFiles reads the files the block names (the DNS credentials, which
// must not be readable by group or others, and the CA root) and reports
// what is wrong with them, never a credential.
func (s Settings) CheckFiles() []SettingError {
	var errs []SettingError
	if s.Challenge == ChallengeDNS01 && s.DNSCredentialsFile != "" {
		if _, err := ReadCredentials(s.DNSCredentialsFile); err != nil {
			errs = append(errs, SettingError{"dns_credentials_file", err})
		}
	}
	if s.CARootFile != "" {
		if _, err := readRoots(s.CARootFile); err != nil {
			errs = append(errs, SettingError{"ca_root_file", err})
		}
	}
	return errs
}

// Options is the Manager configuration the block asks for; the caller adds
// Names, Key, StorageDir, Logger and OnEvent.
func (s Settings) Options() Options {
	return Options{
		CA:                 s.CA,
		CARootFile:         s.CARootFile,
		Email:              s.Email,
		Challenge:          s.Challenge,
		HTTPPort:           s.HTTPPort,
		TLSALPNPort:        s.TLSALPNPort,
		DNSProvider:        s.DNSProvider,
		DNSCredentialsFile: s.DNSCredentialsFile,
	}
}

func (s Settings) tlsALPNPort() int {
	if s.TLSALPNPort == 0 {
		return DefaultTLSALPNPort
	}
	return s.TLSALPNPort
}

// Needs says, in one sentence, what the block's challenge needs from the
// network (doctor and the first-certificate log line quote it).
func (s Settings) Needs() string {
	switch s.Challenge {
	case ChallengeHTTP01:
		p := s.HTTPPort
		if p == 0 {
			p = DefaultHTTPPort
		}
		return fmt.Sprintf("http-01: the CA connects to port 80 of every name; the solver listens on port %d (forward 80 to it, or give the service CAP_NET_BIND_SERVICE for port 80)", p)
	case ChallengeTLSALPN01:
		return fmt.Sprintf("tls-alpn-01: the CA connects to port 443 of every name; the solver listens on port %d (forward 443 to it, or give the service CAP_NET_BIND_SERVICE for port 443)", s.tlsALPNPort())
	case ChallengeDNS01:
		return fmt.Sprintf("dns-01: %s must be able to create TXT records under _acme-challenge.<name> with the credentials in %s; no inbound port is needed", s.DNSProvider, s.DNSCredentialsFile)
	}
	return ChallengeHelp
}

// SolverPort is the local port the block's challenge solver binds (0 for
// dns-01, which binds none).
func (s Settings) SolverPort() int {
	switch s.Challenge {
	case ChallengeHTTP01:
		if s.HTTPPort == 0 {
			return DefaultHTTPPort
		}
		return s.HTTPPort
	case ChallengeTLSALPN01:
		return s.tlsALPNPort()
	}
	return 0
}

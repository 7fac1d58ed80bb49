package acme

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-acme/lego/v5/challenge"
	"github.com/go-acme/lego/v5/challenge/dns01"
	"github.com/go-acme/lego/v5/providers/dns/acmedns"
	"github.com/go-acme/lego/v5/providers/dns/cloudflare"
	"github.com/go-acme/lego/v5/providers/dns/digitalocean"
	"github.com/go-acme/lego/v5/providers/dns/dnsupdate"
	"github.com/go-acme/lego/v5/providers/dns/duckdns"
	"github.com/go-acme/lego/v5/providers/dns/gandiv5"
	"github.com/go-acme/lego/v5/providers/dns/godaddy"
	"github.com/go-acme/lego/v5/providers/dns/hetzner"
	"github.com/go-acme/lego/v5/providers/dns/httpreq"
	"github.com/go-acme/lego/v5/providers/dns/namecheap"
	"github.com/go-acme/lego/v5/providers/dns/ovh"
	"github.com/go-acme/lego/v5/providers/dns/porkbun"
	"github.com/go-acme/lego/v5/providers/dns/route53"
	"github.com/mholt/acmez/v3/acme"
	"github.com/miekg/dns"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// dnsProviders maps lego's provider names (and its aliases) to their
// constructors. lego's own by-name factory (providers/dns) imports all of its
// ~200 providers, 22 of which need SDK modules the module proxy does not
// serve, so it cannot be built here; each provider is therefore imported
// alone. Adding one is one line: lego's name and its NewDNSProvider.
var dnsProviders = map[string]func() (challenge.Provider, error){
	"rfc2136":      func() (challenge.Provider, error) { return dnsupdate.NewDNSProvider() },
	"dnsupdate":    func() (challenge.Provider, error) { return dnsupdate.NewDNSProvider() },
	"acme-dns":     func() (challenge.Provider, error) { return acmedns.NewDNSProvider() },
	"acmedns":      func() (challenge.Provider, error) { return acmedns.NewDNSProvider() },
	"cloudflare":   func() (challenge.Provider, error) { return cloudflare.NewDNSProvider() },
	"digitalocean": func() (challenge.Provider, error) { return digitalocean.NewDNSProvider() },
	"duckdns":      func() (challenge.Provider, error) { return duckdns.NewDNSProvider() },
	"gandiv5":      func() (challenge.Provider, error) { return gandiv5.NewDNSProvider() },
	"godaddy":      func() (challenge.Provider, error) { return godaddy.NewDNSProvider() },
	"hetzner":      func() (challenge.Provider, error) { return hetzner.NewDNSProvider() },
	"httpreq":      func() (challenge.Provider, error) { return httpreq.NewDNSProvider() },
	"namecheap":    func() (challenge.Provider, error) { return namecheap.NewDNSProvider() },
	"ovh":          func() (challenge.Provider, error) { return ovh.NewDNSProvider() },
	"porkbun":      func() (challenge.Provider, error) { return porkbun.NewDNSProvider() },
	"route53":      func() (challenge.Provider, error) { return route53.NewDNSProvider() },
}

// DNSProviders lists the dns_provider names this build knows, sorted.
func DNSProviders() []string {
	names := make([]string, 0, len(dnsProviders))
	for n := range dnsProviders {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

const (
	// maxCredentialsFile bounds the DNS credentials file.
	maxCredentialsFile = 64 << 10
	// defaultPropagationTimeout bounds the wait for the TXT record when the
	// provider names no timeout of its own.
	defaultPropagationTimeout = 2 * time.Minute
	// propagationInterval is the pause between TXT lookups.
	propagationInterval = 500 * time.Millisecond
	// dnsQueryTimeout bounds one TXT query.
	dnsQueryTimeout = 5 * time.Second
)

// ParseCredentials reads the dns_credentials_file format: one KEY=VALUE per
// line, KEY being the environment variable name lego documents for the
// provider (e.g. CLOUDFLARE_DNS_API_TOKEN, RFC2136_NAMESERVER), VALUE taken
// verbatim up to the end of the line (no quoting, no escapes, no
// expansion); blank lines and lines starting with '#' are ignored; a key may
// appear once. Errors name the line and key, never a value.
func ParseCredentials(data []byte) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range bytes.Split(data, []byte("\n")) {
		n := i + 1
		l := strings.TrimSpace(strings.TrimSuffix(string(line), "\r"))
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		k = strings.TrimSpace(k)
		if !ok || !validEnvName(k) {
			return nil, fmt.Errorf("line %d: want KEY=VALUE with KEY of A-Z, 0-9 and _", n)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("line %d: %s appears twice", n, k)
		}
		out[k] = strings.TrimSpace(v)
	}
	if len(out) == 0 {
		return nil, errors.New("no KEY=VALUE line")
	}
	return out, nil
}

func validEnvName(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for _, c := range k {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// ReadCredentials reads and parses a dns_credentials_file, which must not be
// readable by group or others.
func ReadCredentials(path string) (map[string]string, error) {
	data, _, err := atomicfile.ReadPrivate(path, maxCredentialsFile, 0o077)
	if err != nil {
		return nil, fmt.Errorf("tls.acme.dns_credentials_file: %w", err)
	}
	m, err := ParseCredentials(data)
	if err != nil {
		return nil, fmt.Errorf("tls.acme.dns_credentials_file %s: %w", path, err)
	}
	return m, nil
}

// envMu serializes provider construction: lego's by-name constructors read
// only the process environment, so the credentials are set there for the
// duration of one constructor call and removed before it returns.
var envMu sync.Mutex

// newDNSProvider builds the named lego provider from creds. A credential
// already present in the environment is refused rather than overwritten or
// silently preferred. Each provider copies what it needs into its own config
// at construction, so the values leave the environment right after.
func newDNSProvider(name string, creds map[string]string) (challenge.Provider, error) {
	build, ok := dnsProviders[name]
	if !ok {
		return nil, fmt.Errorf("tls.acme.dns_provider %q is not built in", name)
	}
	envMu.Lock()
	defer envMu.Unlock()
	for k := range creds {
		if _, set := os.LookupEnv(k); set {
			return nil, fmt.Errorf("tls.acme.dns_credentials_file: %s is also set in the environment; keep it in one place", k)
		}
	}
	defer func() {
		for k := range creds {
			os.Unsetenv(k)
		}
	}()
	for k, v := range creds {
		if err := os.Setenv(k, v); err != nil {
			return nil, fmt.Errorf("tls.acme.dns_credentials_file: %s: %w", k, err)
		}
	}
	p, err := build()
	if err != nil {
		// lego's errors name missing variables, never values.
		return nil, fmt.Errorf("dns provider %s: %w", name, err)
	}
	return p, nil
}

// dnsSolver adapts a lego DNS provider to certmagic's solver interface
// (acmez.Solver + acmez.Waiter): Present and CleanUp call the provider, Wait
// polls for the TXT record so the CA is told to look only once it is there.
type dnsSolver struct {
	provider  challenge.Provider
	resolvers []string      // checked directly when set
	timeout   time.Duration // propagation bound
}

func newDNSSolver(p challenge.Provider, resolvers []string, timeout time.Duration) *dnsSolver {
	if timeout == 0 {
		if pt, ok := p.(challenge.ProviderTimeout); ok {
			timeout, _ = pt.Timeout()
		}
	}
	if timeout <= 0 {
		timeout = defaultPropagationTimeout
	}
	return &dnsSolver{provider: p, resolvers: resolvers, timeout: timeout}
}

// setLegoResolvers points lego's own lookups (zone apex, CNAME following) at
// resolvers. lego keeps this in a package-level client; the daemon runs one
// Manager per process, and a nil list keeps the system resolvers.
func setLegoResolvers(resolvers []string) {
	if len(resolvers) == 0 {
		return
	}
	opts := dns01.NewOptions()
	opts.RecursiveNameservers = resolvers
	opts.Timeout = dnsQueryTimeout
	dns01.SetDefaultClient(dns01.NewClient(opts))
}

func (s *dnsSolver) Present(ctx context.Context, c acme.Challenge) error {
	return s.provider.Present(ctx, c.Identifier.Value, c.Token, c.KeyAuthorization)
}

func (s *dnsSolver) CleanUp(ctx context.Context, c acme.Challenge) error {
	// Clean up even when the issuance context was cancelled.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	return s.provider.CleanUp(ctx, c.Identifier.Value, c.Token, c.KeyAuthorization)
}

// Wait returns once every resolver asked answers the expected TXT value for
// the challenge's name (following a CNAME as lego does), or fails after the
// propagation timeout.
func (s *dnsSolver) Wait(ctx context.Context, c acme.Challenge) error {
	info := dns01.GetChallengeInfo(ctx, c.Identifier.Value, c.KeyAuthorization)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var last error
	for {
		servers := s.resolvers
		var err error
		if len(servers) == 0 {
			servers, err = authoritativeServers(ctx, info.EffectiveFQDN)
		}
		if err == nil {
			err = txtPresent(ctx, servers, info.EffectiveFQDN, info.Value)
		}
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("dns-01: TXT record %s not visible within %s: %w", strings.TrimSuffix(info.EffectiveFQDN, "."), s.timeout, last)
		case <-time.After(propagationInterval):
		}
	}
}

// authoritativeServers finds the nameservers of the zone holding fqdn
// through lego's resolver client, as host:53.
func authoritativeServers(ctx context.Context, fqdn string) ([]string, error) {
	zone, err := dns01.DefaultClient().FindZoneByFqdn(ctx, fqdn)
	if err != nil {
		return nil, err
	}
	nss, err := net.DefaultResolver.LookupNS(ctx, zone)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(nss))
	for _, ns := range nss {
		out = append(out, net.JoinHostPort(strings.TrimSuffix(ns.Host, "."), "53"))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no nameservers for zone %s", zone)
	}
	return out, nil
}

// txtPresent asks each server for fqdn's TXT records and succeeds when all
// of them carry want.
func txtPresent(ctx context.Context, servers []string, fqdn, want string) error {
	cl := &dns.Client{Timeout: dnsQueryTimeout}
	for _, srv := range servers {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(fqdn), dns.TypeTXT)
		m.RecursionDesired = true
		r, _, err := cl.ExchangeContext(ctx, m, srv)
		if err != nil {
			return fmt.Errorf("query %s: %w", srv, err)
		}
		if r.Rcode != dns.RcodeSuccess {
			return fmt.Errorf("%s answered %s", srv, dns.RcodeToString[r.Rcode])
		}
		found := false
		for _, rr := range r.Answer {
			if t, ok := rr.(*dns.TXT); ok && strings.Join(t.Txt, "") == want {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("%s does not serve the TXT value yet", srv)
		}
	}
	return nil
}

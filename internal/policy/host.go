package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"golang.org/x/net/idna"
)

// HostPolicy decides whether a Host header names this front. Answering only
// for the paired authority (and configured extra names) defeats DNS
// rebinding: a hostile page whose name resolves to this host still sends its
// own name in Host and gets 421.
type HostPolicy struct {
	port  string                  // canonical decimal port, compared as text
	names map[string]struct{}     // normalized DNS names (A-labels, lower case)
	ips   map[netip.Addr]struct{} // IP literals, compared as addresses
}

// NewHostPolicy builds the policy for the authority host (DNS name, IPv4, or
// IPv6 with or without brackets) and port, plus extra names (DNS names or IP
// literals) the certificate also covers. A name that cannot be normalized is a
// configuration error rather than a name that silently never matches.
func NewHostPolicy(authorityHost string, authorityPort int, extraNames []string) (*HostPolicy, error) {
	if authorityPort < 1 || authorityPort > 65535 {
		return nil, fmt.Errorf("authority port %d out of range", authorityPort)
	}
	p := &HostPolicy{
		port:  strconv.Itoa(authorityPort),
		names: make(map[string]struct{}),
		ips:   make(map[netip.Addr]struct{}),
	}
	all := append([]string{authorityHost}, extraNames...)
	for i, n := range all {
		if err := p.add(n); err != nil {
			if i == 0 {
				return nil, fmt.Errorf("authority host %q: %w", n, err)
			}
			return nil, fmt.Errorf("extra name %q: %w", n, err)
		}
	}
	return p, nil
}

func (p *HostPolicy) add(n string) error {
	if strings.HasPrefix(n, "[") && strings.HasSuffix(n, "]") {
		n = n[1 : len(n)-1]
		a, err := netip.ParseAddr(n)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return errors.New("not an IPv6 address")
		}
		p.ips[a] = struct{}{}
		return nil
	}
	if a, err := netip.ParseAddr(n); err == nil {
		if a.Zone() != "" {
			return errors.New("IPv6 zones cannot be an authority")
		}
		p.ips[a] = struct{}{}
		return nil
	}
	name, ok := normalizeName(n)
	if !ok {
		return errors.New("not a valid DNS name or IP address")
	}
	if a, err := netip.ParseAddr(name); err == nil {
		p.ips[a] = struct{}{}
		return nil
	}
	p.names[name] = struct{}{}
	return nil
}

// Allowed reports whether hostHeader names the authority or an extra name,
// with no port or exactly the authority's port. IPv6 must be bracketed (as
// RFC 9110 requires), names compare after IDNA lookup normalization (so
// "bücher.example" and "xn--bcher-kva.example" are the same name) with one
// trailing dot ignored. The port must be written canonically ("09443" is
// refused) because nothing legitimate writes it otherwise.
func (p *HostPolicy) Allowed(hostHeader string) bool {
	if p == nil || hostHeader == "" {
		return false
	}
	host, port, hasPort := hostHeader, "", false
	if host[0] == '[' {
		end := strings.IndexByte(host, ']')
		if end < 0 {
			return false
		}
		rest := host[end+1:]
		host = host[1:end]
		if rest != "" {
			if rest[0] != ':' {
				return false
			}
			port, hasPort = rest[1:], true
		}
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return false
		}
		return p.portOK(port, hasPort) && p.hasIP(a)
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		host, port, hasPort = host[:i], host[i+1:], true
		if strings.IndexByte(host, ':') >= 0 {
			return false // unbracketed IPv6
		}
	}
	if !p.portOK(port, hasPort) {
		return false
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return p.hasIP(a)
	}
	name, ok := normalizeName(host)
	if !ok {
		return false
	}
	if a, err := netip.ParseAddr(name); err == nil {
		return p.hasIP(a)
	}
	_, ok = p.names[name]
	return ok
}

func (p *HostPolicy) portOK(port string, hasPort bool) bool {
	return !hasPort || port == p.port
}

func (p *HostPolicy) hasIP(a netip.Addr) bool {
	_, ok := p.ips[a]
	return ok
}

// normalizeName lower-cases, drops one trailing dot and applies IDNA lookup
// mapping, then insists on an LDH name within DNS length limits. Anything the
// IDNA profile rejects (spaces, '@', '/', '_', bad bidi, ...) is not a name.
func normalizeName(s string) (string, bool) {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 1024 {
		return "", false
	}
	a, err := idna.Lookup.ToASCII(s)
	if err != nil {
		return "", false
	}
	a = strings.ToLower(a)
	if a == "" || len(a) > 253 {
		return "", false
	}
	for _, label := range strings.Split(a, ".") {
		if label == "" || len(label) > 63 {
			return "", false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
				return "", false
			}
		}
	}
	return a, true
}

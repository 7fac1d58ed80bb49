// Package pinning owns what a client pins: the front's TLS identity (key and
// self-signed or operator-supplied certificate), the SPKI pin derived from it,
// the authority (host:port) the identity is valid for, the plugin_proxy
// pairing candidate that carries both into the QR, and the client side of
// the pin check.
//
// Host names are compared exactly after normalization everywhere in this
// package: the reference implementation compared SANs by substring, which
// accepted 192.0.2.10 for 192.0.2.1 and rejected equal IPv6 addresses
// written differently.
package pinning

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// maxHostInput bounds the text NormalizeHost looks at; a DNS name is at most
// 253 bytes, so anything much longer is garbage and not worth IDNA work.
const maxHostInput = 1024

// Authority is the host:port clients use. Host is always in NormalizeHost
// form when produced by this package.
type Authority struct {
	Host string
	Port int
}

// String is host:port with an IPv6 host in brackets, the form used in URLs,
// in the pairing QR and as the clients' pin-store key.
func (a Authority) String() string {
	return net.JoinHostPort(a.Host, strconv.Itoa(a.Port))
}

// URL is the origin clients connect to; it never has a path, query or user
// info because Android clients reject a candidate URL with a path.
func (a Authority) URL() string { return "https://" + a.String() }

// Validate checks that the authority could be put in a candidate.
func (a Authority) Validate() error {
	if a.Port < 1 || a.Port > 65535 {
		return fmt.Errorf("authority port %d is out of range 1-65535", a.Port)
	}
	n, err := NormalizeHost(a.Host)
	if err != nil {
		return fmt.Errorf("authority host: %w", err)
	}
	if n != a.Host {
		return fmt.Errorf("authority host %q is not normalized (expected %q)", a.Host, n)
	}
	return nil
}

// ParseAuthority parses "host:port" (IPv6 in brackets) into a normalized
// Authority. The port is mandatory: the pin store of the clients is keyed by
// host:port, so an implied port would be a different key.
func ParseAuthority(s string) (Authority, error) {
	if len(s) > maxHostInput {
		return Authority{}, errors.New("authority is too long")
	}
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return Authority{}, fmt.Errorf("authority %q: want host:port ([v6]:port for IPv6)", s)
	}
	if strings.Contains(h, ":") && !strings.HasPrefix(s, "[") {
		return Authority{}, fmt.Errorf("authority %q: an IPv6 host must be in brackets", s)
	}
	port, err := parsePort(p)
	if err != nil {
		return Authority{}, fmt.Errorf("authority %q: %w", s, err)
	}
	host, err := NormalizeHost(h)
	if err != nil {
		return Authority{}, fmt.Errorf("authority %q: %w", s, err)
	}
	return Authority{Host: host, Port: port}, nil
}

func parsePort(p string) (int, error) {
	if p == "" || len(p) > 5 {
		return 0, errors.New("port must be 1-65535")
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return 0, errors.New("port must be 1-65535")
		}
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return 0, errors.New("port must be 1-65535")
	}
	return n, nil
}

// NormalizeHost returns the one canonical text for a host so that two
// spellings of the same name compare equal and different names never do:
// an IP address becomes its canonical form (IPv4-mapped IPv6 becomes IPv4,
// zero-compressed lower-case IPv6), a DNS name becomes its lower-case IDNA
// A-label form without one trailing dot. Brackets are accepted only around
// an IPv6 address. Ports, zones, empty labels, characters outside
// letters/digits/hyphen and names that end in a numeric label (which some
// resolvers read as IPv4, e.g. "1.2.3") are rejected.
func NormalizeHost(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty host")
	}
	if len(s) > maxHostInput {
		return "", errors.New("host is too long")
	}
	if !utf8.ValidString(s) {
		return "", errors.New("host is not valid UTF-8")
	}
	if strings.HasPrefix(s, "[") {
		if !strings.HasSuffix(s, "]") || len(s) < 3 {
			return "", fmt.Errorf("host %q: unbalanced brackets (a port does not belong here)", s)
		}
		a, err := netip.ParseAddr(s[1 : len(s)-1])
		if err != nil || !a.Is6() {
			return "", fmt.Errorf("host %q: brackets are only allowed around an IPv6 address", s)
		}
		return canonicalIP(s, a)
	}
	if strings.ContainsAny(s, "[]") {
		return "", fmt.Errorf("host %q: misplaced bracket", s)
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return canonicalIP(s, a)
	}
	if strings.Contains(s, ":") {
		return "", fmt.Errorf("host %q is neither an IP address nor a DNS name (a port does not belong here)", s)
	}
	name := strings.TrimSuffix(s, ".")
	if name == "" {
		return "", fmt.Errorf("host %q is empty", s)
	}
	ascii, err := idna.Lookup.ToASCII(name)
	if err != nil {
		return "", fmt.Errorf("host %q is not a valid DNS name: %v", s, err)
	}
	ascii = strings.ToLower(ascii)
	if err := checkDNSName(ascii); err != nil {
		return "", fmt.Errorf("host %q is not a valid DNS name: %v", s, err)
	}
	// The A-label form must itself be accepted unchanged, or two spellings
	// could normalize differently depending on how often they were normalized.
	if again, err := idna.Lookup.ToASCII(ascii); err != nil || again != ascii {
		return "", fmt.Errorf("host %q is not a valid DNS name", s)
	}
	return ascii, nil
}

func canonicalIP(orig string, a netip.Addr) (string, error) {
	if a.Zone() != "" {
		return "", fmt.Errorf("host %q: an IPv6 zone cannot be part of a certificate name", orig)
	}
	return a.Unmap().String(), nil
}

// checkDNSName enforces RFC 1035 lengths and LDH labels on an A-label name;
// the IDNA profile does not check lengths.
func checkDNSName(n string) error {
	if len(n) > 253 {
		return errors.New("longer than 253 bytes")
	}
	labels := strings.Split(n, ".")
	for _, l := range labels {
		if l == "" {
			return errors.New("empty label")
		}
		if len(l) > 63 {
			return errors.New("label longer than 63 bytes")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return errors.New("label starts or ends with a hyphen")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("character %q not allowed", c)
			}
		}
	}
	if endsInNumber(labels[len(labels)-1]) {
		return errors.New("ends in a numeric label, which resolvers may read as an IPv4 address")
	}
	return nil
}

// endsInNumber follows the WHATWG URL "ends in a number" rule: a last label of
// digits, or 0x followed by hex digits, makes browsers parse the host as IPv4.
func endsInNumber(l string) bool {
	if l == "" {
		return false
	}
	digits := true
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			digits = false
			break
		}
	}
	if digits {
		return true
	}
	if strings.HasPrefix(l, "0x") {
		for i := 2; i < len(l); i++ {
			c := l[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return true
	}
	return false
}

// HostMatches reports whether a and b name the same host after
// normalization. Anything that does not normalize matches nothing.
func HostMatches(a, b string) bool {
	na, err := NormalizeHost(a)
	if err != nil {
		return false
	}
	nb, err := NormalizeHost(b)
	if err != nil {
		return false
	}
	return na == nb
}

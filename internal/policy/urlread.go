package policy

// The URL reader of the Location policy: how a browser (the WHATWG URL
// standard) reads a reference's scheme, authority and host, so that
// location.go decides on what a browser would follow, not on what Go's
// net/url would parse.

import (
	"net/netip"
	"net/url"
	"strings"

	"golang.org/x/net/idna"
)

func defaultPort(scheme string) int {
	switch scheme {
	case "https", "wss":
		return 443
	default:
		return 80
	}
}

// cleanURLRef trims what browsers trim (leading/trailing C0 controls and
// spaces, every tab/CR/LF) and refuses any other control byte.
func cleanURLRef(v string) (string, bool) {
	s := strings.TrimFunc(v, func(r rune) bool { return r <= 0x20 })
	if strings.ContainsAny(s, "\t\r\n") {
		s = strings.NewReplacer("\t", "", "\r", "", "\n", "").Replace(s)
	}
	if s == "" {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return "", false
		}
	}
	return s, true
}

// splitScheme returns the RFC 3986 scheme of s, if any.
func splitScheme(s string) (scheme, rest string, ok bool) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		case i > 0 && c == ':':
			return s[:i], s[i+1:], true
		default:
			return "", "", false
		}
	}
	return "", "", false
}

// parseAuthority splits an http(s) authority into a normalized host and an
// effective port. Userinfo is refused: no legitimate redirect carries it, and
// "http://127.0.0.1@evil" style values exist to confuse readers.
func parseAuthority(auth, scheme string) (host string, port int, ok bool) {
	if auth == "" || strings.ContainsRune(auth, '@') {
		return "", 0, false
	}
	host, ps := auth, ""
	if strings.HasPrefix(host, "[") {
		end := strings.IndexByte(host, ']')
		if end < 0 {
			return "", 0, false
		}
		rest := host[end+1:]
		host = host[1:end]
		if rest != "" {
			if rest[0] != ':' {
				return "", 0, false
			}
			ps = rest[1:]
		}
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return "", 0, false
		}
		host = strings.ToLower(host)
	} else {
		if i := strings.LastIndexByte(host, ':'); i >= 0 {
			host, ps = host[:i], host[i+1:]
		}
		h, ok := normalizeURLHost(host)
		if !ok {
			return "", 0, false
		}
		host = h
	}
	port = defaultPort(scheme)
	if ps != "" {
		n := 0
		for i := 0; i < len(ps); i++ {
			if ps[i] < '0' || ps[i] > '9' {
				return "", 0, false
			}
			n = n*10 + int(ps[i]-'0')
			if n > 65535 {
				return "", 0, false
			}
		}
		port = n
	}
	return host, port, true
}

// normalizeURLHost reads a non-bracketed URL host the way a browser does:
// percent-decoded, IDNA-mapped (full-width digits become ASCII), lower case,
// one trailing dot dropped. Hosts that cannot be read are refused.
func normalizeURLHost(h string) (string, bool) {
	if strings.IndexByte(h, '%') >= 0 {
		d, err := url.PathUnescape(h)
		if err != nil {
			return "", false
		}
		h = d
	}
	if h == "" {
		return "", false
	}
	for i := 0; i < len(h); i++ {
		if h[i] >= 0x80 {
			a, err := idna.Lookup.ToASCII(h)
			if err != nil {
				return "", false
			}
			h = a
			break
		}
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if c <= 0x20 || c >= 0x7f || strings.IndexByte(`/\?#@[]<>^|%`, c) >= 0 {
			return "", false
		}
	}
	h = strings.ToLower(h)
	if t := strings.TrimSuffix(h, "."); t != "" {
		h = t
	}
	return h, true
}

// whatwgIPv4 parses a host the way the WHATWG URL standard does when its last
// label is numeric: up to four parts, each decimal, octal (leading 0) or hex
// (0x), the last one filling the remaining bytes. Browsers turn
// "2130706433" or "0x7f.1" into 127.0.0.1, so the loopback check must too.
func whatwgIPv4(h string) (addr netip.Addr, isV4, valid bool) {
	parts := strings.Split(h, ".")
	if len(parts) > 1 && parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	last := parts[len(parts)-1]
	if !numericLabel(last) {
		return netip.Addr{}, false, false
	}
	if len(parts) > 4 {
		return netip.Addr{}, true, false
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		n, ok := whatwgNumber(p)
		if !ok {
			return netip.Addr{}, true, false
		}
		nums[i] = n
	}
	var v uint64
	for i, n := range nums[:len(nums)-1] {
		if n > 255 {
			return netip.Addr{}, true, false
		}
		v |= n << (8 * (3 - i))
	}
	lastN := nums[len(nums)-1]
	if lastN >= 1<<(8*(5-len(nums))) {
		return netip.Addr{}, true, false
	}
	v |= lastN
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true, true
}

func numericLabel(p string) bool {
	if p == "" {
		return false
	}
	if len(p) >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X') {
		for i := 2; i < len(p); i++ {
			if !isHex(p[i]) {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}

func whatwgNumber(p string) (uint64, bool) {
	if p == "" {
		return 0, false
	}
	base := uint64(10)
	switch {
	case len(p) >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X'):
		base, p = 16, p[2:]
	case len(p) >= 2 && p[0] == '0':
		base, p = 8, p[1:]
	}
	var n uint64
	for i := 0; i < len(p); i++ {
		c := p[i]
		var d uint64
		switch {
		case '0' <= c && c <= '9':
			d = uint64(c - '0')
		case base == 16 && isHex(c):
			d = uint64(unhex(c))
		default:
			return 0, false
		}
		if d >= base {
			return 0, false
		}
		n = n*base + d
		if n > 1<<32 {
			return 0, false
		}
	}
	return n, true
}

// lenientUnescape decodes every valid %XX and leaves anything else as is.
func lenientUnescape(s string) (string, bool) {
	if strings.IndexByte(s, '%') < 0 {
		return s, false
	}
	var b strings.Builder
	changed := false
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			changed = true
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String(), changed
}

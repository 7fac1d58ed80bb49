package policy

import (
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/idna"
)

// upstreamInfo is the part of an upstream URL the rewrite rules compare
// against: its host (lower case, no brackets), its effective port and its base
// path without trailing slash.
type upstreamInfo struct {
	host string
	port int
	base string
}

// noUpstream makes hostClass answer for this machine alone.
var noUpstream upstreamInfo

// maxRefLen bounds the header values the rewrite rules read; longer
// Location/Refresh/Link values are dropped rather than scanned.
const maxRefLen = 16 << 10

func infoOf(u *url.URL) upstreamInfo {
	if u == nil {
		return upstreamInfo{}
	}
	scheme := strings.ToLower(u.Scheme)
	in := upstreamInfo{
		host: strings.TrimSuffix(strings.ToLower(u.Hostname()), "."),
		port: defaultPort(scheme),
		base: strings.TrimSuffix(u.Path, "/"),
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err == nil {
			in.port = n
		}
	}
	return in
}

func defaultPort(scheme string) int {
	switch scheme {
	case "https", "wss":
		return 443
	default:
		return 80
	}
}

// RewriteLocation maps a Location or Content-Location value from the upstream
// of ns to what the client may see; ok=false means the header is dropped.
//
// The value is classified the way a browser would read it, not the way
// url.Parse does: leading/trailing spaces and control bytes are trimmed, tabs
// and newlines removed, and a backslash counts as a slash for http(s). So
// "/\evil.com", "\\evil.com" and " //evil.com" are all protocol-relative and
// dropped, and "HTTP:\\127.0.0.1:9119\x" is the upstream itself.
//
// On /dashboard: "/x" becomes "/dashboard/x" (a path already under
// "/dashboard/" is kept, since the upstream was told the prefix through
// X-Forwarded-Prefix); a relative reference without a leading slash passes;
// an absolute http(s) URL on the upstream's host:port becomes "/dashboard" +
// path + query + fragment; a well-formed https URL elsewhere (an identity
// provider) passes; everything else (other http URLs, protocol-relative
// references, other schemes, userinfo) is dropped.
//
// On /api: "/x" becomes "/api/x"; an absolute URL on the upstream becomes
// "/api" + path + query; other loopback URLs and malformed http(s) URLs are
// dropped; the rest passes.
//
// Loopback means "localhost" (and *.localhost), 127.0.0.0/8, ::1, the
// unspecified addresses, any spelling a browser parses into those (e.g.
// "2130706433", "0x7f.1", full-width digits), and the upstream's own host. As
// a last guard any result that still names a loopback URL, or contains the
// literal loopback address or upstream host:port, is dropped, so that no
// loopback address or upstream port reaches a client.
//
// On /relay, and for an unknown namespace, every value is dropped: the relay
// has no redirects a client should follow.
func RewriteLocation(ns Namespace, v string, upstream *url.URL) (out string, ok bool) {
	if ns != NSAPI && ns != NSDashboard {
		return "", false
	}
	if len(v) > maxRefLen {
		return "", false
	}
	up := infoOf(upstream)
	s, ok := cleanURLRef(v)
	if !ok {
		return "", false
	}
	bv := strings.ReplaceAll(s, `\`, "/")
	switch {
	case strings.HasPrefix(bv, "//"):
		return "", false
	case strings.HasPrefix(bv, "/"):
		out = mapPath(ns, slashPath(s), up)
	default:
		scheme, rest, hasScheme := splitScheme(s)
		if !hasScheme {
			out = s // relative reference without a leading slash
			break
		}
		ls := strings.ToLower(scheme)
		if ls != "http" && ls != "https" {
			if ns == NSDashboard {
				return "", false
			}
			if loop, bad := hostClass(scheme, up); loop || bad {
				return "", false // "localhost:9119/x"
			}
			out = s
			break
		}
		// Browsers skip any run of slashes and backslashes after an http(s)
		// scheme, and the authority ends at the first of / \ ? #.
		i := 0
		for i < len(rest) && (rest[i] == '/' || rest[i] == '\\') {
			i++
		}
		end := strings.IndexAny(rest[i:], `/\?#`)
		if end < 0 {
			end = len(rest) - i
		}
		auth, tail := rest[i:i+end], rest[i+end:]
		host, port, ok := parseAuthority(auth, ls)
		if !ok {
			return "", false
		}
		// "localhost:9119" and "127.0.0.1:9119" are the same upstream.
		if port == up.port && (host == up.host || isLoopback(host, noUpstream) && isLoopback(up.host, noUpstream)) {
			if ns == NSAPI {
				if f := strings.IndexByte(tail, '#'); f >= 0 {
					tail = tail[:f]
				}
			}
			out = mapPath(ns, slashPath(tail), up)
			break
		}
		if loop, bad := hostClass(host, up); loop || bad {
			return "", false
		}
		if ns == NSDashboard && ls != "https" {
			return "", false
		}
		if rest[:i] != "//" || strings.ContainsRune(auth, '\\') {
			return "", false // "https:/x", "https:\\\\x": not worth guessing
		}
		if u, err := url.Parse(s); err != nil || u.Host == "" {
			return "", false
		}
		out = s
	}
	if leaksLoopback(out, up) {
		return "", false
	}
	return out, true
}

// mapPath puts a root-relative path (or "" / "?q" / "#f") under the public
// prefix of ns. A base path of the upstream is removed first so that an
// upstream mounted at /base redirecting to /base/x lands on <prefix>/x.
func mapPath(ns Namespace, p string, up upstreamInfo) string {
	if p == "" || p[0] == '?' || p[0] == '#' {
		p = "/" + p
	}
	if up.base != "" && hasPathPrefix(p, up.base) {
		p = p[len(up.base):]
		if p == "" || p[0] != '/' {
			p = "/" + p
		}
	}
	prefix := ns.Prefix()
	if ns == NSDashboard && hasPathPrefix(p, prefix) {
		rest := p[len(prefix):]
		if rest == "" || rest[0] != '/' {
			rest = "/" + rest
		}
		return prefix + rest
	}
	return prefix + p
}

// hasPathPrefix reports whether p is prefix itself or prefix followed by one
// of / ? #, i.e. whether p is inside prefix as a path.
func hasPathPrefix(p, prefix string) bool {
	if !strings.HasPrefix(p, prefix) {
		return false
	}
	if len(p) == len(prefix) {
		return true
	}
	switch p[len(prefix)] {
	case '/', '?', '#':
		return true
	}
	return false
}

// slashPath turns backslashes in the path part (before ? or #) into slashes,
// as browsers do for http(s), so the result reads the same to every client.
func slashPath(p string) string {
	end := strings.IndexAny(p, "?#")
	if end < 0 {
		end = len(p)
	}
	return strings.ReplaceAll(p[:end], `\`, "/") + p[end:]
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

// isLoopback reports whether a normalized host reaches this machine or is the
// upstream itself.
func isLoopback(host string, up upstreamInfo) bool {
	loop, _ := hostClass(host, up)
	return loop
}

// hostClass classifies a host: loop when it names this machine (or the
// upstream host), bad when a browser would refuse it as a URL host (e.g. an
// IPv4-looking host out of range) so it must not be passed on either.
func hostClass(host string, up upstreamInfo) (loop, bad bool) {
	h := strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if h == "" {
		return false, true
	}
	if up.host != "" && h == strings.Trim(up.host, "[]") {
		return true, false
	}
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true, false
	}
	if a, err := netip.ParseAddr(h); err == nil {
		a = a.Unmap().WithZone("")
		return a.IsLoopback() || a.IsUnspecified(), false
	}
	if a, isV4, valid := whatwgIPv4(h); isV4 {
		if !valid {
			return false, true
		}
		return a.IsLoopback() || a.IsUnspecified(), false
	}
	return false, false
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

// leaksLoopback is the last guard on every header value a client will see:
// true when the value, raw or percent-decoded up to twice, names a URL whose
// host is loopback (after "//" or after an http/https/ws/wss/ftp scheme), or
// contains the literal loopback address or upstream host:port anywhere (e.g.
// in a redirect_uri query parameter).
func leaksLoopback(v string, up upstreamInfo) bool {
	cands := []string{v}
	d := v
	for range 2 {
		n, changed := lenientUnescape(d)
		if !changed {
			break
		}
		cands = append(cands, n)
		d = n
	}
	literals := []string{"127.0.0.1", "[::1]", "localhost:"}
	if up.host != "" {
		hp := up.host
		if strings.IndexByte(hp, ':') >= 0 {
			hp = "[" + hp + "]"
		}
		literals = append(literals, hp+":"+strconv.Itoa(up.port))
	}
	for _, c := range cands {
		c = strings.ToLower(strings.ReplaceAll(c, `\`, "/"))
		for _, l := range literals {
			if strings.Contains(c, l) {
				return true
			}
		}
		if namesLoopbackURL(c, up) {
			return true
		}
	}
	return false
}

// namesLoopbackURL scans a lower-cased, backslash-normalized text for URL
// authorities and reports whether any of them is loopback.
func namesLoopbackURL(c string, up upstreamInfo) bool {
	var starts []int
	for i := 0; ; {
		j := strings.Index(c[i:], "//")
		if j < 0 {
			break
		}
		i += j + 2
		for i < len(c) && c[i] == '/' {
			i++
		}
		starts = append(starts, i)
	}
	for _, sch := range []string{"http:", "https:", "ws:", "wss:", "ftp:"} {
		for i := 0; ; {
			j := strings.Index(c[i:], sch)
			if j < 0 {
				break
			}
			starts = append(starts, i+j+len(sch))
			i += j + len(sch)
		}
	}
	for _, s := range starts {
		for s < len(c) && c[s] == '/' {
			s++
		}
		a := c[s:min(len(c), s+512)]
		if end := strings.IndexAny(a, "/?#<>\"'`,; \t()&|{}^="); end >= 0 {
			a = a[:end]
		}
		if at := strings.LastIndexByte(a, '@'); at >= 0 {
			a = a[at+1:]
		}
		host := a
		if strings.HasPrefix(host, "[") {
			if end := strings.IndexByte(host, ']'); end >= 0 {
				host = host[:end+1]
			}
		} else if k := strings.LastIndexByte(host, ':'); k >= 0 {
			host = host[:k]
		}
		if host == "" {
			continue
		}
		if h, ok := normalizeURLHost(strings.Trim(host, "[]")); ok {
			host = h
		}
		if isLoopback(host, up) {
			return true
		}
	}
	return false
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

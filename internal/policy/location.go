package policy

import (
	"net/netip"
	"net/url"
	"strconv"
	"strings"
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

package policy

import "strings"

// RewriteSetCookie scopes a Dashboard Set-Cookie to the /dashboard namespace
// of the front, so the browser never sends the Dashboard's session to /api or
// /relay, and removes Domain= because the upstream's loopback domain means
// nothing to the client (and must not leak).
//
// The cookie-pair (the part before the first ';') is never touched: a cookie
// named "path" or "domain" is a cookie. Attribute names are matched
// case-insensitively. Every Path attribute is removed and one Path is
// appended: "/dashboard" when absent, empty, not absolute or "/"; the path
// itself when it is already "/dashboard" or under "/dashboard/" (the upstream
// honored X-Forwarded-Prefix); otherwise "/dashboard" + path. The last Path
// wins, as in browsers.
//
// A __Host- cookie (prefix matched case-insensitively, as current browsers do)
// passes unchanged: browsers reject it unless it keeps Path=/ and has no
// Domain. Isolation still holds because the front never forwards Cookie to
// /api or /relay.
func RewriteSetCookie(v string) string {
	pair, attrs, _ := strings.Cut(v, ";")
	name, _, _ := strings.Cut(pair, "=")
	if len(strings.TrimSpace(name)) >= len("__Host-") &&
		strings.EqualFold(strings.TrimSpace(name)[:len("__Host-")], "__Host-") {
		return v
	}
	parts := []string{strings.TrimSpace(pair)}
	path := ""
	for _, a := range strings.Split(attrs, ";") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		an, av, _ := strings.Cut(a, "=")
		switch strings.ToLower(strings.TrimSpace(an)) {
		case "path":
			path = strings.TrimSpace(av)
			continue
		case "domain":
			continue
		}
		parts = append(parts, a)
	}
	return strings.Join(append(parts, "Path="+scopeCookiePath(path)), "; ")
}

func scopeCookiePath(p string) string {
	const prefix = "/dashboard"
	switch {
	case p == "" || p[0] != '/' || p == "/":
		return prefix
	case p == prefix || strings.HasPrefix(p, prefix+"/"):
		return p
	default:
		return prefix + p
	}
}

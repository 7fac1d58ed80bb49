package policy

import (
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// hopByHop are the RFC 9110 connection-specific headers plus the
// non-standard Proxy-Connection. They describe the client's hop, not the
// request, and Upgrade in particular must only reach an upstream when the
// front re-creates it for a WebSocket.
var hopByHop = canonicalSet(
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
)

// InternalHeaders are the headers by which a front talks to the Relay on its
// own authority. A client must never be able to send them and an upstream
// must never be able to show them to a client.
var InternalHeaders = []string{
	"X-Hermes-Relay-Session", "X-Hermes-Proxy-Secret", "X-Hermes-Proxy-Peer",
}

var internalSet = canonicalSet(InternalHeaders...)

// spoofable are request headers an upstream might believe about the client or
// the URL: the contract's Host, Forwarded, X-Real-IP and True-Client-IP, plus
// the other client-IP and URL/host override headers common frameworks honor
// (the contract forbids letting "X-Real-IP and friends" through; these are the
// friends). All X-Forwarded-* are matched by prefix in isSpoofable.
var spoofable = canonicalSet(
	"Host", "Forwarded", "X-Real-Ip", "True-Client-Ip", "X-Client-Ip",
	"X-Cluster-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip", "Client-Ip",
	"X-Original-Forwarded-For", "X-Original-Url", "X-Rewrite-Url",
	"X-Original-Host", "X-Host", "X-Http-Host-Override",
)

// relayAllowed is everything a /relay/ws client may tell the Relay; the bridge
// speaks its own WebSocket handshake, so nothing else is meaningful.
var relayAllowed = canonicalSet("Origin", "Sec-Websocket-Protocol", "User-Agent")

func canonicalSet(names ...string) map[string]struct{} {
	m := make(map[string]struct{}, len(names))
	for _, n := range names {
		m[textproto.CanonicalMIMEHeaderKey(n)] = struct{}{}
	}
	return m
}

func isSpoofable(canon string) bool {
	if _, ok := spoofable[canon]; ok {
		return true
	}
	return strings.HasPrefix(canon, "X-Forwarded-")
}

// deleteWhere removes every key (whatever its case) whose canonical form
// satisfies drop. Keys are compared canonically because a header map built by
// hand may hold non-canonical keys that net/http would still send.
func deleteWhere(h http.Header, drop func(canon string) bool) {
	for k := range h {
		if drop(textproto.CanonicalMIMEHeaderKey(k)) {
			delete(h, k)
		}
	}
}

// getAll returns the values of name whatever the case of its key.
func getAll(h http.Header, name string) []string {
	canon := textproto.CanonicalMIMEHeaderKey(name)
	var out []string
	for k, vs := range h {
		if textproto.CanonicalMIMEHeaderKey(k) == canon {
			out = append(out, vs...)
		}
	}
	return out
}

// StripHopByHop removes the hop-by-hop headers and every header the
// Connection header names ("Connection: X-Secret" removes X-Secret), in
// either direction. It is done here and not left to ReverseProxy so the
// policy holds wherever the header map came from; the proxy's direct path
// applies it to upstream responses too.
func StripHopByHop(h http.Header) { stripWhere(h, nil) }

// stripWhere removes the hop-by-hop headers, the headers Connection names
// and every header whose canonical name satisfies drop (nil: none): one
// pass over h, and a second only when a Connection header names something.
func stripWhere(h http.Header, drop func(canon string) bool) {
	var named map[string]struct{} // only allocated when Connection names something
	for k, vs := range h {
		c := textproto.CanonicalMIMEHeaderKey(k)
		if c == "Connection" {
			for _, v := range vs {
				for tok := range strings.SplitSeq(v, ",") {
					if tok = textproto.TrimString(tok); tok != "" {
						if named == nil {
							named = map[string]struct{}{}
						}
						named[textproto.CanonicalMIMEHeaderKey(tok)] = struct{}{}
					}
				}
			}
		}
		if _, hop := hopByHop[c]; hop || (drop != nil && drop(c)) {
			delete(h, k)
		}
	}
	if named != nil {
		deleteWhere(h, func(c string) bool {
			_, conn := named[c]
			return conn
		})
	}
}

// IsWebSocketUpgrade reports whether a client request asks for a WebSocket
// upgrade (Connection names "upgrade" and Upgrade names "websocket"). The
// proxy passes the answer to RequestHeaders as its upgrade argument; any other
// upgrade (h2c, ...) is not re-created.
func IsWebSocketUpgrade(h http.Header) bool {
	return httpguts.HeaderValuesContainsToken(getAll(h, "Connection"), "upgrade") &&
		httpguts.HeaderValuesContainsToken(getAll(h, "Upgrade"), "websocket")
}

// RequestHeaders applies the request side of the header table to h, the
// outgoing request's headers (in ReverseProxy's Rewrite, on pr.Out.Header).
//
// Everywhere: hop-by-hop headers and the headers Connection names, Host,
// Forwarded, X-Forwarded-*, X-Real-IP, True-Client-IP (and the other
// client-IP/URL override headers in spoofable), the internal headers and
// every header whose name holds an underscore are removed. Then per namespace:
//   - NSAPI: Cookie is dropped (the API's credential is its bearer token;
//     dashboard cookies must not reach it); Authorization passes.
//   - NSDashboard: Authorization is dropped (so an API key never reaches the
//     Dashboard); Cookie passes; X-Forwarded-Prefix "/dashboard",
//     X-Forwarded-Proto "https", X-Forwarded-Host authority and
//     X-Forwarded-For clientIP are set. clientIP may be "ip" or "ip:port" (a
//     Request.RemoteAddr, see ClientAddr); if it is not an address
//     X-Forwarded-For is left out rather than invented.
//   - NSRelay: only Origin, Sec-WebSocket-Protocol and User-Agent survive.
//     X-Hermes-Proxy-Secret / X-Hermes-Proxy-Peer are never added here: the
//     /relay/ws bridge sets them itself, after this call, when
//     relay.proxy_secret_file is configured.
//   - any other value: everything is removed (fail closed).
//
// upgrade=true (from IsWebSocketUpgrade on the client request) makes this
// function re-create "Connection: Upgrade" and "Upgrade: websocket" for
// NSAPI and NSDashboard after stripping, so callers must not add them back.
// ReverseProxy compares the outgoing Upgrade with the upstream's 101
// response, so they must be present when Rewrite returns.
func RequestHeaders(ns Namespace, h http.Header, authority string, clientIP string, upgrade bool) {
	switch ns {
	case NSAPI:
		stripWhere(h, dropForAPI)
	case NSDashboard:
		stripWhere(h, dropForDashboard)
		h.Set("X-Forwarded-Prefix", "/dashboard")
		h.Set("X-Forwarded-Proto", "https")
		if authority != "" {
			h.Set("X-Forwarded-Host", authority)
		}
		if ip, ok := ClientAddr(clientIP); ok {
			h.Set("X-Forwarded-For", ip.String())
		}
	case NSRelay:
		stripWhere(h, dropForRelay)
		return
	default:
		clear(h)
		return
	}
	if upgrade {
		h.Set("Connection", "Upgrade")
		h.Set("Upgrade", "websocket")
	}
}

// dropEverywhere is the request headers removed in every namespace besides
// the hop-by-hop ones: the internal headers, the spoofable ones and every
// name holding an underscore, which is dropped whatever it says, as nginx
// does by default: WSGI-style upstreams (CGI variables) cannot tell
// X_Forwarded_For from X-Forwarded-For and merge the two.
func dropEverywhere(c string) bool {
	_, internal := internalSet[c]
	return internal || isSpoofable(c) || strings.Contains(c, "_")
}

// The API's credential is its bearer token: dashboard cookies must not
// reach it.
func dropForAPI(c string) bool { return c == "Cookie" || dropEverywhere(c) }

// An API key never reaches the Dashboard.
func dropForDashboard(c string) bool { return c == "Authorization" || dropEverywhere(c) }

func dropForRelay(c string) bool {
	_, ok := relayAllowed[c]
	return !ok || dropEverywhere(c)
}

// ClientAddr parses a client address as net/http reports it in
// Request.RemoteAddr ("ip:port", "[v6%zone]:port") or a bare IP, into an
// unmapped address without zone: the one form both X-Forwarded-For and the
// /relay limiter's sources are derived from. Anything else (a broker
// stream's synthetic address) is not an address.
func ClientAddr(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return a.Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}

// ResponseHeaders applies the response side of the table to an upstream
// response's headers before the client sees them (ReverseProxy's
// ModifyResponse), and to its trailers (the announced names, then the
// values once the body has ended). upstream is the namespace's configured
// upstream URL.
//
//   - Everywhere: the internal headers are removed, and so is Alt-Svc (it
//     would advertise the upstream's ports on the front's host name).
//   - NSAPI: Set-Cookie is dropped; Location/Content-Location rewritten.
//   - NSDashboard: each Set-Cookie goes through RewriteSetCookie;
//     Location/Content-Location rewritten.
//   - NSRelay and unknown: Set-Cookie, Location and Content-Location dropped.
//   - Refresh values and Link entries naming a loopback URL are dropped.
//
// Hop-by-hop response headers are left to ReverseProxy on purpose: for a 101
// it needs the upstream's Upgrade header after ModifyResponse has run.
func ResponseHeaders(ns Namespace, h http.Header, upstream *url.URL) {
	for k, vs := range h {
		switch c := textproto.CanonicalMIMEHeaderKey(k); c {
		case "Alt-Svc", "Set-Cookie2":
			delete(h, k)
		case "Set-Cookie":
			if ns != NSDashboard {
				delete(h, k)
				continue
			}
			for i, v := range vs {
				vs[i] = RewriteSetCookie(v)
			}
		case "Location", "Content-Location":
			setOrDelete(h, k, filterValues(vs, func(v string) (string, bool) {
				return RewriteLocation(ns, v, upstream)
			}))
		case "Refresh":
			up := infoOf(upstream)
			setOrDelete(h, k, filterValues(vs, func(v string) (string, bool) {
				return v, len(v) <= maxRefLen && !leaksLoopback(v, up)
			}))
		case "Link":
			up := infoOf(upstream)
			setOrDelete(h, k, filterValues(vs, func(v string) (string, bool) {
				return filterLink(v, up)
			}))
		default:
			if _, internal := internalSet[c]; internal {
				delete(h, k)
			}
		}
	}
}

func filterValues(vs []string, f func(string) (string, bool)) []string {
	var out []string
	for _, v := range vs {
		if nv, ok := f(v); ok {
			out = append(out, nv)
		}
	}
	return out
}

func setOrDelete(h http.Header, k string, vs []string) {
	if len(vs) == 0 {
		delete(h, k)
		return
	}
	h[k] = vs
}

// filterLink drops the link-values of one Link header line that name a
// loopback URL (in the target or any parameter, e.g. anchor) and keeps the
// rest, so a preload hint for a public CDN survives next to a leaking one.
func filterLink(v string, up upstreamInfo) (string, bool) {
	if len(v) > maxRefLen {
		return "", false
	}
	var kept []string
	for _, lv := range splitLinkValues(v) {
		if lv = strings.TrimSpace(lv); lv != "" && !leaksLoopback(lv, up) {
			kept = append(kept, lv)
		}
	}
	if len(kept) == 0 {
		return "", false
	}
	return strings.Join(kept, ", "), true
}

// splitLinkValues splits a Link header line at the commas that separate
// link-values, i.e. commas outside <...> and outside quoted strings.
func splitLinkValues(v string) []string {
	var out []string
	inAngle, inQuote, start := false, false, 0
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case inQuote:
			if c == '\\' {
				i++
			} else if c == '"' {
				inQuote = false
			}
		case inAngle:
			if c == '>' {
				inAngle = false
			}
		case c == '<':
			inAngle = true
		case c == '"':
			inQuote = true
		case c == ',':
			out = append(out, v[start:i])
			start = i + 1
		}
	}
	return append(out, v[start:])
}

package proxy

import (
	"net/http"
	"net/url"

	"github.com/hermes-securelink/securelink/internal/policy"
)

// The seam between the routes and the two forwarding paths. serve decides
// the path and applies the request policy; the three functions below are
// the only places the header policy of the forwarded namespaces is applied,
// and both paths call them at the same points of an exchange:
//
//   - requestPolicy (serve, before either path sends anything): the request
//     header table, hop-by-hop removal, Connection/Upgrade re-created for a
//     WebSocket upgrade;
//   - responseHead (the final answer's head, before it is written): the
//     response header table, including Location, Content-Location, Refresh,
//     Link and Set-Cookie rewriting, and the announced trailer names;
//   - responsePolicy (each relayed 1xx head, and the trailer values once the
//     body has ended).
//
// The request line is validated at the front's entry (route) for both
// paths, and again where each path writes it (writeRequestHead,
// lineChecked): those checks hold the bytes actually written.

// serve forwards one request of f's namespace; rawTail is the escaped path
// below the namespace prefix and rawQuery the raw query, both as the client
// sent them.
func (f *forwarder) serve(w http.ResponseWriter, r *http.Request, rawTail, rawQuery string) {
	if r.ContentLength > f.limits.MaxRequestBody {
		plainError(w, http.StatusRequestEntityTooLarge)
		return
	}
	upgrade := policy.IsWebSocketUpgrade(r.Header)
	f.requestPolicy(r, upgrade)
	if r.ContentLength == 0 && !upgrade && !f.s.reverseProxyOnly {
		// No body to send (ReverseProxy would send none either) and no
		// upgrade: the direct path.
		f.direct(w, r, rawTail, rawQuery)
		return
	}
	target := f.target(rawTail, rawQuery)
	f.reverseProxy(w, r, &target, upgrade)
}

// target is the upstream request URL. Opaque carries the raw tail byte for
// byte: the client's encoding is forwarded as sent, never re-encoded (the
// path check has already refused every form that could change meaning
// upstream). The base path has lost a trailing slash: "/" + "/x" would be
// "//x", which net/http even writes as the absolute-form target "http://x".
func (f *forwarder) target(rawTail, rawQuery string) url.URL {
	return url.URL{Scheme: "http", Host: f.upstream.Host, Opaque: f.basePath + rawTail, RawQuery: rawQuery}
}

// requestPolicy applies the request header table to the client's request,
// which is ours to change (net/http reads nothing of its header after the
// handler starts). It removes every hop-by-hop header, so an Upgrade other
// than a WebSocket's goes too and the request is an ordinary one.
func (f *forwarder) requestPolicy(r *http.Request, upgrade bool) {
	policy.RequestHeaders(f.ns, r.Header, f.authority, r.RemoteAddr, upgrade)
}

// responseHead applies the response header table to the final answer's
// head and to the trailer names it announces.
func (f *forwarder) responseHead(resp *http.Response) {
	policy.ResponseHeaders(f.ns, resp.Header, f.upstream)
	policy.ResponseHeaders(f.ns, resp.Trailer, f.upstream)
}

// responsePolicy applies the response header table to a 1xx head or to the
// trailer values.
func (f *forwarder) responsePolicy(h http.Header) {
	policy.ResponseHeaders(f.ns, h, f.upstream)
}

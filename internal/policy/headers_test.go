package policy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
)

const testAuthority = "192.0.2.1:9443"

// viaReverseProxy sends a request with the given client headers through a real
// httputil.ReverseProxy whose Rewrite calls RequestHeaders, and returns what
// a real upstream on 127.0.0.1 received. It proves the policy survives
// ReverseProxy's own header handling (which runs before Rewrite).
func viaReverseProxy(t *testing.T, ns Namespace, clientIP string, in http.Header) (http.Header, string) {
	t.Helper()
	got := make(chan *http.Request, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
	}))
	t.Cleanup(up.Close)
	target, _ := url.Parse(up.URL)
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(target)
		RequestHeaders(ns, pr.Out.Header, testAuthority, clientIP, false)
	}}
	front := httptest.NewServer(rp)
	t.Cleanup(front.Close)
	req, _ := http.NewRequest("GET", front.URL+"/x", nil)
	for k, vs := range in {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Host = "hostile.example"
	res, err := front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	r := <-got
	return r.Header, r.Host
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// forwardingSpoofs are client-sent headers no upstream may believe.
var forwardingSpoofs = []string{
	"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
	"X-Forwarded-Prefix", "X-Forwarded-Port", "X-Forwarded-Server", "X-Real-IP",
	"True-Client-IP", "X-Client-IP", "CF-Connecting-IP", "X-Original-URL", "X-Rewrite-URL",
}

func TestStripsHopByHopEverywhere(t *testing.T) {
	for _, ns := range []Namespace{NSAPI, NSDashboard, NSRelay} {
		h := hdr(
			"Connection", "keep-alive, X-Secret", "Connection", "X-Other",
			"X-Secret", "s", "X-Other", "o", "Keep-Alive", "timeout=5",
			"Proxy-Authenticate", "Basic", "Proxy-Authorization", "Basic eA==",
			"TE", "trailers", "Trailer", "X-T", "Transfer-Encoding", "chunked",
			"Upgrade", "websocket", "Proxy-Connection", "keep-alive",
			"X-Kept", "k",
		)
		RequestHeaders(ns, h, testAuthority, "198.51.100.9", false)
		for _, k := range []string{"Connection", "X-Secret", "X-Other", "Keep-Alive", "Proxy-Authenticate",
			"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Proxy-Connection"} {
			if _, ok := h[k]; ok {
				t.Errorf("%v: %s survived", ns, k)
			}
		}
		if ns != NSRelay && h.Get("X-Kept") != "k" {
			t.Errorf("%v: unrelated header dropped", ns)
		}
	}
}

func TestConnectionNamedHeaderIsRemovedEvenWhenAllowed(t *testing.T) {
	h := hdr("Connection", "Authorization", "Authorization", "Bearer k")
	RequestHeaders(NSAPI, h, testAuthority, "", false)
	if h.Get("Authorization") != "" {
		t.Fatal("a header named by Connection is hop-by-hop and must go")
	}
}

func TestStripsForwardingHeadersEverywhere(t *testing.T) {
	for _, ns := range []Namespace{NSAPI, NSDashboard} {
		in := http.Header{}
		for _, k := range forwardingSpoofs {
			in.Set(k, "203.0.113.66")
		}
		got, host := viaReverseProxy(t, ns, "198.51.100.9", in)
		if host == "hostile.example" || !strings.HasPrefix(host, "127.0.0.1:") {
			t.Errorf("%v: upstream got Host %q", ns, host)
		}
		for k, vs := range got {
			for _, v := range vs {
				if strings.Contains(v, "203.0.113.66") {
					t.Errorf("%v: spoofed %s: %s reached the upstream", ns, k, v)
				}
			}
		}
	}
	// Non-canonical keys in a hand-built map are caught too.
	h := http.Header{"x-real-ip": {"203.0.113.66"}, "x-forwarded-for": {"203.0.113.66"}, "host": {"evil"}}
	RequestHeaders(NSAPI, h, testAuthority, "", false)
	if len(h) != 0 {
		t.Fatalf("non-canonical spoofed headers survived: %v", h)
	}
}

func TestStripsInternalHeadersEverywhere(t *testing.T) {
	for _, ns := range []Namespace{NSAPI, NSDashboard, NSRelay} {
		h := hdr("X-Hermes-Relay-Session", "s", "X-Hermes-Proxy-Secret", "p", "X-Hermes-Proxy-Peer", "1.2.3.4",
			"x-hermes-proxy-secret", "lower")
		h["x-hermes-proxy-peer"] = []string{"lower"}
		RequestHeaders(ns, h, testAuthority, "198.51.100.9", false)
		for k := range h {
			if strings.HasPrefix(strings.ToLower(k), "x-hermes-") {
				t.Errorf("%v: internal header %s survived", ns, k)
			}
		}
	}
}

func TestAPIPassesAuthorization(t *testing.T) {
	got, _ := viaReverseProxy(t, NSAPI, "198.51.100.9", hdr("Authorization", "Bearer api-key"))
	if got.Get("Authorization") != "Bearer api-key" {
		t.Fatalf("Authorization = %q", got.Get("Authorization"))
	}
}

func TestAPIDropsCookie(t *testing.T) {
	got, _ := viaReverseProxy(t, NSAPI, "198.51.100.9", hdr("Cookie", "session=dash"))
	if v := got.Values("Cookie"); len(v) != 0 {
		t.Fatalf("Cookie reached the API: %q", v)
	}
}

func TestAPIHasNoForwardedHeaders(t *testing.T) {
	got, _ := viaReverseProxy(t, NSAPI, "198.51.100.9", nil)
	for k := range got {
		if strings.HasPrefix(k, "X-Forwarded-") || k == "Forwarded" {
			t.Errorf("API got %s: %q", k, got[k])
		}
	}
}

func TestAPIPassesOtherHeaders(t *testing.T) {
	got, _ := viaReverseProxy(t, NSAPI, "", hdr("Accept", "application/json", "X-Hermes-Session-Id", "abc",
		"Idempotency-Key", "k1"))
	if got.Get("Accept") != "application/json" || got.Get("X-Hermes-Session-Id") != "abc" || got.Get("Idempotency-Key") != "k1" {
		t.Fatalf("other headers not passed: %v", got)
	}
}

func TestDashboardDropsAuthorization(t *testing.T) {
	got, _ := viaReverseProxy(t, NSDashboard, "198.51.100.9", hdr("Authorization", "Bearer api-key"))
	if v := got.Values("Authorization"); len(v) != 0 {
		t.Fatalf("Authorization reached the Dashboard: %q", v)
	}
}

func TestDashboardPassesCookie(t *testing.T) {
	got, _ := viaReverseProxy(t, NSDashboard, "198.51.100.9", hdr("Cookie", "session=dash; theme=dark"))
	if got.Get("Cookie") != "session=dash; theme=dark" {
		t.Fatalf("Cookie = %q", got.Get("Cookie"))
	}
}

func TestDashboardForwardedHeaders(t *testing.T) {
	tests := []struct {
		clientIP, wantFor string
	}{
		{"198.51.100.9", "198.51.100.9"},
		{"198.51.100.9:54321", "198.51.100.9"},
		{"[2001:db8::9]:54321", "2001:db8::9"},
		{"2001:db8::9", "2001:db8::9"},
		{"::ffff:198.51.100.9", "198.51.100.9"},
		{"not-an-ip", ""},
		{"", ""},
	}
	for _, tt := range tests {
		in := hdr("X-Forwarded-For", "203.0.113.66", "X-Forwarded-Host", "evil.example",
			"X-Forwarded-Proto", "http", "X-Forwarded-Prefix", "/evil")
		got, _ := viaReverseProxy(t, NSDashboard, tt.clientIP, in)
		want := map[string]string{
			"X-Forwarded-Prefix": "/dashboard", "X-Forwarded-Proto": "https",
			"X-Forwarded-Host": testAuthority, "X-Forwarded-For": tt.wantFor,
		}
		for k, w := range want {
			if vs := got.Values(k); (w == "" && len(vs) != 0) || (w != "" && (len(vs) != 1 || vs[0] != w)) {
				t.Errorf("clientIP %q: %s = %q, want %q", tt.clientIP, k, vs, w)
			}
		}
	}
}

func TestRelayPassesOnlyAllowlist(t *testing.T) {
	h := hdr("Origin", "https://app.example", "Sec-WebSocket-Protocol", "hermes.v1", "User-Agent", "app/1",
		"Authorization", "Bearer k", "Cookie", "c=1", "Sec-WebSocket-Key", "abc", "X-Custom", "x",
		"X-Hermes-Proxy-Secret", "forged")
	RequestHeaders(NSRelay, h, testAuthority, "198.51.100.9", true)
	want := hdr("Origin", "https://app.example", "Sec-WebSocket-Protocol", "hermes.v1", "User-Agent", "app/1")
	if len(h) != len(want) {
		t.Fatalf("relay headers = %v, want %v", h, want)
	}
	for k := range want {
		if h.Get(k) != want.Get(k) {
			t.Errorf("%s = %q, want %q", k, h.Get(k), want.Get(k))
		}
	}
}

func TestUnknownNamespaceForwardsNothing(t *testing.T) {
	h := hdr("Accept", "x", "Authorization", "Bearer k", "Cookie", "c=1")
	RequestHeaders(NSUnknown, h, testAuthority, "198.51.100.9", true)
	if len(h) != 0 {
		t.Fatalf("unknown namespace kept %v", h)
	}
}

func TestUpgradeIsRecreated(t *testing.T) {
	for _, ns := range []Namespace{NSAPI, NSDashboard} {
		h := hdr("Connection", "keep-alive, Upgrade", "Upgrade", "WebSocket", "Sec-WebSocket-Key", "k",
			"Sec-WebSocket-Version", "13")
		if !IsWebSocketUpgrade(h) {
			t.Fatal("IsWebSocketUpgrade = false")
		}
		RequestHeaders(ns, h, testAuthority, "198.51.100.9", true)
		if h.Get("Connection") != "Upgrade" || h.Get("Upgrade") != "websocket" ||
			len(h.Values("Connection")) != 1 || len(h.Values("Upgrade")) != 1 {
			t.Errorf("%v: Connection=%q Upgrade=%q", ns, h.Values("Connection"), h.Values("Upgrade"))
		}
		if h.Get("Sec-WebSocket-Key") != "k" || h.Get("Sec-WebSocket-Version") != "13" {
			t.Errorf("%v: handshake headers dropped", ns)
		}
		h = hdr("Connection", "Upgrade", "Upgrade", "websocket")
		RequestHeaders(ns, h, testAuthority, "198.51.100.9", false)
		if h.Get("Connection") != "" || h.Get("Upgrade") != "" {
			t.Errorf("%v: upgrade=false still upgrades", ns)
		}
	}
}

func TestIsWebSocketUpgrade(t *testing.T) {
	tests := []struct {
		h    http.Header
		want bool
	}{
		{hdr("Connection", "Upgrade", "Upgrade", "websocket"), true},
		{hdr("Connection", "keep-alive, upgrade", "Upgrade", "WebSocket"), true},
		{hdr("Connection", "keep-alive", "Connection", "Upgrade", "Upgrade", "websocket"), true},
		{hdr("Upgrade", "websocket"), false},
		{hdr("Connection", "Upgrade"), false},
		{hdr("Connection", "Upgrade", "Upgrade", "h2c"), false},
		{hdr("Connection", "Upgraded", "Upgrade", "websocket"), false},
	}
	for i, tt := range tests {
		if got := IsWebSocketUpgrade(tt.h); got != tt.want {
			t.Errorf("%d: %v = %v", i, tt.h, got)
		}
	}
}

var dashUpstream = mustURL("http://127.0.0.1:9119")
var apiUpstream = mustURL("http://127.0.0.1:8642")

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

func TestResponseStripsInternalHeadersEverywhere(t *testing.T) {
	for _, ns := range []Namespace{NSAPI, NSDashboard, NSRelay} {
		h := hdr("X-Hermes-Relay-Session", "s", "X-Hermes-Proxy-Secret", "p", "X-Hermes-Proxy-Peer", "x",
			"Alt-Svc", `h2=":9119"`, "X-Hermes-Session-Id", "kept", "Content-Type", "text/plain")
		h["x-hermes-proxy-secret"] = []string{"lower"}
		ResponseHeaders(ns, h, dashUpstream)
		want := hdr("X-Hermes-Session-Id", "kept", "Content-Type", "text/plain")
		if len(h) != len(want) || h.Get("X-Hermes-Session-Id") != "kept" {
			t.Errorf("%v: response headers = %v", ns, h)
		}
	}
}

func TestAPIResponseDropsSetCookie(t *testing.T) {
	h := hdr("Set-Cookie", "session=x; Path=/", "Set-Cookie", "b=2")
	ResponseHeaders(NSAPI, h, apiUpstream)
	if v := h.Values("Set-Cookie"); len(v) != 0 {
		t.Fatalf("Set-Cookie = %q", v)
	}
}

func TestDashboardResponseRewritesSetCookie(t *testing.T) {
	h := hdr("Set-Cookie", "session=x; Path=/; Domain=127.0.0.1; HttpOnly", "Set-Cookie", "b=2")
	ResponseHeaders(NSDashboard, h, dashUpstream)
	want := []string{"session=x; HttpOnly; Path=/dashboard", "b=2; Path=/dashboard"}
	got := h.Values("Set-Cookie")
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("Set-Cookie = %q, want %q", got, want)
	}
}

func TestRelayResponseDropsCookiesAndRedirects(t *testing.T) {
	h := hdr("Set-Cookie", "a=1", "Location", "/x", "Content-Location", "/y", "Content-Type", "application/json")
	ResponseHeaders(NSRelay, h, mustURL("http://127.0.0.1:8767"))
	if len(h) != 1 || h.Get("Content-Type") == "" {
		t.Fatalf("relay response headers = %v", h)
	}
}

func TestResponseRewritesLocationHeaders(t *testing.T) {
	h := hdr("Location", "http://127.0.0.1:9119/login?next=%2F", "Content-Location", "/page")
	ResponseHeaders(NSDashboard, h, dashUpstream)
	if h.Get("Location") != "/dashboard/login?next=%2F" || h.Get("Content-Location") != "/dashboard/page" {
		t.Fatalf("dashboard: %v", h)
	}
	h = hdr("Location", "http://localhost:3000/x", "Content-Location", "http://127.0.0.1:8642/v1/r")
	ResponseHeaders(NSAPI, h, apiUpstream)
	if _, ok := h["Location"]; ok {
		t.Fatalf("loopback Location survived: %v", h)
	}
	if h.Get("Content-Location") != "/api/v1/r" {
		t.Fatalf("api Content-Location = %q", h.Get("Content-Location"))
	}
}

func TestResponseDropsLoopbackRefresh(t *testing.T) {
	for _, ns := range []Namespace{NSAPI, NSDashboard} {
		for _, v := range []string{
			"0; url=http://127.0.0.1:9119/x", "5;URL='http://localhost/'", "0; url=//127.0.0.1/x",
			"1; url=http://[::1]:9119/", "0;url=http://2130706433/", "0; url=http://127.0.0.1%3a9119/",
			"0; url=https://idp.example/?redirect_uri=http%3A%2F%2F127.0.0.1%3A9119%2Fcb",
		} {
			h := hdr("Refresh", v)
			ResponseHeaders(ns, h, dashUpstream)
			if _, ok := h["Refresh"]; ok {
				t.Errorf("%v: Refresh %q survived", ns, v)
			}
		}
		for _, v := range []string{"5", "0; url=/dashboard/x", "0; url=https://idp.example/login"} {
			h := hdr("Refresh", v)
			ResponseHeaders(ns, h, dashUpstream)
			if h.Get("Refresh") != v {
				t.Errorf("%v: Refresh %q became %q", ns, v, h.Get("Refresh"))
			}
		}
	}
}

func TestResponseDropsLoopbackLinks(t *testing.T) {
	h := hdr(
		"Link", `<http://127.0.0.1:9119/app.js>; rel=preload, </dashboard/app.css>; rel=preload; as="style, x"`,
		"Link", `<//localhost/x>; rel=next`,
		"Link", `<https://cdn.example/a.js>; rel=preload; anchor="http://127.0.0.1:9119/"`,
		"Link", `<https://cdn.example/b.js>; rel=preload`,
	)
	ResponseHeaders(NSDashboard, h, dashUpstream)
	want := []string{`</dashboard/app.css>; rel=preload; as="style, x"`, `<https://cdn.example/b.js>; rel=preload`}
	got := h.Values("Link")
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("Link = %q, want %q", got, want)
	}
}

func FuzzRequestHeaders(f *testing.F) {
	f.Add("keep-alive, X-Secret", "X-Secret", "Bearer k", "c=1", "198.51.100.9:1", true, 2)
	f.Add("Upgrade", "x-forwarded-for", "", "", "::1", false, 3)
	f.Add(",,Authorization ,", "Authorization", "Bearer k", "c=1", "junk", false, 1)
	f.Fuzz(func(t *testing.T, connection, extraName, auth, cookie, clientIP string, upgrade bool, nsi int) {
		ns := Namespace(nsi & 3)
		h := http.Header{}
		h["Connection"] = []string{connection}
		h[extraName] = []string{"v"}
		h.Set("Authorization", auth)
		h.Set("Cookie", cookie)
		for _, k := range forwardingSpoofs {
			h.Set(k, "spoof")
		}
		for _, k := range InternalHeaders {
			h.Set(k, "spoof")
		}
		RequestHeaders(ns, h, testAuthority, clientIP, upgrade)
		for k, vs := range h {
			c := http.CanonicalHeaderKey(k)
			if _, internal := internalSet[c]; internal {
				t.Fatalf("%v: internal %s survived", ns, k)
			}
			if _, hop := hopByHop[c]; hop && !(upgrade && (ns == NSAPI || ns == NSDashboard) &&
				(c == "Connection" || c == "Upgrade")) {
				t.Fatalf("%v: hop-by-hop %s survived", ns, k)
			}
			for _, v := range vs {
				if v == "spoof" {
					t.Fatalf("%v: spoofed %s survived", ns, k)
				}
			}
			switch {
			case ns == NSAPI && c == "Cookie", ns == NSDashboard && c == "Authorization":
				t.Fatalf("%v: %s crossed namespaces", ns, k)
			case ns == NSRelay:
				if _, ok := relayAllowed[c]; !ok {
					t.Fatalf("relay: %s survived", k)
				}
			case ns == NSUnknown:
				t.Fatalf("unknown: %s survived", k)
			}
		}
	})
}

func FuzzResponseHeaders(f *testing.F) {
	f.Add("http://127.0.0.1:9119/x", "0; url=http://localhost/", `<http://127.0.0.1:9119/a>; rel=x, </b>; rel=y`, "s=1; Path=/", true)
	f.Add("//evil", "5", `<https://cdn.example/"a,b">; title="x,<y>"`, "path=/x; Domain=h", false)
	f.Fuzz(func(t *testing.T, loc, refresh, link, cookie string, dashboard bool) {
		ns, up := NSAPI, apiUpstream
		if dashboard {
			ns, up = NSDashboard, dashUpstream
		}
		h := http.Header{"Location": {loc}, "Content-Location": {loc}, "Refresh": {refresh}, "Link": {link},
			"Set-Cookie": {cookie}, "X-Hermes-Proxy-Secret": {"s"}}
		ResponseHeaders(ns, h, up)
		if _, ok := h["X-Hermes-Proxy-Secret"]; ok {
			t.Fatal("internal header survived")
		}
		if !dashboard && len(h["Set-Cookie"]) != 0 {
			t.Fatal("api Set-Cookie survived")
		}
		for _, k := range []string{"Location", "Content-Location"} {
			for _, v := range h[k] {
				checkLocationInvariants(t, ns, loc, v, up)
			}
		}
		for _, k := range []string{"Location", "Content-Location", "Refresh", "Link"} {
			for _, v := range h[k] {
				low := strings.ToLower(v)
				if strings.Contains(low, "127.0.0.1") || strings.Contains(low, "localhost:") {
					t.Fatalf("%s: %q reaches the client", k, v)
				}
			}
		}
	})
}

func TestDropsUnderscoreNamesEverywhere(t *testing.T) {
	for _, ns := range []Namespace{NSAPI, NSDashboard, NSRelay} {
		h := http.Header{
			"X_Forwarded_For": {"6.6.6.6"}, "X_real_ip": {"6.6.6.6"}, "Remote_User": {"admin"},
			"x_hermes_proxy_secret": {"forged"}, "_": {"x"}, "User-Agent": {"app/1"},
		}
		RequestHeaders(ns, h, testAuthority, "198.51.100.9", false)
		for k := range h {
			if strings.Contains(k, "_") {
				t.Errorf("%v: %s passed", ns, k)
			}
		}
		if h.Get("User-Agent") != "app/1" {
			t.Errorf("%v: User-Agent dropped", ns)
		}
	}
}

// The headers a Connection header names go after the namespace's own rules
// ran and before the front sets its forwarding headers: a client naming
// X-Forwarded-For removes its own copy, never the front's; keys of a map
// built by hand count whatever their case.
func TestConnectionNamedHeadersAndTheFrontsOwn(t *testing.T) {
	h := http.Header{
		"connection":      {"x-forwarded-for, x-secret"},
		"x-secret":        {"s"},
		"X-Forwarded-For": {"6.6.6.6"},
		"Accept":          {"*/*"},
	}
	RequestHeaders(NSDashboard, h, "example.com:9443", "203.0.113.7:5000", false)
	if got := h.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "203.0.113.7" {
		t.Errorf("X-Forwarded-For = %q, want only the front's", got)
	}
	for k := range h {
		if k == "connection" || k == "x-secret" {
			t.Errorf("%s survived", k)
		}
	}
	if h.Get("Accept") != "*/*" {
		t.Error("an unnamed header was removed")
	}
	h = http.Header{"Connection": {"origin"}, "Origin": {"https://x"}, "User-Agent": {"ua"}}
	RequestHeaders(NSRelay, h, "", "", false)
	if len(h) != 1 || h.Get("User-Agent") != "ua" {
		t.Errorf("relay headers %v, want only User-Agent", h)
	}
}

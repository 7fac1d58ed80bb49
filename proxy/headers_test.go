package proxy

import (
	"net/http"
	"strings"
	"testing"
)

// hostileHeaders are request header lines no upstream may see: hop-by-hop
// headers, headers the Connection header names, forwarding and client-IP
// headers, and the front's internal headers.
var hostileHeaders = []string{
	"Connection: keep-alive, X-Named-Hop, x-other-named",
	"X-Named-Hop: secret1",
	"X-Other-Named: secret2",
	"Keep-Alive: timeout=5",
	"Proxy-Authorization: Basic cHJveHk6cHc=",
	"Proxy-Authenticate: Basic",
	"Proxy-Connection: keep-alive",
	"TE: trailers",
	"Trailer: X-Trail",
	"Upgrade: h2c",
	"Forwarded: for=6.6.6.6;host=evil.example;proto=http",
	"X-Forwarded-For: 6.6.6.6",
	"X-Forwarded-Host: evil.example",
	"X-Forwarded-Proto: http",
	"X-Forwarded-Prefix: /evil",
	"X-Forwarded-Port: 1",
	"X-Forwarded-Whatever: 1",
	"X-Real-IP: 6.6.6.6",
	"True-Client-IP: 6.6.6.6",
	"X-Hermes-Relay-Session: forged-session",
	"X-Hermes-Proxy-Secret: forged-secret",
	"X-Hermes-Proxy-Peer: 6.6.6.6",
	// Underscore names: a WSGI-style upstream merges them into the dashed
	// (trusted) ones.
	"X_Forwarded_For: 6.6.6.6",
	"X_Real_IP: 6.6.6.6",
	"Remote_User: admin",
	"x_hermes_proxy_secret: forged",
}

var strippedEverywhere = []string{
	"X-Named-Hop", "X-Other-Named", "Keep-Alive", "Proxy-Authorization", "Proxy-Authenticate",
	"Proxy-Connection", "Te", "Trailer", "Upgrade", "Forwarded", "X-Forwarded-Port",
	"X-Forwarded-Whatever", "X-Real-Ip", "True-Client-Ip", "X-Hermes-Relay-Session",
	"X-Hermes-Proxy-Secret", "X-Hermes-Proxy-Peer",
}

func credentialHeaders() []string {
	return append([]string{
		"Authorization: Bearer api-secret-key",
		"Cookie: dash_session=cookie-secret",
		"X-Custom: kept",
		"Accept: application/json",
	}, hostileHeaders...)
}

func checkStripped(t *testing.T, ns string, got http.Header) {
	t.Helper()
	for _, name := range strippedEverywhere {
		if v, ok := got[name]; ok {
			t.Errorf("%s: upstream received %s: %q", ns, name, v)
		}
	}
	for k, v := range got {
		if strings.Contains(k, "_") {
			t.Errorf("%s: upstream received the underscore header %s: %q", ns, k, v)
		}
	}
	if c := got.Get("Connection"); c != "" && !strings.EqualFold(c, "close") && !strings.EqualFold(c, "keep-alive") {
		t.Errorf("%s: upstream received Connection %q", ns, c)
	}
	if got.Get("X-Custom") != "kept" || got.Get("Accept") != "application/json" {
		t.Errorf("%s: ordinary headers did not pass: %v", ns, got)
	}
}

func TestAPIHeaders(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		resp, _ := h.rawReq("GET", "/api/v1/x", credentialHeaders()...)
		wantStatus(t, "GET /api/v1/x", resp, 200)
		got := h.api.last()
		checkStripped(t, "api", got.Header)
		if got.Header.Get("Authorization") != "Bearer api-secret-key" {
			t.Errorf("api: Authorization did not pass: %q", got.Header.Get("Authorization"))
		}
		if v := got.Header.Values("Cookie"); len(v) != 0 {
			t.Errorf("api: Cookie reached the API: %q", v)
		}
		for _, name := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Prefix"} {
			if v := got.Header.Values(name); len(v) != 0 {
				t.Errorf("api: %s = %q, want none", name, v)
			}
		}
		if got.Host != h.api.url.Host {
			t.Errorf("api: Host %q, want the upstream's own %q", got.Host, h.api.url.Host)
		}
	})
}

func TestDashboardHeaders(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		// From a second loopback source, so X-Forwarded-For is visibly the
		// client's address and not the front's own.
		resp, _ := h.rawReqFrom("127.0.0.2", "GET", "/dashboard/page", credentialHeaders()...)
		wantStatus(t, "GET /dashboard/page", resp, 200)
		got := h.dash.last()
		checkStripped(t, "dashboard", got.Header)
		if v := got.Header.Values("Authorization"); len(v) != 0 {
			t.Errorf("dashboard: Authorization reached the Dashboard: %q", v)
		}
		if got.Header.Get("Cookie") != "dash_session=cookie-secret" {
			t.Errorf("dashboard: Cookie did not pass: %q", got.Header.Get("Cookie"))
		}
		want := map[string]string{
			"X-Forwarded-Prefix": "/dashboard",
			"X-Forwarded-Proto":  "https",
			"X-Forwarded-Host":   h.addr,
			"X-Forwarded-For":    "127.0.0.2",
		}
		for name, v := range want {
			if g := got.Header.Values(name); len(g) != 1 || g[0] != v {
				t.Errorf("dashboard: %s = %q, want exactly %q", name, g, v)
			}
		}
		if got.Host != h.dash.url.Host {
			t.Errorf("dashboard: Host %q, want the upstream's own %q", got.Host, h.dash.url.Host)
		}
	})
}

func TestClientHostNeverForwarded(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		resp, _ := h.rawReq("GET", "/api/x", "Host: "+extraName+":"+itoa(h.port))
		wantStatus(t, "GET /api/x", resp, 200)
		if got := h.api.last(); got.Host != h.api.url.Host {
			t.Fatalf("api got Host %q", got.Host)
		}
		resp, _ = h.rawReq("GET", "/dashboard/x", "Host: "+extraName)
		wantStatus(t, "GET /dashboard/x", resp, 200)
		got := h.dash.last()
		if got.Host != h.dash.url.Host {
			t.Fatalf("dashboard got Host %q", got.Host)
		}
		// X-Forwarded-Host is the configured authority, not the client's Host.
		if v := got.Header.Get("X-Forwarded-Host"); v != h.addr {
			t.Fatalf("dashboard X-Forwarded-Host %q, want %q", v, h.addr)
		}
	})
}

func internalResponseHeaders(w http.ResponseWriter) {
	w.Header().Set("X-Hermes-Relay-Session", "leaked-session")
	w.Header().Set("X-Hermes-Proxy-Secret", "leaked-secret")
	w.Header().Set("X-Hermes-Proxy-Peer", "127.0.0.1")
	w.Header().Set("X-Upstream-Kept", "yes")
	w.Header().Set("Alt-Svc", `h3=":9119"`)
}

func TestAPIResponseDropsSetCookieAndInternalHeaders(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		h.api.handle(func(w http.ResponseWriter, r *http.Request) {
			internalResponseHeaders(w)
			w.Header().Add("Set-Cookie", "api=1; Path=/")
			w.Header().Add("Set-Cookie", "other=2")
			w.WriteHeader(200)
		})
		resp, _ := h.get("/api/x")
		wantStatus(t, "GET /api/x", resp, 200)
		for _, name := range []string{"X-Hermes-Relay-Session", "X-Hermes-Proxy-Secret", "X-Hermes-Proxy-Peer", "Set-Cookie", "Alt-Svc"} {
			if v := resp.Header.Values(name); len(v) != 0 {
				t.Errorf("client received %s: %q", name, v)
			}
		}
		if resp.Header.Get("X-Upstream-Kept") != "yes" {
			t.Error("ordinary response header dropped")
		}
	})
}

func TestDashboardResponseDropsInternalHeaders(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		h.dash.handle(func(w http.ResponseWriter, r *http.Request) {
			internalResponseHeaders(w)
			w.WriteHeader(200)
		})
		resp, _ := h.get("/dashboard/x")
		wantStatus(t, "GET /dashboard/x", resp, 200)
		for _, name := range []string{"X-Hermes-Relay-Session", "X-Hermes-Proxy-Secret", "X-Hermes-Proxy-Peer", "Alt-Svc"} {
			if v := resp.Header.Values(name); len(v) != 0 {
				t.Errorf("client received %s: %q", name, v)
			}
		}
		if resp.Header.Get("X-Upstream-Kept") != "yes" {
			t.Error("ordinary response header dropped")
		}
	})
}

func TestDashboardCookieScoping(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		h.dash.handle(func(w http.ResponseWriter, r *http.Request) {
			for _, c := range []string{
				"sid=s1; Path=/; HttpOnly; Secure; SameSite=Lax",
				"plain=p1",
				"sub=s2; path=/settings; Domain=127.0.0.1",
				"path=/etc; Path=/",
				"domain=x; DOMAIN=localhost; PATH=/a",
				"__Host-tok=h1; Path=/; Secure",
			} {
				w.Header().Add("Set-Cookie", c)
			}
		})
		resp, _ := h.get("/dashboard/login")
		wantStatus(t, "GET /dashboard/login", resp, 200)
		want := map[string]struct{ value, path string }{
			"sid":        {"s1", "/dashboard"},
			"plain":      {"p1", "/dashboard"},
			"sub":        {"s2", "/dashboard/settings"},
			"path":       {"/etc", "/dashboard"},
			"domain":     {"x", "/dashboard/a"},
			"__Host-tok": {"h1", "/"},
		}
		got := map[string]bool{}
		for _, line := range resp.Header.Values("Set-Cookie") {
			c, err := http.ParseSetCookie(line)
			if err != nil {
				t.Errorf("unparsable Set-Cookie %q: %v", line, err)
				continue
			}
			w, ok := want[c.Name]
			if !ok {
				t.Errorf("unexpected cookie %q", line)
				continue
			}
			got[c.Name] = true
			if c.Value != w.value || c.Path != w.path || c.Domain != "" {
				t.Errorf("Set-Cookie %q: value %q path %q domain %q, want value %q path %q no domain",
					line, c.Value, c.Path, c.Domain, w.value, w.path)
			}
			_, attrs, _ := strings.Cut(line, ";")
			if n := strings.Count(strings.ToLower(attrs), "path="); n != 1 {
				t.Errorf("Set-Cookie %q has %d Path attributes, want 1", line, n)
			}
		}
		for name := range want {
			if !got[name] {
				t.Errorf("cookie %s missing", name)
			}
		}
		if sid := resp.Header.Values("Set-Cookie"); len(sid) > 0 && !strings.Contains(strings.Join(sid, "\n"), "HttpOnly") {
			t.Error("cookie attributes other than Path/Domain were dropped")
		}
	})
}

// locationCase: upstream value and what the client must see ("" = dropped).
type locationCase struct{ in, want string }

func checkLocations(t *testing.T, h *harness, up *upstream, prefix string, cases []locationCase) {
	t.Helper()
	for _, header := range []string{"Location", "Content-Location"} {
		for _, c := range cases {
			in := c.in
			up.handle(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(header, in)
				w.WriteHeader(http.StatusFound)
			})
			resp, _ := h.get(prefix + "/redirect")
			if resp.StatusCode != http.StatusFound {
				t.Errorf("%s %q: status %d, want the upstream's 302 (redirects are never followed)", header, c.in, resp.StatusCode)
				continue
			}
			got := resp.Header.Values(header)
			switch {
			case c.want == "" && len(got) != 0:
				t.Errorf("%s %q on %s: client got %q, want it dropped", header, c.in, prefix, got)
			case c.want != "" && (len(got) != 1 || got[0] != c.want):
				t.Errorf("%s %q on %s: client got %q, want %q", header, c.in, prefix, got, c.want)
			}
		}
	}
	if h.dash.hits.Load()+h.api.hits.Load() != int64(2*len(cases)) {
		t.Errorf("upstream hits %d+%d, want %d: the front followed a redirect", h.api.hits.Load(), h.dash.hits.Load(), 2*len(cases))
	}
}

func TestDashboardLocationForms(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		up := "127.0.0.1:" + h.dash.port()
		checkLocations(t, h, h.dash, "/dashboard", []locationCase{
			{"/login", "/dashboard/login"},
			{"/login?next=%2Fhome#top", "/dashboard/login?next=%2Fhome#top"},
			{"next/page", "next/page"},
			{"../up", "../up"},
			{"http://" + up + "/x/y?a=1#frag", "/dashboard/x/y?a=1#frag"},
			{"http://" + up, "/dashboard/"},
			{"https://idp.example/authorize?client=hermes", "https://idp.example/authorize?client=hermes"},
			{"http://idp.example/authorize", ""},
			{"http://127.0.0.1:1/x", ""},
			{"//evil.example/x", ""},
			{"/\\evil.example/x", ""},
			{"javascript:alert(1)", ""},
		})
	})
}

func TestAPILocationForms(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		up := "127.0.0.1:" + h.api.port()
		checkLocations(t, h, h.api, "/api", []locationCase{
			{"/v1/jobs/7", "/api/v1/jobs/7"},
			{"http://" + up + "/v1/x?q=1", "/api/v1/x?q=1"},
			{"http://localhost:" + h.api.port() + "/v1/y", "/api/v1/y"},
			{"http://127.0.0.1:1/x", ""},
			{"http://localhost:9/x", ""},
			{"http://[::1]:9/x", ""},
			{"https://example.com/docs", "https://example.com/docs"},
			{"jobs/7", "jobs/7"},
		})
	})
}

// No response header value may carry a loopback URL or the upstream's port.
func TestNoLoopbackLeaksInResponseHeaders(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		for _, tc := range []struct {
			prefix string
			up     *upstream
		}{{"/api", h.api}, {"/dashboard", h.dash}} {
			upHost := "127.0.0.1:" + tc.up.port()
			tc.up.handle(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "http://"+upHost+"/next")
				w.Header().Set("Content-Location", "http://"+upHost+"/c")
				w.Header().Add("Refresh", "0; url=http://"+upHost+"/x")
				w.Header().Add("Link", "<http://"+upHost+"/style.css>; rel=preload, <https://cdn.example/a.js>; rel=preload")
				w.Header().Add("Link", "<http://localhost:9/x>; rel=next")
				w.WriteHeader(http.StatusSeeOther)
			})
			resp, _ := h.get(tc.prefix + "/x")
			wantStatus(t, tc.prefix, resp, http.StatusSeeOther)
			for name, vs := range resp.Header {
				for _, v := range vs {
					if strings.Contains(v, ":"+tc.up.port()) || strings.Contains(v, "localhost") {
						t.Errorf("%s: %s: %q leaks the upstream", tc.prefix, name, v)
					}
				}
			}
			if v := resp.Header.Values("Refresh"); len(v) != 0 {
				t.Errorf("%s: loopback Refresh passed: %q", tc.prefix, v)
			}
			if v := resp.Header.Values("Link"); len(v) != 1 || v[0] != "<https://cdn.example/a.js>; rel=preload" {
				t.Errorf("%s: Link = %q, want only the public link", tc.prefix, v)
			}
		}
		// Non-loopback Refresh passes.
		h.api.handle(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Refresh", "5; url=https://example.com/")
		})
		resp, _ := h.get("/api/x")
		if resp.Header.Get("Refresh") != "5; url=https://example.com/" {
			t.Errorf("public Refresh = %q", resp.Header.Get("Refresh"))
		}
	})
}

package proxy

import (
	"net/http"
	"strings"
	"testing"
)

// unsafeTails are raw path tails the front must refuse on both forwarded
// namespaces: encoded separators and dots in any case, empty segments, dot
// segments and backslashes.
var unsafeTails = []string{
	"/a%2fb", "/a%2Fb", "/a%5cb", "/a%5Cb", "/a%2eb", "/a%2Eb",
	"/%2e%2e/x", "/%2E%2e/x", "/%2e%2E/x", "/x/%2E",
	"//x", "/a//b", "/a/b//",
	"/./x", "/a/./b", "/a/.",
	"/../x", "/a/../b", "/a/..", "/a/..;/b",
	"/a\\b", "/\\x", "/a/..\\b",
}

func TestRejectedRawPathsNeverReachUpstream(t *testing.T) {
	h := newHarness(t)
	for _, prefix := range []string{"/api", "/dashboard"} {
		for _, tail := range unsafeTails {
			target := prefix + tail
			resp, _ := h.rawReq("GET", target+"?q=1")
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("GET %s: status %d, want 400", target, resp.StatusCode)
			}
		}
	}
	if n := h.api.hits.Load(); n != 0 {
		t.Errorf("API upstream was hit %d times: %v", n, h.api.requests())
	}
	if n := h.dash.hits.Load(); n != 0 {
		t.Errorf("Dashboard upstream was hit %d times: %v", n, h.dash.requests())
	}
}

func TestOddButSafePathsReachUpstreamByteForByte(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		cases := []struct{ target, api, dash string }{
			{"/v1/a%20b?x=%2F&y=1+2", "/v1/a%20b?x=%2F&y=1+2", ""},
			{"/A%7eb/c%3Bd;p=1?q=%26%3D%zz&&z", "/A%7eb/c%3Bd;p=1?q=%26%3D%zz&&z", ""},
			{"/x/?a=b/../c&d=%2e%2e", "/x/?a=b/../c&d=%2e%2e", ""},
			{"/%252e%252e/x", "/%252e%252e/x", ""},
			{"/~user/@a:b/$!*'(),", "/~user/@a:b/$!*'(),", ""},
			{"/...", "/...", ""},
			{"/", "/", ""},
		}
		for _, c := range cases {
			for _, prefix := range []string{"/api", "/dashboard"} {
				up := h.api
				if prefix == "/dashboard" {
					up = h.dash
				}
				resp, body := h.rawReq("GET", prefix+c.target)
				if resp.StatusCode != http.StatusOK {
					t.Errorf("GET %s%s: status %d (%s)", prefix, c.target, resp.StatusCode, body)
					continue
				}
				if got := up.last().RequestURI; got != c.api {
					t.Errorf("GET %s%s: upstream got %q, want %q", prefix, c.target, got, c.api)
				}
			}
		}
	})
}

func TestEmptyDashboardTailIsRoot(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path)
		resp, _ := h.rawReq("GET", "/dashboard/?tab=1")
		wantStatus(t, "/dashboard/", resp, 200)
		if got := h.dash.last().RequestURI; got != "/?tab=1" {
			t.Fatalf("dashboard got %q, want /?tab=1", got)
		}
	})
}

// An upstream configured with a trailing slash still gets "/x", never "//x"
// (which Go would even send as an absolute-form "http://x" target).
func TestUpstreamBaseWithTrailingSlashJoinsCleanly(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path, withOptions(func(o *Options) {
			u := *o.Upstreams.API
			u.Path = "/"
			o.Upstreams.API = &u
		}))
		resp, body := h.rawReq("GET", "/api/v1/x?y=1")
		wantStatus(t, "GET /api/v1/x", resp, 200)
		if got := h.api.last().RequestURI; got != "/v1/x?y=1" {
			t.Fatalf("upstream got %q, want /v1/x?y=1 (%s)", got, body)
		}
	})
}

func TestUpstreamBasePathIsPrefixed(t *testing.T) {
	onBothPaths(t, func(t *testing.T, path option) {
		h := newHarness(t, path, withOptions(func(o *Options) {
			u := *o.Upstreams.API
			u.Path = "/base"
			o.Upstreams.API = &u
		}))
		resp, _ := h.rawReq("GET", "/api/v1/x?y=1")
		wantStatus(t, "GET /api/v1/x", resp, 200)
		if got := h.api.last().RequestURI; got != "/base/v1/x?y=1" {
			t.Fatalf("upstream got %q, want /base/v1/x?y=1", got)
		}
	})
}

func TestUnknownRoutesAre404(t *testing.T) {
	h := newHarness(t)
	for _, p := range []string{
		"/api", "/dashboard", "/api?x=1", "/dashboard?x=1", "/", "/x", "/relay", "/relay/",
		"/relay/health/", "/relay/ws/", "/relay/other", "/API/x", "/Dashboard/x", "/%61pi/x",
		"/apix", "/dashboardx/y", "/relay/healthz",
	} {
		resp, _ := h.rawReq("GET", p)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", p, resp.StatusCode)
		}
	}
	if h.api.hits.Load()+h.dash.hits.Load() != 0 || h.relay.Upgrades.Load() != 0 {
		t.Fatal("an unknown route reached an upstream")
	}
}

func TestRelayHealthMethods(t *testing.T) {
	h := newHarness(t)
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH", "OPTIONS"} {
		resp, _ := h.rawReq(m, "/relay/health", "Content-Length: 0")
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s /relay/health: status %d, want 405", m, resp.StatusCode)
		}
	}
	resp, body := h.rawReq("GET", "/relay/health")
	wantStatus(t, "GET /relay/health", resp, 200)
	if !strings.Contains(string(body), `"surface":"hermes_secure_proxy"`) {
		t.Errorf("health body = %s", body)
	}
	resp, body = h.rawReq("HEAD", "/relay/health")
	wantStatus(t, "HEAD /relay/health", resp, 200)
	if len(body) != 0 {
		t.Errorf("HEAD body = %q", body)
	}
}

func TestRelayWSNonUpgradeIs400(t *testing.T) {
	h := newHarness(t)
	resp, _ := h.rawReq("GET", "/relay/ws")
	wantStatus(t, "plain GET /relay/ws", resp, 400)
	resp, _ = h.rawReq("POST", "/relay/ws", "Content-Length: 0")
	wantStatus(t, "POST /relay/ws", resp, 405)
	if n := h.relay.Upgrades.Load(); n != 0 {
		t.Fatalf("relay saw %d upgrades", n)
	}
}

func TestConnectAndTraceAre405Everywhere(t *testing.T) {
	h := newHarness(t)
	for _, m := range []string{"CONNECT", "TRACE"} {
		for _, p := range []string{"/api/x", "/dashboard/x", "/relay/health", "/relay/ws", "/nowhere", "/api"} {
			resp, _ := h.rawReq(m, p)
			if resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: status %d, want 405", m, p, resp.StatusCode)
			}
		}
	}
	resp, _ := h.rawReq("CONNECT", h.addr)
	wantStatus(t, "CONNECT authority-form", resp, 405)
	resp, _ = h.rawReq("CONNECT", "example.com:443", "Host: example.com:443")
	if resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusBadRequest {
		t.Errorf("CONNECT example.com:443: status %d", resp.StatusCode)
	}
	if h.api.hits.Load()+h.dash.hits.Load() != 0 {
		t.Fatal("CONNECT or TRACE reached an upstream")
	}
}

func TestAbsoluteFormTargetIs400(t *testing.T) {
	h := newHarness(t)
	for _, target := range []string{
		"http://" + h.addr + "/api/x",
		"https://" + h.addr + "/api/x",
		"http://" + h.addr + "/dashboard/x",
		"http://" + h.addr + "/relay/health",
		"http://evil.example/api/x",
	} {
		resp, _ := h.rawReq("GET", target)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: status %d, want 400", target, resp.StatusCode)
		}
	}
	resp, _ := h.rawReq("OPTIONS", "*")
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("OPTIONS *: status %d, want 400", resp.StatusCode)
	}
	if h.api.hits.Load()+h.dash.hits.Load() != 0 {
		t.Fatal("an absolute-form request reached an upstream")
	}
}

func TestHostileHostIs421(t *testing.T) {
	h := newHarness(t)
	port := itoa(h.port)
	for _, host := range []string{
		"evil.example", "evil.example:" + port, "127.0.0.1:1", "127.0.0.1:" + itoa(h.port+1),
		"127.0.0.2:" + port, "front.example.evil:" + port, "127.0.0.1:0" + port,
		"front.example:443", "localhost:" + port, "[::1]:" + port,
	} {
		for _, p := range []string{"/api/x", "/dashboard/x", "/relay/health"} {
			resp, _ := h.rawReq("GET", p, "Host: "+host)
			if resp.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("Host %q on %s: status %d, want 421", host, p, resp.StatusCode)
			}
		}
	}
	if h.api.hits.Load()+h.dash.hits.Load() != 0 {
		t.Fatal("a hostile Host reached an upstream")
	}
}

func TestAcceptedHostForms(t *testing.T) {
	h := newHarness(t)
	port := itoa(h.port)
	for _, host := range []string{
		"127.0.0.1", "127.0.0.1:" + port, extraName, extraName + ":" + port, extraName + ".",
		"FRONT.Example", "FRONT.EXAMPLE.:" + port,
	} {
		resp, _ := h.rawReq("GET", "/api/x", "Host: "+host)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("Host %q: status %d, want 200", host, resp.StatusCode)
			continue
		}
		if got := h.api.last().Host; got != h.api.url.Host {
			t.Errorf("Host %q: upstream got Host %q, want its own %q", host, got, h.api.url.Host)
		}
	}
}

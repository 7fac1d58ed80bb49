package policy

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
)

type locCase struct {
	in   string
	want string // "" means dropped
}

var dashboardLocations = []locCase{
	// Root-relative paths move under the prefix.
	{"/x", "/dashboard/x"},
	{"/", "/dashboard/"},
	{"/login?next=%2Fhome#top", "/dashboard/login?next=%2Fhome#top"},
	{"/dashboardx", "/dashboard/dashboardx"},
	// Already prefixed (upstream honored X-Forwarded-Prefix): not doubled.
	{"/dashboard/x", "/dashboard/x"},
	{"/dashboard", "/dashboard/"},
	{"/dashboard?a=1", "/dashboard/?a=1"},
	// Relative references without a leading slash pass.
	{"x/y", "x/y"},
	{"../up", "../up"},
	{"?page=2", "?page=2"},
	{"#frag", "#frag"},
	// Absolute URLs on the upstream become namespace paths.
	{"http://127.0.0.1:9119/x?y=1#z", "/dashboard/x?y=1#z"},
	{"http://127.0.0.1:9119", "/dashboard/"},
	{"http://127.0.0.1:9119?q", "/dashboard/?q"},
	{"HTTP://127.0.0.1:9119/x", "/dashboard/x"},
	{"https://127.0.0.1:9119/x", "/dashboard/x"},
	{"http://localhost:9119/x", "/dashboard/x"},
	{"http://[::1]:9119/x", "/dashboard/x"},
	{"http://127.0.0.1:09119/x", "/dashboard/x"},
	{`http:\\127.0.0.1:9119\x`, "/dashboard/x"},
	{"http:/127.0.0.1:9119/x", "/dashboard/x"},
	{"http://127.0.0.1:9119/dashboard/x", "/dashboard/x"},
	// Identity providers over https pass.
	{"https://idp.example/authorize?client_id=hermes&state=s", "https://idp.example/authorize?client_id=hermes&state=s"},
	{"HTTPS://idp.example:8443/x", "HTTPS://idp.example:8443/x"},
	// Other http URLs are dropped.
	{"http://idp.example/x", ""},
	{"http://127.0.0.1:8642/x", ""}, // another loopback service
	{"http://localhost/x", ""},
	{"http://127.0.0.1/x", ""},
	// Loopback over https is still loopback.
	{"https://127.0.0.1/x", ""},
	{"https://localhost:8443/", ""},
	{"https://app.localhost/", ""},
	{"https://[::1]/", ""},
	{"https://2130706433/", ""},
	{"https://0x7f.1/", ""},
	{"https://0177.0.0.1/", ""},
	{"https://127.1/", ""},
	{"https://0/", ""},
	{"https://0.0.0.0/", ""},
	{"https://[::]/", ""},
	{"https://[::ffff:127.0.0.1]/", ""},
	{"https://%31%32%37.0.0.1/", ""},
	{"https://１２７.０.０.１/", ""},
	{"https://256.256.256.256/", ""}, // invalid IPv4 in a browser
	{"https://idp.example/cb?redirect_uri=http%3A%2F%2F127.0.0.1%3A9119%2F", ""},
	// Protocol-relative, in all the spellings a browser accepts.
	{"//evil.example/x", ""},
	{"//127.0.0.1:9119/x", ""},
	{`/\evil.example`, ""},
	{`\\evil.example`, ""},
	{`\/evil.example`, ""},
	{" //evil.example", ""},
	{"\t/\t/evil.example", ""},
	{"/\n/evil.example", ""},
	// Malformed or odd absolute forms.
	{"https:/idp.example/x", ""},
	{`https:\\idp.example\x`, ""},
	{"https:idp.example", ""},
	{"https://user@idp.example/", ""},
	{"https://127.0.0.1@idp.example/", ""},
	{"http://127.0.0.1:9119@evil.example/", ""},
	{"https://idp.example:99999/", ""},
	{"https://", ""},
	// Other schemes.
	{"javascript:alert(1)", ""},
	{"data:text/html,hi", ""},
	{"mailto:a@example.com", ""},
	{"localhost:9119/x", ""},
	// Control bytes and empty values.
	{"", ""},
	{"   ", ""},
	{"/x\x00y", ""},
	{"/x\x1by", ""},
}

var apiLocations = []locCase{
	{"/x", "/api/x"},
	{"/", "/api/"},
	{"/v1/runs/1?wait=1#f", "/api/v1/runs/1?wait=1#f"},
	{"/api/x", "/api/api/x"}, // the API is never told its prefix
	{"x/y", "x/y"},
	{"?page=2", "?page=2"},
	{"http://127.0.0.1:8642/v1/x?y=1#z", "/api/v1/x?y=1"},
	{"HTTP://127.0.0.1:8642/x", "/api/x"},
	{"http://localhost:8642/x", "/api/x"},
	{"http://127.0.0.1:8642", "/api/"},
	{`http:\\127.0.0.1:8642\x`, "/api/x"},
	// Other loopback URLs are dropped.
	{"http://127.0.0.1:9119/x", ""},
	{"http://localhost/x", ""},
	{"https://127.0.0.1/x", ""},
	{"http://[::1]/", ""},
	{"http://2130706433/", ""},
	{"ws://127.0.0.1:8642/ws", ""},
	{"ftp://localhost/x", ""},
	{"localhost:8642/x", ""},
	{"//127.0.0.1:8642/x", ""},
	{"//evil.example/x", ""},
	{`/\evil.example`, ""},
	{"https://idp.example/cb?u=http://127.0.0.1:8642/", ""},
	// The rest passes.
	{"https://platform.example/docs", "https://platform.example/docs"},
	{"http://platform.example/docs", "http://platform.example/docs"},
	{"mailto:ops@example.com", "mailto:ops@example.com"},
	{"hermes://session/1", "hermes://session/1"},
	{"http:/platform.example", ""}, // malformed http(s) is not guessed at
	{"https://user:pw@platform.example/", ""},
}

func TestRewriteLocationDashboard(t *testing.T) {
	for _, tt := range dashboardLocations {
		got, ok := RewriteLocation(NSDashboard, tt.in, dashUpstream)
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("RewriteLocation(dashboard, %q) = (%q, %v), want %q", tt.in, got, ok, tt.want)
		}
	}
}

func TestRewriteLocationAPI(t *testing.T) {
	for _, tt := range apiLocations {
		got, ok := RewriteLocation(NSAPI, tt.in, apiUpstream)
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("RewriteLocation(api, %q) = (%q, %v), want %q", tt.in, got, ok, tt.want)
		}
	}
}

func TestRewriteLocationRelayDropsEverything(t *testing.T) {
	for _, in := range []string{"/x", "https://idp.example/", "x"} {
		if got, ok := RewriteLocation(NSRelay, in, dashUpstream); ok {
			t.Errorf("relay kept %q as %q", in, got)
		}
	}
}

func TestRewriteLocationUpstreamBasePath(t *testing.T) {
	up := mustURL("http://127.0.0.1:9119/base/")
	for _, tt := range []locCase{
		{"/base/x", "/dashboard/x"},
		{"/base", "/dashboard/"},
		{"/other", "/dashboard/other"},
		{"http://127.0.0.1:9119/base/x?q", "/dashboard/x?q"},
	} {
		got, ok := RewriteLocation(NSDashboard, tt.in, up)
		if !ok || got != tt.want {
			t.Errorf("base path: %q -> (%q, %v), want %q", tt.in, got, ok, tt.want)
		}
	}
}

// A private-network upstream (allow_remote) counts as loopback: its address
// must not reach a client either.
func TestRewriteLocationRemoteUpstreamIsLoopback(t *testing.T) {
	up := mustURL("http://172.17.0.2:8080")
	if got, ok := RewriteLocation(NSDashboard, "http://172.17.0.2:8080/x", up); !ok || got != "/dashboard/x" {
		t.Errorf("own upstream: (%q, %v)", got, ok)
	}
	for _, in := range []string{"https://172.17.0.2/x", "http://172.17.0.2:9000/x"} {
		if got, ok := RewriteLocation(NSAPI, in, up); ok {
			t.Errorf("upstream host on another port leaked: %q -> %q", in, got)
		}
	}
	if got, ok := RewriteLocation(NSDashboard, "http://localhost:8080/x", up); ok {
		t.Errorf("loopback on the upstream's port is not the remote upstream: %q", got)
	}
}

func FuzzRewriteLocation(f *testing.F) {
	for _, c := range dashboardLocations {
		f.Add(c.in, true)
	}
	for _, c := range apiLocations {
		f.Add(c.in, false)
	}
	f.Fuzz(func(t *testing.T, in string, dashboard bool) {
		ns, up := NSAPI, apiUpstream
		if dashboard {
			ns, up = NSDashboard, dashUpstream
		}
		out, ok := RewriteLocation(ns, in, up)
		if !ok {
			if out != "" {
				t.Fatalf("dropped %q but returned %q", in, out)
			}
			return
		}
		checkLocationInvariants(t, ns, in, out, up)
	})
}

func checkLocationInvariants(t *testing.T, ns Namespace, in, out string, up *url.URL) {
	t.Helper()
	if out == "" {
		t.Fatalf("%q kept as empty", in)
	}
	low := strings.ToLower(out)
	for _, bad := range []string{"127.0.0.1", "[::1]", up.Host} {
		if strings.Contains(low, bad) {
			t.Fatalf("%q -> %q contains %q", in, out, bad)
		}
	}
	for i := 0; i < len(out); i++ {
		if out[i] < 0x20 || out[i] == 0x7f {
			t.Fatalf("%q -> %q has a control byte", in, out)
		}
	}
	bv := strings.ReplaceAll(out, `\`, "/")
	if strings.HasPrefix(bv, "//") {
		t.Fatalf("%q -> protocol-relative %q", in, out)
	}
	if strings.HasPrefix(bv, "/") && !strings.HasPrefix(out, ns.Prefix()+"/") {
		t.Fatalf("%q -> %q leaves the %s namespace", in, out, ns)
	}
	// Resolve like a browser on the front; the target is never loopback
	// and never the upstream's port on a loopback host.
	base := mustURL("https://front.example:9443" + ns.Prefix() + "/page")
	ref, err := url.Parse(slashPath(out))
	if err != nil {
		return // not navigable for Go; browser-side checks above still held
	}
	abs := base.ResolveReference(ref)
	if abs.Host == "" {
		return
	}
	if isLoopback(abs.Hostname(), infoOf(up)) {
		t.Fatalf("%q -> %q navigates to loopback %q", in, out, abs.Host)
	}
	if abs.Host != base.Host {
		s := strings.ToLower(abs.Scheme)
		if ns == NSDashboard && s != "https" {
			t.Fatalf("%q -> %q leaves over %s", in, out, s)
		}
		if abs.Port() == strconv.Itoa(infoOf(up).port) && isLoopback(abs.Hostname(), noUpstream) {
			t.Fatalf("%q -> %q reaches the upstream port", in, out)
		}
	}
}

package policy

import (
	"net/http"
	"strings"
	"testing"
)

var cookieCases = []struct{ in, want string }{
	// Path absent: added.
	{"session=abc", "session=abc; Path=/dashboard"},
	{"session=abc; HttpOnly; Secure; SameSite=Lax", "session=abc; HttpOnly; Secure; SameSite=Lax; Path=/dashboard"},
	// Path=/ and empty/relative paths: the namespace root.
	{"session=abc; Path=/", "session=abc; Path=/dashboard"},
	{"session=abc; Path=", "session=abc; Path=/dashboard"},
	{"session=abc; Path", "session=abc; Path=/dashboard"},
	{"session=abc; Path=relative", "session=abc; Path=/dashboard"},
	// A path under the upstream root moves under the prefix.
	{"session=abc; Path=/x", "session=abc; Path=/dashboard/x"},
	{"session=abc; Path=/auth/; HttpOnly", "session=abc; HttpOnly; Path=/dashboard/auth/"},
	{"session=abc; Path=/dashboardx", "session=abc; Path=/dashboard/dashboardx"},
	// Already under the prefix (upstream honored X-Forwarded-Prefix).
	{"session=abc; Path=/dashboard", "session=abc; Path=/dashboard"},
	{"session=abc; Path=/dashboard/x", "session=abc; Path=/dashboard/x"},
	// Attribute names are case-insensitive.
	{"session=abc; pAtH=/x", "session=abc; Path=/dashboard/x"},
	{"session=abc; PATH = /x ;HTTPONLY", "session=abc; HTTPONLY; Path=/dashboard/x"},
	// Domain removed, whatever its case or value.
	{"session=abc; Domain=127.0.0.1; Path=/", "session=abc; Path=/dashboard"},
	{"session=abc; DOMAIN=.example.com", "session=abc; Path=/dashboard"},
	{"session=abc; domain", "session=abc; Path=/dashboard"},
	// Several Path attributes: the last one wins, one is emitted.
	{"session=abc; Path=/a; Path=/b", "session=abc; Path=/dashboard/b"},
	// Cookie names are never attributes.
	{"path=/x", "path=/x; Path=/dashboard"},
	{"path=/x; Path=/y", "path=/x; Path=/dashboard/y"},
	{"Domain=evil.example; Max-Age=60", "Domain=evil.example; Max-Age=60; Path=/dashboard"},
	{"  spaced = v ;Path=/", "spaced = v; Path=/dashboard"},
	// Expires contains a comma and spaces; it passes intact.
	{"s=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT", "s=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT; Path=/dashboard"},
	// Empty attributes are dropped.
	{"s=1;; ;Secure", "s=1; Secure; Path=/dashboard"},
}

func TestRewriteSetCookie(t *testing.T) {
	for _, tt := range cookieCases {
		if got := RewriteSetCookie(tt.in); got != tt.want {
			t.Errorf("RewriteSetCookie(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestRewriteSetCookieHostPrefixPassesUnchanged(t *testing.T) {
	for _, in := range []string{
		"__Host-session=abc; Path=/; Secure; HttpOnly",
		"__host-session=abc; Path=/; Secure",
		"__HOST-x=1; Secure; Path=/",
	} {
		if got := RewriteSetCookie(in); got != in {
			t.Errorf("RewriteSetCookie(%q) = %q, want unchanged", in, got)
		}
	}
	// __Secure- is not __Host-: it is scoped like any cookie.
	if got := RewriteSetCookie("__Secure-s=1; Path=/; Secure"); got != "__Secure-s=1; Secure; Path=/dashboard" {
		t.Errorf("__Secure- cookie = %q", got)
	}
}

// The browser reads the rewritten cookie the way the tests above claim.
func TestRewriteSetCookieParsesAsScoped(t *testing.T) {
	for _, tt := range cookieCases {
		res := http.Response{Header: http.Header{"Set-Cookie": {RewriteSetCookie(tt.in)}}}
		for _, c := range res.Cookies() {
			if !strings.HasPrefix(c.Path, "/dashboard") || c.Domain != "" {
				t.Errorf("%q parses as Path=%q Domain=%q", tt.in, c.Path, c.Domain)
			}
		}
	}
}

func FuzzRewriteSetCookie(f *testing.F) {
	for _, tt := range cookieCases {
		f.Add(tt.in)
	}
	f.Add("__Host-s=1; Path=/")
	f.Fuzz(func(t *testing.T, in string) {
		out := RewriteSetCookie(in)
		pair, _, _ := strings.Cut(in, ";")
		name, _, _ := strings.Cut(pair, "=")
		if n := strings.TrimSpace(name); len(n) >= 7 && strings.EqualFold(n[:7], "__Host-") {
			if out != in {
				t.Fatalf("__Host- cookie changed: %q -> %q", in, out)
			}
			return
		}
		outPair, attrs, _ := strings.Cut(out, ";")
		if outPair != strings.TrimSpace(pair) {
			t.Fatalf("cookie-pair changed: %q -> %q", pair, outPair)
		}
		paths := 0
		for _, a := range strings.Split(attrs, ";") {
			an, av, _ := strings.Cut(strings.TrimSpace(a), "=")
			switch strings.ToLower(strings.TrimSpace(an)) {
			case "domain":
				t.Fatalf("Domain survived in %q", out)
			case "path":
				paths++
				if av != "/dashboard" && !strings.HasPrefix(av, "/dashboard/") {
					t.Fatalf("Path=%q escapes the namespace in %q", av, out)
				}
			}
		}
		if paths != 1 {
			t.Fatalf("%d Path attributes in %q", paths, out)
		}
	})
}

package policy

import (
	"errors"
	"strings"
	"testing"
)

// unsafeTails are appended to both public prefixes; each must be refused.
var unsafeTails = []string{
	"/a%2fb", "/a%2Fb", "/%2f", // encoded slash
	"/a%5cb", "/a%5Cb", // encoded backslash
	"/a%2eb", "/a%2Eb", "/%2e%2e/x", "/%2E%2E/x", "/.%2e/x", // encoded dot
	"//", "//x", "/a//b", "/a///", // empty segment
	"/./x", "/a/./b", "/a/.", "/.", // dot segment
	"/../x", "/a/../b", "/a/..", "/..", // dot-dot segment
	"/..;/x", "/a/.;x/b", // dot segment with a path parameter
	"/a\\b", "\\", "/a/\\..\\", // backslash
	"/a%zz", "/a%2", "/a%", "/a%%41", "/a%g0", // malformed percent-encoding
	"/a%00b", "/a%0Ab", "/a%0d", "/a%7f", // encoded control
	"/a\x00b", "/a\nb", "/a\rb", "/a\tb", "/a b", "/a\x7f", // raw control / space
	"/b\xc3\xbcch", "/\xff", // raw non-ASCII
	"/a#frag", // fragment cannot be in a request-target
}

func TestCheckRawPathRejects(t *testing.T) {
	for _, prefix := range []string{"/api", "/dashboard"} {
		for _, tail := range unsafeTails {
			raw := prefix + tail
			err := CheckRawPath(raw)
			if err == nil {
				t.Errorf("CheckRawPath(%q) accepted", raw)
				continue
			}
			if !errors.Is(err, ErrUnsafePath) {
				t.Errorf("CheckRawPath(%q) = %v, want ErrUnsafePath", raw, err)
			}
			if strings.Contains(err.Error(), tail) && len(tail) > 2 {
				t.Errorf("error %q repeats the path", err)
			}
		}
	}
}

func TestCheckRawPathRejectsNonPaths(t *testing.T) {
	for _, raw := range []string{"", "*", "api/x", "http://x/api/x", "%2fapi/x"} {
		if CheckRawPath(raw) == nil {
			t.Errorf("CheckRawPath(%q) accepted", raw)
		}
	}
}

func TestCheckRawPathAccepts(t *testing.T) {
	for _, raw := range []string{
		"/api/v1/a%20b", "/api/a.b", "/api/..a", "/api/a..", "/api/...", "/api/.well-known/x",
		"/api/x/", "/api/", "/dashboard/", "/dashboard/assets/app.js",
		"/api/a%252e", // double encoding: the literal text "%2e"
		"/api/a;b", "/api/%41%42", "/api/~user", "/api/a:b@c!$&'()*+,=",
		"/api/%c3%bc", "/dashboard/x.y.z/", "/relay/health", "/",
	} {
		if err := CheckRawPath(raw); err != nil {
			t.Errorf("CheckRawPath(%q) = %v, want nil", raw, err)
		}
	}
}

func TestSplit(t *testing.T) {
	tests := []struct {
		raw  string
		ns   Namespace
		tail string
		ok   bool
	}{
		{"/api/x/y", NSAPI, "/x/y", true},
		{"/api/", NSAPI, "/", true},
		{"/api/a%20b", NSAPI, "/a%20b", true},
		{"/dashboard/", NSDashboard, "/", true},
		{"/dashboard/assets/x.js", NSDashboard, "/assets/x.js", true},
		{"/relay/health", NSRelay, "/health", true},
		{"/relay/ws", NSRelay, "/ws", true},
		{"/api", NSUnknown, "", false},
		{"/dashboard", NSUnknown, "", false},
		{"/relay", NSUnknown, "", false},
		{"/relay/", NSUnknown, "", false},
		{"/relay/health/", NSUnknown, "", false},
		{"/relay/wsx", NSUnknown, "", false},
		{"/relay/x", NSUnknown, "", false},
		{"/API/x", NSUnknown, "", false},
		{"/%61pi/x", NSUnknown, "", false},
		{"/apix/y", NSUnknown, "", false},
		{"/dashboardx/", NSUnknown, "", false},
		{"/", NSUnknown, "", false},
		{"", NSUnknown, "", false},
		{"//api/x", NSUnknown, "", false},
	}
	for _, tt := range tests {
		ns, tail, ok := Split(tt.raw)
		if ns != tt.ns || tail != tt.tail || ok != tt.ok {
			t.Errorf("Split(%q) = (%v, %q, %v), want (%v, %q, %v)", tt.raw, ns, tail, ok, tt.ns, tt.tail, tt.ok)
		}
	}
}

func TestNamespaceString(t *testing.T) {
	want := map[Namespace][2]string{
		NSRelay: {"relay", "/relay"}, NSAPI: {"api", "/api"}, NSDashboard: {"dashboard", "/dashboard"},
		NSUnknown: {"unknown", ""}, Namespace(42): {"unknown", ""},
	}
	for ns, w := range want {
		if ns.String() != w[0] || ns.Prefix() != w[1] {
			t.Errorf("%d: String=%q Prefix=%q, want %q %q", int(ns), ns.String(), ns.Prefix(), w[0], w[1])
		}
	}
}

func FuzzCheckRawPath(f *testing.F) {
	for _, tail := range unsafeTails {
		f.Add("/api" + tail)
		f.Add("/dashboard" + tail)
	}
	for _, s := range []string{"/api/v1/a%20b", "/api/a.b", "/api/..a", "/dashboard/", "/relay/ws", "/api/a%252e"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		err := CheckRawPath(raw)
		ns, tail, ok := Split(raw)
		if ok {
			if ns == NSUnknown || !strings.HasPrefix(tail, "/") || !strings.HasSuffix(raw, tail) {
				t.Fatalf("Split(%q) = (%v, %q)", raw, ns, tail)
			}
		} else if ns != NSUnknown || tail != "" {
			t.Fatalf("Split(%q) not found but returned (%v, %q)", raw, ns, tail)
		}
		if err != nil {
			return
		}
		if strings.Contains(raw, "//") || strings.Contains(raw, `\`) {
			t.Fatalf("accepted %q with // or backslash", raw)
		}
		low := strings.ToLower(raw)
		for _, bad := range []string{"%2f", "%5c", "%2e", "%00", "/./", "/../", "#"} {
			if strings.Contains(low, bad) {
				t.Fatalf("accepted %q containing %q", raw, bad)
			}
		}
		if strings.HasSuffix(raw, "/.") || strings.HasSuffix(raw, "/..") {
			t.Fatalf("accepted %q ending in a dot segment", raw)
		}
		for i := 0; i < len(raw); i++ {
			if raw[i] <= 0x20 || raw[i] >= 0x7f {
				t.Fatalf("accepted %q with byte %#x", raw, raw[i])
			}
		}
		// The tail an upstream receives must itself be a safe path.
		if ok {
			if err := CheckRawPath(tail); err != nil {
				t.Fatalf("accepted %q but its tail %q is unsafe: %v", raw, tail, err)
			}
		}
	})
}

package pinning

import (
	"strings"
	"testing"
)

func TestNormalizeHost(t *testing.T) {
	ok := []struct{ in, want string }{
		{"192.0.2.1", "192.0.2.1"},
		{"2001:0db8:0:0::1", "2001:db8::1"},
		{"2001:DB8::1", "2001:db8::1"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"::ffff:192.0.2.1", "192.0.2.1"},
		{"[::ffff:192.0.2.1]", "192.0.2.1"},
		{"Example.COM", "example.com"},
		{"example.com.", "example.com"},
		{"hermes-1.lan", "hermes-1.lan"},
		{"localhost", "localhost"},
		{"bücher.example", "xn--bcher-kva.example"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"BÜCHER.example.", "xn--bcher-kva.example"},
		{"a1.0x1g", "a1.0x1g"},
	}
	for _, c := range ok {
		got, err := NormalizeHost(c.in)
		if err != nil || got != c.want {
			t.Errorf("NormalizeHost(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	bad := []string{
		"", ".", "..", "example.com..", "a..b", "host:9443", "192.0.2.1:9443", "[192.0.2.1]",
		"[2001:db8::1]:9443", "[2001:db8::1", "2001:db8::1]", "[]", "[example.com]",
		"fe80::1%eth0", "[fe80::1%eth0]", "exa mple.com", "under_score.example", "-lead.example",
		"trail-.example", "1.2.3", "192.0.2.256", "10.0.0.010", "host.123", "host.0x1f", "0x7f",
		"a/b", "a@b", "http://example.com", strings.Repeat("a", 64) + ".example",
		strings.Repeat("abcdefghi.", 26) + "com", strings.Repeat("x", 2000), "exa\x00mple",
	}
	for _, in := range bad {
		if got, err := NormalizeHost(in); err == nil {
			t.Errorf("NormalizeHost(%q) = %q, want an error", in, got)
		}
	}
}

func TestHostMatches(t *testing.T) {
	yes := [][2]string{
		{"2001:db8::1", "2001:0db8:0:0::1"},
		{"[2001:db8::1]", "2001:db8:0:0:0:0:0:1"},
		{"Example.com.", "example.COM"},
		{"192.0.2.1", "::ffff:192.0.2.1"},
		{"bücher.example", "xn--bcher-kva.example"},
	}
	for _, p := range yes {
		if !HostMatches(p[0], p[1]) {
			t.Errorf("HostMatches(%q, %q) = false", p[0], p[1])
		}
	}
	no := [][2]string{
		{"192.0.2.1", "192.0.2.10"},
		{"192.0.2.10", "192.0.2.1"},
		{"2001:db8::1", "2001:db8::10"},
		{"example.com", "example.com.evil"},
		{"example.com", "ample.com"},
		{"", ""},
		{"bad host", "bad host"},
	}
	for _, p := range no {
		if HostMatches(p[0], p[1]) {
			t.Errorf("HostMatches(%q, %q) = true", p[0], p[1])
		}
	}
}

func TestAuthorityStringURL(t *testing.T) {
	cases := []struct {
		a         Authority
		str, url_ string
	}{
		{Authority{"192.0.2.1", 9443}, "192.0.2.1:9443", "https://192.0.2.1:9443"},
		{Authority{"2001:db8::1", 9443}, "[2001:db8::1]:9443", "https://[2001:db8::1]:9443"},
		{Authority{"hermes.example", 443}, "hermes.example:443", "https://hermes.example:443"},
	}
	for _, c := range cases {
		if got := c.a.String(); got != c.str {
			t.Errorf("String() = %q, want %q", got, c.str)
		}
		if got := c.a.URL(); got != c.url_ {
			t.Errorf("URL() = %q, want %q", got, c.url_)
		}
		if err := c.a.Validate(); err != nil {
			t.Errorf("Validate(%v): %v", c.a, err)
		}
		back, err := ParseAuthority(c.str)
		if err != nil || back != c.a {
			t.Errorf("ParseAuthority(%q) = %v, %v; want %v", c.str, back, err, c.a)
		}
	}
	for _, bad := range []Authority{{"192.0.2.1", 0}, {"192.0.2.1", 65536}, {"Example.com", 1}, {"", 1}} {
		if bad.Validate() == nil {
			t.Errorf("Validate(%v) passed", bad)
		}
	}
}

func TestParseAuthorityRejects(t *testing.T) {
	for _, s := range []string{"", "192.0.2.1", "192.0.2.1:", "192.0.2.1:0", "192.0.2.1:65536", "192.0.2.1:+1",
		"192.0.2.1: 1", "2001:db8::1:9443", "[2001:db8::1]", "host:port", ":9443", "[fe80::1%eth0]:1"} {
		if a, err := ParseAuthority(s); err == nil {
			t.Errorf("ParseAuthority(%q) = %v, want an error", s, a)
		}
	}
}

func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{"192.0.2.1", "2001:0db8:0:0::1", "[::1]", "::ffff:1.2.3.4", "Example.COM.",
		"bücher.example", "xn--bcher-kva.example", "xn--", "1.2.3", "0x7f", "host:1", "[a]", "fe80::1%lo",
		"a..b", "-a", "ß.de", "\u200d.example", "", "."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := NormalizeHost(s)
		if err != nil {
			if HostMatches(s, s) {
				t.Fatalf("%q does not normalize but matches itself", s)
			}
			return
		}
		again, err := NormalizeHost(n)
		if err != nil || again != n {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", s, n, again, err)
		}
		if !HostMatches(s, n) {
			t.Fatalf("%q does not match its normal form %q", s, n)
		}
		if strings.ContainsAny(n, "[]% /") || strings.HasSuffix(n, ".") {
			t.Fatalf("normal form %q has forbidden characters", n)
		}
	})
}

func FuzzParseAuthority(f *testing.F) {
	for _, s := range []string{"192.0.2.1:9443", "[2001:db8::1]:9443", "host.example:443", "host:0", "[::1]:",
		"::1:80", "a:b:c", "[fe80::1%25lo]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAuthority(s)
		if err != nil {
			return
		}
		if err := a.Validate(); err != nil {
			t.Fatalf("ParseAuthority(%q) = %v which does not validate: %v", s, a, err)
		}
		back, err := ParseAuthority(a.String())
		if err != nil || back != a {
			t.Fatalf("round trip %q -> %v -> %q -> %v, %v", s, a, a.String(), back, err)
		}
	})
}

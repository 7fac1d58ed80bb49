package policy

import (
	"strconv"
	"strings"
	"testing"
)

type hostCase struct {
	host string
	want bool
}

func checkHosts(t *testing.T, p *HostPolicy, cases []hostCase) {
	t.Helper()
	for _, c := range cases {
		if got := p.Allowed(c.host); got != c.want {
			t.Errorf("Allowed(%q) = %v, want %v", c.host, got, c.want)
		}
	}
}

func TestHostPolicyIPv4AuthorityWithNames(t *testing.T) {
	p, err := NewHostPolicy("192.0.2.1", 9443, []string{"hermes.example", "bücher.example"})
	if err != nil {
		t.Fatal(err)
	}
	checkHosts(t, p, []hostCase{
		{"192.0.2.1", true},
		{"192.0.2.1:9443", true},
		{"192.0.2.1.", true}, // one trailing dot ignored
		{"192.0.2.1:443", false},
		{"192.0.2.1:09443", false},
		{"192.0.2.1:+9443", false},
		{"192.0.2.1:", false},
		{"192.0.2.10", false}, // not a substring match
		{"192.0.2.1.evil.example", false},
		{"[192.0.2.1]", false},
		{"[::ffff:192.0.2.1]", false},
		{"0300.0.2.1", false}, // octal spelling is not the authority
		{"evil.example", false},
		{"evil.example:9443", false},
		{"hermes.example", true},
		{"hermes.example:9443", true},
		{"HERMES.Example", true},
		{"hermes.example.", true},
		{"hermes.example.:9443", true},
		{"hermes.example..", false},
		{"hermes.example:9444", false},
		{"hermes.example:9443:9443", false},
		{"user@hermes.example", false},
		{"hermes.example@evil.example", false},
		{"hermes.example/x", false},
		{"hermes.example ", false},
		{"sub.hermes.example", false},
		{"xn--bcher-kva.example", true},
		{"XN--BCHER-KVA.EXAMPLE", true},
		{"bücher.example", true},
		{"BÜCHER.example:9443", true},
		{"bucher.example", false},
		{"", false},
		{":9443", false},
	})
}

func TestHostPolicyIPv6Authority(t *testing.T) {
	for _, auth := range []string{"2001:db8::1", "[2001:db8::1]", "2001:DB8:0:0::1"} {
		p, err := NewHostPolicy(auth, 9443, nil)
		if err != nil {
			t.Fatalf("%s: %v", auth, err)
		}
		checkHosts(t, p, []hostCase{
			{"[2001:db8::1]", true},
			{"[2001:db8::1]:9443", true},
			{"[2001:DB8:0::1]:9443", true},
			{"2001:db8::1", false}, // must be bracketed
			{"2001:db8::1:9443", false},
			{"[2001:db8::1]:443", false},
			{"[2001:db8::1]:", false},
			{"[2001:db8::2]", false},
			{"[2001:db8::1", false},
			{"[2001:db8::1]x", false},
			{"[2001:db8::1]]", false},
			{"[2001:db8::1%25eth0]", false},
			{"[]", false},
			{"[192.0.2.1]", false},
		})
	}
}

func TestHostPolicyIDNAAuthority(t *testing.T) {
	for _, auth := range []string{"xn--bcher-kva.example", "bücher.example", "Bücher.Example."} {
		p, err := NewHostPolicy(auth, 443, nil)
		if err != nil {
			t.Fatalf("%s: %v", auth, err)
		}
		checkHosts(t, p, []hostCase{
			{"bücher.example", true},
			{"xn--bcher-kva.example:443", true},
			{"xn--bcher-kva.example.", true},
			{"bücher.example:9443", false},
			{"xn--bcher-kvb.example", false},
		})
	}
}

func TestHostPolicyIPExtraName(t *testing.T) {
	p, err := NewHostPolicy("hermes.example", 9443, []string{"198.51.100.7", "[2001:db8::7]"})
	if err != nil {
		t.Fatal(err)
	}
	checkHosts(t, p, []hostCase{
		{"198.51.100.7:9443", true},
		{"[2001:db8::7]", true},
		{"198.51.100.8", false},
		{"hermes.example", true},
	})
}

func TestNewHostPolicyRejectsBadConfig(t *testing.T) {
	tests := []struct {
		host  string
		port  int
		extra []string
	}{
		{"", 9443, nil},
		{"hermes.example", 0, nil},
		{"hermes.example", 65536, nil},
		{"bad name", 9443, nil},
		{"a..b", 9443, nil},
		{"under_score.example", 9443, nil},
		{"[192.0.2.1]", 9443, nil},
		{"fe80::1%eth0", 9443, nil},
		{"[2001:db8::1", 9443, nil},
		{"hermes.example", 9443, []string{"ok.example", ""}},
		{"hermes.example", 9443, []string{"evil/x"}},
		{strings.Repeat("a", 64) + ".example", 9443, nil},
	}
	for _, tt := range tests {
		if _, err := NewHostPolicy(tt.host, tt.port, tt.extra); err == nil {
			t.Errorf("NewHostPolicy(%q, %d, %q) accepted", tt.host, tt.port, tt.extra)
		}
	}
}

func TestNilHostPolicyRefuses(t *testing.T) {
	var p *HostPolicy
	if p.Allowed("anything") {
		t.Fatal("nil policy allowed a host")
	}
}

func FuzzHostPolicy(f *testing.F) {
	seeds := [][2]string{
		{"192.0.2.1", "192.0.2.1:9443"}, {"192.0.2.1", "192.0.2.10"}, {"hermes.example", "HERMES.example."},
		{"bücher.example", "xn--bcher-kva.example"}, {"2001:db8::1", "[2001:db8::1]:9443"},
		{"[2001:db8::1]", "2001:db8::1"}, {"hermes.example", "hermes.example:09443"},
		{"hermes.example", "evil.example"}, {"xn--bcher-kva.example", "BÜCHER.example"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], 9443)
	}
	f.Fuzz(func(t *testing.T, authority, host string, port int) {
		p, err := NewHostPolicy(authority, port, nil)
		if err != nil {
			return
		}
		// The authority as a client writes it is always allowed.
		a := strings.Trim(authority, "[]")
		if strings.Contains(a, ":") {
			a = "[" + a + "]"
		}
		if !p.Allowed(a) {
			t.Fatalf("authority %q refused its own host %q", authority, a)
		}
		if !p.Allowed(a + ":" + strconv.Itoa(port)) {
			t.Fatalf("authority %q refused its own host:port", authority)
		}
		if !p.Allowed(host) {
			return
		}
		// Whatever is allowed carries no extra port, no userinfo, no path.
		if strings.ContainsAny(host, "@/\\ ?#") {
			t.Fatalf("allowed %q", host)
		}
		if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.HasSuffix(host, "]") && host[i+1:] != strconv.Itoa(port) {
			t.Fatalf("allowed %q with a foreign port (authority port %d)", host, port)
		}
	})
}

package relay

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/hermes-securelink/securelink/internal/policy"
)

func TestSourceOf(t *testing.T) {
	for _, tc := range []struct{ remote, want string }{
		{"192.0.2.1:1234", "192.0.2.1/32"},
		{"127.0.0.2:80", "127.0.0.2/32"},
		{"[::ffff:192.0.2.1]:1234", "192.0.2.1/32"},
		{"[2001:db8:1:2:3:4:5:6]:443", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff:ffff:ffff:ffff]:1", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]:1", "2001:db8:1:3::/64"},
		{"[fe80::1%eth0]:1", "fe80::/64"},
		{"[::1]:9443", "::/64"},
		{"not an address", "unknown"},
		{"", "unknown"},
	} {
		r := httptest.NewRequest("GET", "/relay/ws", nil)
		r.RemoteAddr = tc.remote
		if got := SourceOf(r); got != tc.want {
			t.Errorf("SourceOf(%q) = %q, want %q", tc.remote, got, tc.want)
		}
	}
	// Two addresses in one /64 are one source; the neighbouring /64 is another.
	a := httptest.NewRequest("GET", "/", nil)
	a.RemoteAddr = "[2001:db8:aa:bb::1]:1"
	b := httptest.NewRequest("GET", "/", nil)
	b.RemoteAddr = "[2001:db8:aa:bb:1234:5678:9abc:def0]:2"
	c := httptest.NewRequest("GET", "/", nil)
	c.RemoteAddr = "[2001:db8:aa:bc::1]:1"
	if SourceOf(a) != SourceOf(b) || SourceOf(a) == SourceOf(c) {
		t.Fatalf("grouping: %s %s %s", SourceOf(a), SourceOf(b), SourceOf(c))
	}
}

func TestSourceOfBrokerStream(t *testing.T) {
	r := httptest.NewRequest("GET", "/relay/ws", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	if FromBrokerStream(r.Context()) {
		t.Fatal("unmarked request reported as broker stream")
	}
	r = r.WithContext(WithBrokerStream(context.Background()))
	if !FromBrokerStream(r.Context()) || SourceOf(r) != "reach" || peerOf(r) != "reach" {
		t.Fatalf("broker request: source %q peer %q", SourceOf(r), peerOf(r))
	}
}

func TestPeerOf(t *testing.T) {
	for _, tc := range []struct{ remote, want string }{
		{"192.0.2.1:1234", "192.0.2.1"},
		{"[::ffff:192.0.2.1]:1", "192.0.2.1"},
		{"[2001:db8::5]:1", "2001:db8::5"},
		{"[fe80::1%eth0]:1", "fe80::1"},
		{"garbage", "unknown"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		if got := peerOf(r); got != tc.want {
			t.Errorf("peerOf(%q) = %q, want %q", tc.remote, got, tc.want)
		}
	}
}

// FuzzSourceOf: any RemoteAddr yields "unknown" or a masked /32 (IPv4) or
// /64 (IPv6) prefix that contains the parsed address.
func FuzzSourceOf(f *testing.F) {
	for _, s := range []string{"192.0.2.1:1", "[::ffff:10.0.0.1]:2", "[2001:db8::1]:3", "[fe80::1%eth0]:4",
		"1.2.3.4", "::1", "[::1]", "x:y:z", "", "[]:1", "[::ffff:1.2.3.4%z]:5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, remote string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		got := SourceOf(r)
		if got == sourceUnknown {
			return
		}
		p, err := netip.ParsePrefix(got)
		if err != nil {
			t.Fatalf("SourceOf(%q) = %q: not a prefix", remote, got)
		}
		if p != p.Masked() || (p.Addr().Is4() && p.Bits() != 32) || (p.Addr().Is6() && p.Bits() != 64) {
			t.Fatalf("SourceOf(%q) = %q", remote, got)
		}
		a, ok := policy.ClientAddr(remote)
		if !ok || !p.Contains(a) {
			t.Fatalf("SourceOf(%q) = %q does not contain %v", remote, got, a)
		}
	})
}

package pinning

import (
	"net/netip"
	"strings"
	"testing"
)

const routeHeader = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"

// A host with Docker: the default route leaves through eth0 (metric 100),
// a second default through wlan0 has a worse metric.
const v4DefaultEth0 = routeHeader +
	"docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n" +
	"wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n" +
	"eth0\t00000000\t0102000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n" +
	"eth0\t0002000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"

// The kernel's table on a host without IPv6 default route: only the lo
// "unreachable" entries (RTF_REJECT) and link-local routes.
const v6NoDefault = "fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000002 00000000 00000001     eth0\n" +
	"00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo\n" +
	"00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n"

const v6DefaultEth0 = "20010db8000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n" +
	"00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000002 00000000 00000003     eth0\n" +
	"00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n"

func pfx(t *testing.T, ss ...string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestDetectHost(t *testing.T) {
	lo := Interface{Name: "lo", Addrs: pfx(t, "127.0.0.1/8", "::1/128")}
	cases := []struct {
		name     string
		v4, v6   string
		ifaces   []Interface
		want     string
		wantWarn bool
	}{
		{
			name: "default route via eth0 wins over lower docker and wlan addresses",
			v4:   v4DefaultEth0, v6: v6NoDefault,
			ifaces: []Interface{lo,
				{Name: "docker0", Addrs: pfx(t, "172.17.0.1/16")},
				{Name: "wlan0", Addrs: pfx(t, "192.168.1.20/24")},
				{Name: "eth0", Addrs: pfx(t, "fe80::1/64", "192.168.50.15/24", "2001:db8::15/64")}},
			want: "192.168.50.15",
		},
		{
			name: "default route interface without an IPv4 address falls to the next default",
			v4:   v4DefaultEth0, v6: v6NoDefault,
			ifaces: []Interface{lo,
				{Name: "wlan0", Addrs: pfx(t, "192.168.1.20/24")},
				{Name: "eth0", Addrs: pfx(t, "fe80::1/64")}},
			want: "192.168.1.20",
		},
		{
			name: "no default route: lowest global unicast address, IPv4 before IPv6",
			v4:   routeHeader + "eth0\t0002000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n",
			v6:   v6NoDefault,
			ifaces: []Interface{lo,
				{Name: "eth1", Addrs: pfx(t, "2001:db8::2/64", "192.168.5.9/24")},
				{Name: "eth0", Addrs: pfx(t, "169.254.3.3/16", "10.0.2.15/24", "fe80::1/64")}},
			want: "10.0.2.15",
		},
		{
			name: "only loopback: 127.0.0.1 with a warning",
			v4:   routeHeader, v6: v6NoDefault,
			ifaces:   []Interface{lo, {Name: "eth0", Addrs: pfx(t, "fe80::1/64", "169.254.1.1/16")}},
			want:     "127.0.0.1",
			wantWarn: true,
		},
		{
			name: "nothing at all",
			want: "127.0.0.1", wantWarn: true,
		},
		{
			name: "IPv6-only default route",
			v4:   routeHeader, v6: v6DefaultEth0,
			ifaces: []Interface{lo,
				{Name: "docker0", Addrs: pfx(t, "172.17.0.1/16")},
				{Name: "eth0", Addrs: pfx(t, "fe80::1/64", "2001:db8::15/64")}},
			want: "2001:db8::15",
		},
		{
			name: "a down default route (no RTF_UP) is ignored",
			v4:   routeHeader + "eth0\t00000000\t0102000A\t0002\t0\t0\t0\t00000000\t0\t0\t0\n",
			ifaces: []Interface{lo,
				{Name: "eth0", Addrs: pfx(t, "10.0.2.15/24")},
				{Name: "eth1", Addrs: pfx(t, "10.0.1.7/24")}},
			want: "10.0.1.7",
		},
		{
			name: "IPv4-mapped interface address is reported as IPv4",
			v4:   v4DefaultEth0,
			ifaces: []Interface{
				{Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(netip.MustParseAddr("::ffff:10.0.2.15"), 120)}}},
			want: "10.0.2.15",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, warn := DetectHost(c.v4, c.v6, c.ifaces)
			if got != c.want {
				t.Errorf("host = %q, want %q", got, c.want)
			}
			if (warn != "") != c.wantWarn {
				t.Errorf("warning = %q, want warning: %v", warn, c.wantWarn)
			}
		})
	}
}

func TestParseRoutes(t *testing.T) {
	v4 := parseIPv4Routes(v4DefaultEth0)
	if len(v4) != 2 || v4[0] != (defaultRoute{"wlan0", 600}) || v4[1] != (defaultRoute{"eth0", 100}) {
		t.Errorf("IPv4 defaults = %v", v4)
	}
	if got := parseIPv6Routes(v6NoDefault); len(got) != 0 {
		t.Errorf("IPv6 defaults of a table with only lo reject routes = %v", got)
	}
	v6 := parseIPv6Routes(v6DefaultEth0)
	if len(v6) != 1 || v6[0] != (defaultRoute{"eth0", 0x400}) {
		t.Errorf("IPv6 defaults = %v", v6)
	}
	// A blackhole/reject IPv4 default does not count.
	if got := parseIPv4Routes(routeHeader + "eth0\t00000000\t00000000\t0201\t0\t0\t0\t00000000\t0\t0\t0\n"); len(got) != 0 {
		t.Errorf("reject route parsed as default: %v", got)
	}
}

func TestSystemDetectReturnsAHost(t *testing.T) {
	h, _ := SystemDetect()
	if _, err := NormalizeHost(h); err != nil {
		t.Fatalf("SystemDetect() = %q: %v", h, err)
	}
}

func FuzzParseIPv4Routes(f *testing.F) {
	f.Add(v4DefaultEth0)
	f.Add(routeHeader)
	f.Add("eth0 00000000 0 3 0 0 4294967296 00000000\n")
	f.Add("eth0 0 0 1 0 0 1 0 extra\r\n")
	f.Fuzz(func(t *testing.T, s string) {
		for _, r := range parseIPv4Routes(s) {
			if r.Iface == "" || strings.ContainsAny(r.Iface, " \t\n") {
				t.Fatalf("bad interface name %q", r.Iface)
			}
		}
		h, _ := DetectHost(s, "", []Interface{{Name: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/8")}}})
		if h != "10.0.0.1" {
			t.Fatalf("DetectHost = %q", h)
		}
	})
}

func FuzzParseIPv6Routes(f *testing.F) {
	f.Add(v6NoDefault)
	f.Add(v6DefaultEth0)
	f.Add("00000000000000000000000000000000 00 0 0 0 ffffffffff 0 0 1 eth0\n")
	f.Fuzz(func(t *testing.T, s string) {
		for _, r := range parseIPv6Routes(s) {
			if r.Iface == "" || r.Iface == "lo" {
				t.Fatalf("bad interface %q", r.Iface)
			}
		}
		h, _ := DetectHost("", s, nil)
		if h != "127.0.0.1" {
			t.Fatalf("DetectHost without interfaces = %q", h)
		}
	})
}

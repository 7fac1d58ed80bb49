package pinning

import (
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Route flags from linux/route.h and linux/ipv6_route.h.
const (
	rtfUp     = 0x0001
	rtfReject = 0x0200
)

// maxRouteTable bounds how much of a /proc routing table is read; a host with
// a full BGP table is not the appliance this detection is for, and the
// default route of an ordinary host is among the first few lines.
const maxRouteTable = 8 << 20

// Interface is one network interface as DetectHost sees it; SystemDetect
// lists only interfaces that are up.
type Interface struct {
	Name  string
	Addrs []netip.Prefix
}

// defaultRoute is a usable default route: the interface it leaves through and
// its metric (lower wins).
type defaultRoute struct {
	Iface  string
	Metric uint64
}

// parseIPv4Routes returns the usable default routes of a /proc/net/route
// table. Lines it cannot read are skipped: detection is a best guess and a
// kernel with an extra column must not make it fail.
func parseIPv4Routes(table string) []defaultRoute {
	var out []defaultRoute
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		// Iface Destination Gateway Flags RefCnt Use Metric Mask ...
		if len(f) < 8 || f[0] == "Iface" {
			continue
		}
		dest, err1 := strconv.ParseUint(f[1], 16, 32)
		flags, err2 := strconv.ParseUint(f[3], 16, 32)
		metric, err3 := strconv.ParseUint(f[6], 10, 32)
		mask, err4 := strconv.ParseUint(f[7], 16, 32)
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			continue
		}
		if dest != 0 || mask != 0 || flags&rtfUp == 0 || flags&rtfReject != 0 {
			continue
		}
		out = append(out, defaultRoute{Iface: f[0], Metric: metric})
	}
	return out
}

// parseIPv6Routes returns the usable default routes of a /proc/net/ipv6_route
// table. The kernel lists "unreachable" defaults on lo (RTF_REJECT), which
// are not routes out of the host.
func parseIPv6Routes(table string) []defaultRoute {
	var out []defaultRoute
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		// dest plen src splen nexthop metric refcnt use flags iface
		if len(f) < 10 || len(f[0]) != 32 {
			continue
		}
		if strings.Trim(f[0], "0") != "" {
			continue
		}
		plen, err1 := strconv.ParseUint(f[1], 16, 8)
		metric, err2 := strconv.ParseUint(f[5], 16, 32)
		flags, err3 := strconv.ParseUint(f[8], 16, 32)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		if plen != 0 || flags&rtfUp == 0 || flags&rtfReject != 0 || f[9] == "lo" {
			continue
		}
		out = append(out, defaultRoute{Iface: f[9], Metric: metric})
	}
	return out
}

// usableAddr is an address a remote client could plausibly reach: unicast,
// not loopback, not link-local (which needs a zone), not unspecified.
func usableAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsValid() && a.Zone() == "" && a.IsGlobalUnicast()
}

// DetectHost picks the address clients most likely reach this host on,
// without sending a packet: the address of the interface the default route
// leaves through (IPv4 preferred, as LAN clients usually are), else the
// lowest usable address of any interface, else 127.0.0.1 with a warning.
func DetectHost(ipv4Routes, ipv6Routes string, ifaces []Interface) (host string, warning string) {
	byName := make(map[string]Interface, len(ifaces))
	for _, i := range ifaces {
		if _, dup := byName[i.Name]; !dup {
			byName[i.Name] = i
		}
	}
	pick := func(routes []defaultRoute, want4 bool) (netip.Addr, bool) {
		slices.SortStableFunc(routes, func(a, b defaultRoute) int {
			switch {
			case a.Metric < b.Metric:
				return -1
			case a.Metric > b.Metric:
				return 1
			}
			return 0
		})
		for _, r := range routes {
			for _, p := range byName[r.Iface].Addrs {
				a := p.Addr().Unmap()
				if a.Is4() == want4 && usableAddr(a) {
					return a, true
				}
			}
		}
		return netip.Addr{}, false
	}
	if a, ok := pick(parseIPv4Routes(ipv4Routes), true); ok {
		return a.String(), ""
	}
	if a, ok := pick(parseIPv6Routes(ipv6Routes), false); ok {
		return a.String(), ""
	}
	var lowest netip.Addr
	for _, i := range ifaces {
		for _, p := range i.Addrs {
			a := p.Addr().Unmap()
			if usableAddr(a) && (!lowest.IsValid() || a.Less(lowest)) {
				lowest = a
			}
		}
	}
	if lowest.IsValid() {
		return lowest.String(), ""
	}
	return "127.0.0.1", "no network address other than loopback was found; advertising 127.0.0.1, " +
		"which only this host can reach: set `advertise` to the name or address clients use"
}

// SystemDetect runs DetectHost on this machine's routing tables and up
// interfaces. Missing /proc files (containers, non-Linux) just mean no
// default route is known.
func SystemDetect() (host string, warning string) {
	v4 := readBounded("/proc/net/route")
	v6 := readBounded("/proc/net/ipv6_route")
	var ifaces []Interface
	if list, err := net.Interfaces(); err == nil {
		for _, ni := range list {
			if ni.Flags&net.FlagUp == 0 {
				continue
			}
			addrs, err := ni.Addrs()
			if err != nil {
				continue
			}
			iface := Interface{Name: ni.Name}
			for _, a := range addrs {
				ipn, ok := a.(*net.IPNet)
				if !ok {
					continue
				}
				ip, ok := netip.AddrFromSlice(ipn.IP)
				if !ok {
					continue
				}
				ones, _ := ipn.Mask.Size()
				iface.Addrs = append(iface.Addrs, netip.PrefixFrom(ip.Unmap(), ones))
			}
			ifaces = append(ifaces, iface)
		}
	}
	return DetectHost(v4, v6, ifaces)
}

func readBounded(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	// A read error part-way leaves what was read, which is still worth parsing.
	var b strings.Builder
	_, _ = io.Copy(&b, io.LimitReader(f, maxRouteTable))
	return b.String()
}

// SystemLocalAddrs lists the addresses currently assigned to this host; it is
// what ResolveAuthority compares a remembered address against.
func SystemLocalAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// Package loopback decides what counts as "this machine only". Upstreams,
// the metrics listeners and broker plaintext all depend on the same answer,
// so it is decided in one place.
package loopback

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Host reports whether host is "localhost" or a loopback IP address
// (IPv4-mapped forms included).
func Host(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// CheckListen requires addr to be host:port with a loopback host.
func CheckListen(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if !Host(host) {
		return fmt.Errorf("%q must be on loopback (e.g. 127.0.0.1:9464)", addr)
	}
	return nil
}

package pairing

import (
	"crypto/x509"
	"net"
	"net/netip"
	"net/url"
	"strings"

	"github.com/hermes-securelink/securelink/pinning"
)

// The shipped clients, as pairing.md "What the shipped clients accept" names
// them.
const (
	ClientDesktop = "desktop"
	ClientAndroid = "android"
)

// ClientFacts are the properties of a pairing that decide which shipped
// client can use it.
type ClientFacts struct {
	// AuthorityHost is the host clients connect to (IPv6 without brackets).
	AuthorityHost string
	// SelfSigned is true when the front's identity is self-signed.
	SelfSigned bool
	// ProfileProblem is pinning.ProfileProblem of the identity ("" = none).
	ProfileProblem string
	// Reach is true when the QR carries an outbound_broker route, and
	// BrokerHost is that broker's host.
	Reach      bool
	BrokerHost string
}

// ClientNote is one thing a shipped client cannot do with a pairing, and the
// way around it. Notes never suggest installing the identity as a CA: it is
// not one.
type ClientNote struct {
	Client  string `json:"client"`
	Problem string `json:"problem"`
	Fix     string `json:"fix"`
}

const dnsAuthorityFix = "set `advertise: <DNS name>` (a name that resolves to this host) in the configuration, run `securelink pin --rotate --yes`, reload the daemon, and re-pair"

// ClientNotes lists what each shipped client cannot do with a pairing that
// has the given facts, for `pair`, `doctor` and `pin --rotate` to show.
func ClientNotes(f ClientFacts) []ClientNote {
	var out []ClientNote
	if f.ProfileProblem != "" {
		out = append(out, ClientNote{ClientDesktop, f.ProfileProblem,
			"run `securelink pin --rotate --yes` (the new identity has no keyUsage), reload the daemon, and re-pair every client"})
	}
	if a, err := netip.ParseAddr(strings.Trim(f.AuthorityHost, "[]")); err == nil {
		out = append(out, ClientNote{ClientDesktop,
			"the authority " + f.AuthorityHost + " is an IP address: the desktop client passes it as TLS server name and its runtime (Bun) refuses an IP there, so it cannot connect",
			dnsAuthorityFix})
		if a.Unmap().Is6() {
			out = append(out, ClientNote{ClientAndroid,
				"the authority " + f.AuthorityHost + " is an IPv6 address: the Android app cannot reach a bracketed IPv6 authority",
				dnsAuthorityFix})
		}
	}
	if f.SelfSigned {
		out = append(out, ClientNote{ClientAndroid,
			"the identity is self-signed: the Android app as published refuses every self-signed pinned certificate (it checks the pin only after building a chain to a root the phone trusts)",
			"set `tls.mode: acme` (a certificate from a CA the phone trusts, for the same key: the pin survives every renewal; see README, ACME)"})
	}
	if f.Reach {
		out = append(out, ClientNote{ClientAndroid,
			"the QR includes a Reach route: it serves the desktop client, not the Android app (the app opens its Relay WebSocket on the direct route and never uses the Reach route credential)",
			"give Android a direct route: --lan on the same network, or a public DNS name with `tls.mode: acme`"})
		if a, err := netip.ParseAddr(strings.Trim(f.BrokerHost, "[]")); err == nil && a.Unmap().Is6() {
			out = append(out, ClientNote{ClientAndroid,
				"the broker host " + f.BrokerHost + " is an IPv6 address, which the Android app cannot reach",
				"give reach.broker_url a DNS name"})
		}
	}
	return out
}

// DesktopRelayURL is the URL the desktop client keys a host paired through
// the plugin_proxy candidate at proxyURL by (wss://host[:port]/relay/ws, the
// default port left out as WHATWG URLs do), which `hermes-relay hosts
// forget` takes.
func DesktopRelayURL(proxyURL string) string {
	u, err := url.Parse(proxyURL)
	if err != nil || u.Host == "" {
		return "wss://<host>:<port>/relay/ws"
	}
	host := u.Host
	if h, p, err := net.SplitHostPort(host); err == nil && p == "443" {
		host = h
		if strings.Contains(h, ":") {
			host = "[" + h + "]"
		}
	}
	return "wss://" + host + "/relay/ws"
}

// DesktopForgetHint tells the operator how a desktop client that paired
// before drops the old pin: it keeps it and lets it override a new QR.
func DesktopForgetHint(proxyURL string) string {
	return "desktop clients that paired with this host before (e.g. before a rotation): run `hermes-relay hosts forget " +
		DesktopRelayURL(proxyURL) + " --yes` before scanning the new QR; the desktop client keeps the old pin otherwise"
}

// IdentityFacts are the facts that follow from the authority host clients
// connect to and the certificate the front serves.
func IdentityFacts(authorityHost string, leaf *x509.Certificate) ClientFacts {
	return ClientFacts{
		AuthorityHost:  authorityHost,
		SelfSigned:     pinning.SelfSigned(leaf),
		ProfileProblem: pinning.ProfileProblem(leaf),
	}
}

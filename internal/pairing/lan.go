package pairing

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/hermes-securelink/securelink/pinning"
)

// Default ports of a --lan route: the Hermes API server and the Relay.
const (
	DefaultLANAPIPort   = 8642
	DefaultLANRelayPort = 8767
)

// LANRoute is a --lan route: plain HTTP to the API server and plain ws:// to
// the Relay on an address the phone reaches directly.
type LANRoute struct {
	// Host is normalized (pinning.NormalizeHost), IPv6 without brackets.
	Host      string
	APIPort   int
	RelayPort int
}

// hostport is host:port with an IPv6 host in brackets.
func (r LANRoute) hostport(port int) string {
	return net.JoinHostPort(r.Host, strconv.Itoa(port))
}

// urlHost is the host as it appears in a URL authority: both clients build
// "scheme://" + api.host + ":" + port, so an IPv6 api.host must carry its
// brackets or the URL would be unusable.
func (r LANRoute) urlHost() string {
	if strings.Contains(r.Host, ":") {
		return "[" + r.Host + "]"
	}
	return r.Host
}

// String is the HOST:API_PORT:RELAY_PORT form ParseLAN reads.
func (r LANRoute) String() string {
	return r.urlHost() + ":" + strconv.Itoa(r.APIPort) + ":" + strconv.Itoa(r.RelayPort)
}

// Endpoint is the lan candidate; its priority is set by BuildEndpoints.
func (r LANRoute) Endpoint() Endpoint {
	return Endpoint{
		"role":     RoleLAN,
		"priority": IntOf(0),
		"api": map[string]any{
			"host": r.urlHost(),
			"port": IntOf(int64(r.APIPort)),
			"tls":  false,
		},
		"relay": map[string]any{
			"url":            "ws://" + r.hostport(r.RelayPort),
			"transport_hint": "ws",
		},
	}
}

// maxLANSpec bounds a --lan value; a DNS name is at most 253 bytes.
const maxLANSpec = 300

// ParseLAN reads HOST[:API_PORT[:RELAY_PORT]] with an IPv6 host in brackets.
// Addresses a phone can never reach from the LAN (loopback, unspecified,
// multicast, "localhost") are refused: such a route would only make the
// client time out before it tries the next candidate.
func ParseLAN(s string) (LANRoute, error) {
	if s == "" {
		return LANRoute{}, errors.New("--lan needs HOST[:API_PORT[:RELAY_PORT]]")
	}
	if len(s) > maxLANSpec {
		return LANRoute{}, errors.New("--lan value is too long")
	}
	var host, rest string
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return LANRoute{}, fmt.Errorf("--lan %q: missing ']' after the IPv6 address", s)
		}
		host, rest = s[:end+1], s[end+1:]
		if rest != "" && rest[0] != ':' {
			return LANRoute{}, fmt.Errorf("--lan %q: expected ':' after ']'", s)
		}
	} else {
		host, rest, _ = strings.Cut(s, ":")
		if rest != "" || strings.HasSuffix(s, ":") {
			rest = ":" + rest
		}
	}
	var ports []string
	if rest != "" {
		ports = strings.Split(rest[1:], ":")
	}
	if len(ports) > 2 {
		if !strings.HasPrefix(s, "[") {
			return LANRoute{}, fmt.Errorf("--lan %q: an IPv6 address must be in brackets, e.g. [fd00::5]:8642:8767", s)
		}
		return LANRoute{}, fmt.Errorf("--lan %q: want HOST[:API_PORT[:RELAY_PORT]]", s)
	}
	r := LANRoute{APIPort: DefaultLANAPIPort, RelayPort: DefaultLANRelayPort}
	for i, p := range ports {
		n, err := parsePortNumber(p)
		if err != nil {
			return LANRoute{}, fmt.Errorf("--lan %q: %w", s, err)
		}
		if i == 0 {
			r.APIPort = n
		} else {
			r.RelayPort = n
		}
	}
	h, err := pinning.NormalizeHost(host)
	if err != nil {
		return LANRoute{}, fmt.Errorf("--lan %q: %w", s, err)
	}
	if err := checkLANHost(h); err != nil {
		return LANRoute{}, fmt.Errorf("--lan %q: %w", s, err)
	}
	r.Host = h
	return r, nil
}

func checkLANHost(h string) error {
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return errors.New("localhost is not reachable from another device")
	}
	a, err := netip.ParseAddr(h)
	if err != nil {
		return nil // a DNS name
	}
	if a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() {
		return fmt.Errorf("%s is not an address another device can connect to", h)
	}
	return nil
}

func parsePortNumber(p string) (int, error) {
	if p == "" || len(p) > 5 {
		return 0, errors.New("port must be 1-65535")
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return 0, errors.New("port must be 1-65535")
		}
	}
	n, _ := strconv.Atoi(p)
	if n < 1 || n > 65535 {
		return 0, errors.New("port must be 1-65535")
	}
	return n, nil
}

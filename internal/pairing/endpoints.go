package pairing

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// Endpoint roles this product puts in the QR, and the spellings clients
// treat as the same roles (Android's displayLabel/hasHermesReach, the
// desktop's parseCandidate).
const (
	RolePluginProxy    = "plugin_proxy"
	RoleLAN            = "lan"
	RoleOutboundBroker = "outbound_broker"
)

var (
	pluginProxyRoles    = []string{"plugin_proxy", "plugin-proxy"}
	outboundBrokerRoles = []string{"outbound_broker", "broker", "relay_broker"}
)

// Endpoint is one candidate of the payload's endpoints array as a JSON value
// tree, so that members we do not model (and the Relay's exact values)
// survive until the canonical comparison.
type Endpoint map[string]any

// Role is the endpoint's role string, or "" when it has none.
func (e Endpoint) Role() string {
	r, _ := e["role"].(string)
	return r
}

// Priority is the endpoint's priority when it is an integer.
func (e Endpoint) Priority() (int, bool) {
	i, ok := e["priority"].(Int)
	if !ok {
		return 0, false
	}
	n, ok := i.Int64()
	if !ok || n < 0 || n > 1<<20 {
		return 0, false
	}
	return int(n), true
}

// Canonical is the endpoint's canonical JSON.
func (e Endpoint) Canonical() ([]byte, error) { return Canonical(map[string]any(e)) }

// Clone copies the endpoint deeply, so renumbering one list never changes
// another.
func (e Endpoint) Clone() Endpoint {
	c, _ := cloneValue(map[string]any(e)).(map[string]any)
	return Endpoint(c)
}

func cloneValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, vv := range x {
			m[k] = cloneValue(vv)
		}
		return m
	case Endpoint:
		return cloneValue(map[string]any(x))
	case []any:
		a := make([]any, len(x))
		for i, vv := range x {
			a[i] = cloneValue(vv)
		}
		return a
	default:
		return v
	}
}

// hasRole reports whether role is one of names, ignoring case as clients do.
func hasRole(role string, names []string) bool {
	return slices.Contains(names, strings.ToLower(role))
}

// ParseEndpoint reads one candidate from JSON (e.g. the "candidate" member of
// the admin socket's GET /identity).
func ParseEndpoint(raw []byte) (Endpoint, error) {
	m, err := ParseObject(raw)
	if err != nil {
		return nil, fmt.Errorf("endpoint: %w", err)
	}
	e := Endpoint(m)
	if e.Role() == "" {
		return nil, errors.New("endpoint has no role")
	}
	return e, nil
}

// PluginProxyEndpoint turns the daemon's plugin_proxy candidate into an
// endpoint, after the checks the clients apply before they pin it.
func PluginProxyEndpoint(c PluginProxyCandidate) (Endpoint, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	return ParseEndpoint(raw)
}

// BrokerBootstrap is the daemon's answer to POST /reach/bootstrap: a fresh
// one-use credential for the Reach route of this pairing.
type BrokerBootstrap struct {
	Token     string `json:"token"`
	PairingID string `json:"pairing_id"`
	ExpiresAt int64  `json:"expires_at"`
	HostID    string `json:"host_id"`
	BrokerURL string `json:"broker_url"`
}

// String never shows the token.
func (b BrokerBootstrap) String() string {
	return fmt.Sprintf("reach bootstrap for host %s at %s, expires %d", b.HostID, b.BrokerURL, b.ExpiresAt)
}

// GoString never shows the token either.
func (b BrokerBootstrap) GoString() string { return b.String() }

// Validate applies the clients' checks (Android isValidHermesReach, the
// desktop's parseCandidate): a wss URL whose path is exactly /v1/connect,
// a host_id of 16 and a token of 32 bytes in canonical unpadded base64url,
// and an expiry.
func (b BrokerBootstrap) Validate() error {
	if _, err := wire.ParseBrokerURL(b.BrokerURL); err != nil {
		return err
	}
	if _, err := wire.ParseID(b.HostID); err != nil {
		return errors.New("reach host_id is not 16 bytes of unpadded base64url")
	}
	if !canonicalBase64URL(b.Token, 32) {
		return errors.New("reach bootstrap token is not 32 bytes of unpadded base64url")
	}
	if b.ExpiresAt <= 0 {
		return errors.New("reach bootstrap token has no expiry")
	}
	return nil
}

func canonicalBase64URL(s string, n int) bool {
	if base64.RawURLEncoding.EncodedLen(n) != len(s) {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	return err == nil && len(b) == n
}

// BrokerEndpoint builds the outbound_broker candidate for b, carrying the
// same front, pin and certificate as pluginProxy (NewBrokerCandidate: its
// proxy leaves services out, no client reads it there and QR space is
// scarce). It is experimental, never recommended, and never labelled
// plugin_proxy or pinned_tls: the broker is not the trust boundary, the
// pinned TLS inside it is.
func BrokerEndpoint(b BrokerBootstrap, pluginProxy PluginProxyCandidate) (Endpoint, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	c, err := NewBrokerCandidate(0, BrokerCredential{
		URL:            b.BrokerURL,
		HostID:         b.HostID,
		CredentialKind: string(wire.KindBootstrap),
		Token:          wire.Secret(b.Token),
		ExpiresAt:      b.ExpiresAt,
	}, pluginProxy.Proxy.URL, pluginProxy.Proxy.PinSHA256, pluginProxy.Proxy.CertDER)
	if err != nil {
		return nil, err
	}
	raw, err := c.QRJSON()
	if err != nil {
		return nil, err
	}
	return ParseEndpoint(raw)
}

// BuildEndpoints returns the candidates of `securelink pair` in their fixed
// order — plugin_proxy, the LAN routes, then the broker (always last) — with
// priority equal to the position, 0 being the highest.
func BuildEndpoints(pluginProxy PluginProxyCandidate, lans []LANRoute, broker *BrokerBootstrap) ([]Endpoint, error) {
	pp, err := PluginProxyEndpoint(pluginProxy)
	if err != nil {
		return nil, err
	}
	out := []Endpoint{pp}
	for _, l := range lans {
		if l.Host == "" || l.APIPort < 1 || l.APIPort > 65535 || l.RelayPort < 1 || l.RelayPort > 65535 {
			return nil, fmt.Errorf("LAN route %q is incomplete; build it with ParseLAN", l.String())
		}
		out = append(out, l.Endpoint())
	}
	if broker != nil {
		be, err := BrokerEndpoint(*broker, pluginProxy)
		if err != nil {
			return nil, err
		}
		out = append(out, be)
	}
	for i, e := range out {
		e["priority"] = IntOf(int64(i))
	}
	return out, nil
}

// RouteSummary describes one candidate for the operator (role and where it
// points), without tokens or certificates.
func RouteSummary(e Endpoint) string {
	role := e.Role()
	obj := func(k string) map[string]any { m, _ := e[k].(map[string]any); return m }
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	switch {
	case hasRole(role, pluginProxyRoles):
		return fmt.Sprintf("%s: %s (Secure Link, pinned TLS)", role, str(obj("proxy"), "url"))
	case hasRole(role, outboundBrokerRoles):
		return fmt.Sprintf("%s: %s via %s (Reach, experimental)", role, str(obj("proxy"), "url"), str(obj("broker"), "url"))
	default:
		api := obj("api")
		if api != nil {
			scheme := "http"
			if t, _ := api["tls"].(bool); t {
				scheme = "https"
			}
			port := ""
			if p, ok := api["port"].(Int); ok {
				port = ":" + string(p)
			}
			s := fmt.Sprintf("%s: %s://%s%s", role, scheme, str(api, "host"), port)
			if r := str(obj("relay"), "url"); r != "" {
				s += ", relay " + r
			}
			return s
		}
		return role
	}
}

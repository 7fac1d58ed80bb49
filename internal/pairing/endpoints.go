package pairing

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/pinning"
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

// Default ports of a --lan route: the Hermes API server and the Relay.
const (
	DefaultLANAPIPort   = 8642
	DefaultLANRelayPort = 8767
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

// CheckMinted parses the Relay's qr_payload and checks it with
// Payload.CheckEndpoints.
func CheckMinted(qrPayload []byte, ours []Endpoint) error {
	p, err := ParsePayload(qrPayload)
	if err != nil {
		return err
	}
	return p.CheckEndpoints(ours)
}

// CheckEndpoints makes sure the signed payload carries exactly the trust we
// asked for: our candidates in order and equal in canonical JSON (pin,
// certificate, broker token), priorities equal to positions, no plugin_proxy
// or outbound_broker candidate that is not ours (a Relay whose own Secure
// Link is on adds its own pin and reorders the list), the broker last, and
// every expires_at an integer (Android reads a float as absent).
func (p *Payload) CheckEndpoints(ours []Endpoint) error {
	if err := checkExpiresAt(p.tree, 0); err != nil {
		return err
	}
	if len(ours) == 0 {
		return nil
	}
	if p.Endpoints == nil {
		return errors.New("the Relay's QR has no endpoints: it dropped our candidates (is hermes-relay too old for Secure Link?)")
	}
	oursCanon := make([][]byte, len(ours))
	for i, e := range ours {
		c, err := e.Canonical()
		if err != nil {
			return fmt.Errorf("our %s candidate: %w", e.Role(), err)
		}
		oursCanon[i] = c
	}
	theirs := make([][]byte, len(p.Endpoints))
	for i, e := range p.Endpoints {
		c, err := e.Canonical()
		if err != nil {
			return fmt.Errorf("the Relay's endpoint %d: %w", i, err)
		}
		theirs[i] = c
	}
	isOurs := func(c []byte) bool {
		return slices.ContainsFunc(oursCanon, func(o []byte) bool { return bytes.Equal(o, c) })
	}
	// Foreign trust-carrying candidates first: they are the usual root cause
	// of every other difference (the Relay also renumbers the list).
	for i, e := range p.Endpoints {
		if isOurs(theirs[i]) {
			continue
		}
		role := e.Role()
		switch {
		case hasRole(role, pluginProxyRoles) && !slices.ContainsFunc(ours, func(o Endpoint) bool { return sameProxy(o, e) }):
			return errors.New("the Relay added its own plugin_proxy candidate (its own Secure Link is on): disable it in hermes-relay, then pair again")
		case hasRole(role, outboundBrokerRoles) && !slices.ContainsFunc(ours, func(o Endpoint) bool { return hasRole(o.Role(), outboundBrokerRoles) }):
			return errors.New("the Relay added its own outbound_broker candidate (its own Secure Link connector is on): disable it in hermes-relay, then pair again")
		}
	}
	for i, e := range p.Endpoints {
		if n, ok := e.Priority(); !ok || n != i {
			return fmt.Errorf("the Relay's endpoint %d (%s) has a priority that is not its position", i, e.Role())
		}
	}
	j := 0
	for i := 0; i < len(theirs) && j < len(oursCanon); i++ {
		if bytes.Equal(theirs[i], oursCanon[j]) {
			j++
		}
	}
	if j < len(ours) {
		missing := ours[j]
		if i := slices.IndexFunc(p.Endpoints, func(e Endpoint) bool { return e.Role() == missing.Role() }); i >= 0 {
			diff := diffPaths(map[string]any(missing), map[string]any(p.Endpoints[i]), "", nil)
			return fmt.Errorf("the Relay changed our %s candidate (differs at %s); refusing a QR that does not carry our pin and routes as sent",
				missing.Role(), strings.Join(diff, ", "))
		}
		return fmt.Errorf("the Relay's QR lacks our %s candidate; refusing a QR that does not carry our pin and routes as sent", missing.Role())
	}
	for i, e := range p.Endpoints {
		if isOurs(theirs[i]) {
			continue
		}
		switch role := e.Role(); {
		case hasRole(role, pluginProxyRoles):
			return fmt.Errorf("the Relay's QR has a second plugin_proxy candidate at position %d; refusing it", i)
		case hasRole(role, outboundBrokerRoles):
			return fmt.Errorf("the Relay's QR has a second outbound_broker candidate at position %d; refusing it", i)
		}
	}
	if hasRole(ours[len(ours)-1].Role(), outboundBrokerRoles) && !bytes.Equal(theirs[len(theirs)-1], oursCanon[len(ours)-1]) {
		return errors.New("the Relay moved our outbound_broker candidate from the end of the list")
	}
	return nil
}

// sameProxy reports whether two candidates carry the same pin and URL, so a
// plugin_proxy that is ours but altered is reported as altered, not as
// foreign.
func sameProxy(a, b Endpoint) bool {
	pa, _ := a["proxy"].(map[string]any)
	pb, _ := b["proxy"].(map[string]any)
	if pa == nil || pb == nil {
		return false
	}
	return pa["pin_sha256"] == pb["pin_sha256"] && pa["url"] == pb["url"]
}

// diffPaths lists (at most 5) member paths where a and b differ. Only key
// names are reported: values may be tokens or keys.
func diffPaths(a, b any, prefix string, out []string) []string {
	if len(out) >= 5 {
		return out
	}
	ma, okA := a.(map[string]any)
	mb, okB := b.(map[string]any)
	if okA && okB {
		keys := make([]string, 0, len(ma)+len(mb))
		for k := range ma {
			keys = append(keys, k)
		}
		for k := range mb {
			if _, ok := ma[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			out = diffPaths(ma[k], mb[k], joinPath(prefix, k), out)
		}
		return out
	}
	ca, errA := Canonical(a)
	cb, errB := Canonical(b)
	if errA != nil || errB != nil || !bytes.Equal(ca, cb) {
		if prefix == "" {
			prefix = "(whole value)"
		}
		out = append(out, prefix)
	}
	return out
}

func joinPath(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

// checkExpiresAt requires every expires_at member anywhere in the tree to be
// an integer: the Android client reads a float as absent, which would turn
// an expiring bootstrap credential into one it treats as unbounded.
func checkExpiresAt(v any, depth int) error {
	if depth > maxDepth {
		return errors.New("payload nested too deeply")
	}
	switch x := v.(type) {
	case map[string]any:
		for k, vv := range x {
			if k == "expires_at" {
				if _, ok := vv.(Int); !ok {
					return errors.New("the Relay's QR has an expires_at that is not an integer")
				}
			}
			if err := checkExpiresAt(vv, depth+1); err != nil {
				return err
			}
		}
	case Endpoint:
		return checkExpiresAt(map[string]any(x), depth)
	case []any:
		for _, vv := range x {
			if err := checkExpiresAt(vv, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
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

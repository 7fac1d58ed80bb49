package pairing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/strictjson"
	"github.com/hermes-securelink/securelink/internal/surface"
	"github.com/hermes-securelink/securelink/pinning"
)

// Fixed values of the outbound_broker candidate (spec/reach.md "Bootstrap
// credential for pairing", pairing.md "Endpoint roles"). A broker route is
// never labelled plugin_proxy or pinned_tls: that would erase its boundary.
const (
	SecurityE2EEPinnedTLS = "e2ee_pinned_tls"
	TransportHintHTTPS    = "https"
)

// Bounds of a candidate file.
const (
	// maxCandidateBytes: cert_der is at most 8192 characters and the rest
	// is small; anything far larger is not a candidate.
	maxCandidateBytes = 32 << 10
	// maxPriority bounds priority; a QR holds a handful of endpoints.
	maxPriority = 1 << 16
)

// BrokerCandidate is the outbound_broker entry of a pairing QR, and the
// candidate file `securelink connect` reads. The struct's JSON tags give the
// exact keys, but json.Marshal redacts the token (it is a wire.Secret);
// QRJSON writes the real thing. It is built once (NewBrokerCandidate; the
// pairing endpoint BrokerEndpoint is its QRJSON) and parsed once
// (ParseBrokerCandidate).
type BrokerCandidate struct {
	Role         string           `json:"role"`
	Priority     int              `json:"priority"`
	Recommended  bool             `json:"recommended"`
	Experimental bool             `json:"experimental"`
	Security     string           `json:"security"`
	Broker       BrokerCredential `json:"broker"`
	Proxy        BrokerProxy      `json:"proxy"`
}

// BrokerCredential is the broker object: where to register and with what.
type BrokerCredential struct {
	ProtocolVersion int         `json:"protocol_version"`
	URL             string      `json:"url"`
	HostID          string      `json:"host_id"`
	CredentialKind  string      `json:"credential_kind"`
	Token           wire.Secret `json:"token"`
	ExpiresAt       int64       `json:"expires_at"`
}

// BrokerProxy is the Secure Link front the inner TLS goes to: the same
// values as the plugin_proxy candidate's proxy, without services.
type BrokerProxy struct {
	URL           string   `json:"url"`
	TransportHint string   `json:"transport_hint"`
	PinSHA256     string   `json:"pin_sha256"`
	CertDER       string   `json:"cert_der"`
	Surfaces      []string `json:"surfaces"`
}

var (
	keysCandidate = []string{"role", "priority", "recommended", "experimental", "security", "broker", "proxy"}
	keysBroker    = []string{"protocol_version", "url", "host_id", "credential_kind", "token", "expires_at"}
	keysProxy     = []string{"url", "transport_hint", "pin_sha256", "cert_der", "surfaces"}
)

// NewBrokerCandidate builds the candidate for a pairing QR from the
// credential the daemon minted and the identity it serves, filling in the
// fixed values, and checks it like ParseBrokerCandidate would.
func NewBrokerCandidate(priority int, broker BrokerCredential, proxyURL, pin, certDER string) (BrokerCandidate, error) {
	broker.ProtocolVersion = wire.ProtocolVersion
	c := BrokerCandidate{
		Role:         RoleOutboundBroker,
		Priority:     priority,
		Recommended:  false,
		Experimental: true,
		Security:     SecurityE2EEPinnedTLS,
		Broker:       broker,
		Proxy: BrokerProxy{
			URL:           proxyURL,
			TransportHint: TransportHintHTTPS,
			PinSHA256:     pin,
			CertDER:       certDER,
			Surfaces:      slices.Clone(surface.Namespaces),
		},
	}
	if err := c.Validate(); err != nil {
		return BrokerCandidate{}, err
	}
	return c, nil
}

// ParseBrokerCandidate reads an outbound_broker candidate strictly: exactly the
// keys of the spec at every level (no key missing, none extra, none twice),
// JSON types as shown there (protocol_version and expires_at integers,
// booleans real booleans), then the values (Validate).
func ParseBrokerCandidate(data []byte) (BrokerCandidate, error) {
	var c BrokerCandidate
	if len(data) > maxCandidateBytes {
		return c, fmt.Errorf("candidate: larger than %d bytes", maxCandidateBytes)
	}
	top, err := candidateObject(data, keysCandidate, "candidate")
	if err != nil {
		return c, err
	}
	if c.Role, err = jsonString(top["role"], "role"); err != nil {
		return c, err
	}
	prio, err := jsonInt(top["priority"], "priority")
	if err != nil {
		return c, err
	}
	if prio < 0 || prio > maxPriority {
		return c, fmt.Errorf("candidate: priority must be 0..%d", maxPriority)
	}
	c.Priority = int(prio)
	if c.Recommended, err = jsonBool(top["recommended"], "recommended"); err != nil {
		return c, err
	}
	if c.Experimental, err = jsonBool(top["experimental"], "experimental"); err != nil {
		return c, err
	}
	if c.Security, err = jsonString(top["security"], "security"); err != nil {
		return c, err
	}

	b, err := candidateObject(top["broker"], keysBroker, "candidate broker")
	if err != nil {
		return c, err
	}
	if string(b["protocol_version"]) != "1" {
		return c, errors.New("candidate: broker.protocol_version must be the integer 1")
	}
	c.Broker.ProtocolVersion = wire.ProtocolVersion
	if c.Broker.URL, err = jsonString(b["url"], "broker.url"); err != nil {
		return c, err
	}
	if c.Broker.HostID, err = jsonString(b["host_id"], "broker.host_id"); err != nil {
		return c, err
	}
	if c.Broker.CredentialKind, err = jsonString(b["credential_kind"], "broker.credential_kind"); err != nil {
		return c, err
	}
	tok, err := jsonString(b["token"], "broker.token")
	if err != nil {
		return c, err
	}
	c.Broker.Token = wire.Secret(tok)
	if c.Broker.ExpiresAt, err = jsonInt(b["expires_at"], "broker.expires_at"); err != nil {
		return c, err
	}

	p, err := candidateObject(top["proxy"], keysProxy, "candidate proxy")
	if err != nil {
		return c, err
	}
	if c.Proxy.URL, err = jsonString(p["url"], "proxy.url"); err != nil {
		return c, err
	}
	if c.Proxy.TransportHint, err = jsonString(p["transport_hint"], "proxy.transport_hint"); err != nil {
		return c, err
	}
	if c.Proxy.PinSHA256, err = jsonString(p["pin_sha256"], "proxy.pin_sha256"); err != nil {
		return c, err
	}
	if c.Proxy.CertDER, err = jsonString(p["cert_der"], "proxy.cert_der"); err != nil {
		return c, err
	}
	if c.Proxy.Surfaces, err = jsonStrings(p["surfaces"], "proxy.surfaces", len(surface.Namespaces)); err != nil {
		return c, err
	}
	if err := c.Validate(); err != nil {
		return BrokerCandidate{}, err
	}
	return c, nil
}

// Validate checks the values of a candidate. Errors never contain the token.
func (c BrokerCandidate) Validate() error {
	switch {
	case c.Role != RoleOutboundBroker:
		return fmt.Errorf("candidate: role %q, want %q", c.Role, RoleOutboundBroker)
	case c.Security != SecurityE2EEPinnedTLS:
		return fmt.Errorf("candidate: security %q, want %q", c.Security, SecurityE2EEPinnedTLS)
	case c.Recommended || !c.Experimental:
		return errors.New("candidate: a broker route is experimental and never recommended")
	case c.Priority < 0 || c.Priority > maxPriority:
		return fmt.Errorf("candidate: priority must be 0..%d", maxPriority)
	case c.Broker.ProtocolVersion != wire.ProtocolVersion:
		return errors.New("candidate: broker.protocol_version must be 1")
	case c.Broker.ExpiresAt <= 0:
		return errors.New("candidate: broker.expires_at must be a positive Unix time")
	}
	if err := wire.CheckClientCredential(c.Broker.URL, c.Broker.HostID, c.Broker.CredentialKind, c.Broker.Token); err != nil {
		return fmt.Errorf("candidate: %w", err)
	}
	if _, err := checkPinnedProxy(c.Proxy.URL, c.Proxy.PinSHA256, c.Proxy.CertDER); err != nil {
		return err
	}
	if c.Proxy.TransportHint != TransportHintHTTPS {
		return fmt.Errorf("candidate: proxy.transport_hint %q, want %q", c.Proxy.TransportHint, TransportHintHTTPS)
	}
	if len(c.Proxy.Surfaces) == 0 {
		return errors.New("candidate: proxy.surfaces is empty")
	}
	for i, s := range c.Proxy.Surfaces {
		if !slices.Contains(surface.Namespaces, s) || slices.Contains(c.Proxy.Surfaces[:i], s) {
			return fmt.Errorf("candidate: proxy.surfaces: %q is unknown or repeated", s)
		}
	}
	return nil
}

// proxyAuthority accepts exactly https://host:port (path empty or "/"),
// the form clients accept and the pin store is keyed by.
func proxyAuthority(s string) (pinning.Authority, error) {
	bad := func(why string) (pinning.Authority, error) {
		return pinning.Authority{}, fmt.Errorf("candidate: proxy.url must be https://host:port: %s", why)
	}
	u, err := url.Parse(s)
	if err != nil {
		return bad("does not parse")
	}
	switch {
	case u.Scheme != "https":
		return bad("scheme is not https")
	case u.User != nil || u.Opaque != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" ||
		strings.Contains(s, "#"):
		return bad("user info, query or fragment")
	case u.Path != "" && u.Path != "/":
		return bad("has a path")
	}
	a, err := pinning.ParseAuthority(u.Host)
	if err != nil {
		return bad(err.Error())
	}
	return a, nil
}

// Authority is the host and port of the Secure Link front, i.e. the server
// name to verify in the inner TLS and the clients' pin-store key; "", 0
// when the proxy URL is invalid.
func (c BrokerCandidate) Authority() (host string, port int) {
	a, err := proxyAuthority(c.Proxy.URL)
	if err != nil {
		return "", 0
	}
	return a.Host, a.Port
}

// Expired reports whether the credential's expiry has passed.
func (c BrokerCandidate) Expired(now time.Time) bool { return c.Broker.ExpiresAt <= now.Unix() }

// QRJSON is the candidate as it goes into the pairing QR: compact JSON with
// the keys in the spec's order, integers as integers, HTML characters not
// escaped, and the raw token. Treat the result as a secret.
func (c BrokerCandidate) QRJSON() ([]byte, error) {
	type broker struct {
		ProtocolVersion int    `json:"protocol_version"`
		URL             string `json:"url"`
		HostID          string `json:"host_id"`
		CredentialKind  string `json:"credential_kind"`
		Token           string `json:"token"`
		ExpiresAt       int64  `json:"expires_at"`
	}
	type qr struct {
		Role         string      `json:"role"`
		Priority     int         `json:"priority"`
		Recommended  bool        `json:"recommended"`
		Experimental bool        `json:"experimental"`
		Security     string      `json:"security"`
		Broker       broker      `json:"broker"`
		Proxy        BrokerProxy `json:"proxy"`
	}
	v := qr{
		Role: c.Role, Priority: c.Priority, Recommended: c.Recommended,
		Experimental: c.Experimental, Security: c.Security,
		Broker: broker{
			ProtocolVersion: c.Broker.ProtocolVersion, URL: c.Broker.URL, HostID: c.Broker.HostID,
			CredentialKind: c.Broker.CredentialKind, Token: string(c.Broker.Token), ExpiresAt: c.Broker.ExpiresAt,
		},
		Proxy: c.Proxy,
	}
	if v.Proxy.Surfaces == nil {
		v.Proxy.Surfaces = []string{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// CurlPin is the pin in curl's --pinnedpubkey form ("sha256//" + base64).
func (c BrokerCandidate) CurlPin() string {
	return "sha256//" + strings.TrimPrefix(c.Proxy.PinSHA256, pinning.PinPrefix)
}

// candidateObject reads one object of a candidate (internal/strictjson)
// whose keys must be exactly keys.
func candidateObject(data []byte, keys []string, what string) (strictjson.Object, error) {
	obj, err := strictjson.ParseObject(data, maxCandidateBytes)
	if err == nil {
		err = obj.Keys(keys)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return obj, nil
}

func jsonString(raw json.RawMessage, key string) (string, error) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", fmt.Errorf("candidate: %s must be a string", key)
	}
	return s, nil
}

func jsonBool(raw json.RawMessage, key string) (bool, error) {
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("candidate: %s must be true or false", key)
}

// jsonInt accepts only a JSON integer literal: clients read a float as
// absent, so 1780000000.0 or 1.78e9 are refused even though they are whole.
func jsonInt(raw json.RawMessage, key string) (int64, error) {
	s := string(raw)
	if s == "" || strings.ContainsAny(s, ".eE") || !(s[0] == '-' || s[0] >= '0' && s[0] <= '9') {
		return 0, fmt.Errorf("candidate: %s must be a JSON integer", key)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("candidate: %s must be a JSON integer", key)
	}
	return v, nil
}

func jsonStrings(raw json.RawMessage, key string, max int) ([]string, error) {
	var out []string
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &out) != nil || len(out) > max {
		return nil, fmt.Errorf("candidate: %s must be a list of at most %d strings", key, max)
	}
	return out, nil
}

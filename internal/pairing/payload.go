package pairing

import (
	"errors"
	"fmt"
	"math"
	"net"
	"regexp"
	"strconv"
	"strings"
)

// MaxPayloadBytes bounds a pairing payload. A QR holds at most 2,953 bytes;
// a larger payload is still parsed so that the text block, the invite URL and
// --json can be printed when only the QR is impossible.
const MaxPayloadBytes = 64 << 10

// codePattern is the Relay's pairing code: 6 characters A-Z0-9.
var codePattern = regexp.MustCompile(`^[A-Z0-9]{6}$`)

// Payload is a parsed Hermes pairing payload. The typed fields are a view
// for display and checks; the value tree (Tree) and the exact bytes (Raw)
// are what is signed, compared and shown in the QR.
//
// The payload holds secrets (the API key in "key", the pairing code, a
// broker token); String and GoString leave them out.
type Payload struct {
	// Version is "hermes": 1, 2, or 3 when endpoints are present.
	Version int
	// Host, Port and TLS describe the direct API server.
	Host string
	Port int
	TLS  bool
	// Relay is the optional relay block.
	Relay *RelayBlock
	// Endpoints is the ordered candidate list (nil when absent).
	Endpoints []Endpoint
	// DashboardURL is optional ("" when absent).
	DashboardURL string
	// Sig is the standard base64 HMAC-SHA256 ("" when unsigned).
	Sig string

	apiKey string
	tree   map[string]any
	raw    []byte
}

// RelayBlock is the payload's relay object.
type RelayBlock struct {
	URL string
	// Code is the one-use pairing code, valid 10 minutes.
	Code string
	// TTLSeconds is the session lifetime (0 = never) when present; the
	// Relay writes it as a float.
	TTLSeconds    *float64
	Grants        map[string]float64
	TransportHint string
}

// APIKey is the Hermes API bearer carried in "key". It is a secret: never log
// it or put it in an error.
func (p *Payload) APIKey() string { return p.apiKey }

// Tree is the parsed value tree. Callers must not modify it.
func (p *Payload) Tree() map[string]any { return p.tree }

// Raw is the payload exactly as received. Callers must not modify it.
func (p *Payload) Raw() []byte { return p.raw }

// String describes the payload without any secret.
func (p *Payload) String() string {
	if p == nil {
		return "<nil pairing payload>"
	}
	return fmt.Sprintf("hermes pairing payload v%d for %s (%d endpoints, %d bytes)",
		p.Version, joinHostPortInt(p.Host, p.Port), len(p.Endpoints), len(p.raw))
}

// GoString keeps %#v from printing the secrets.
func (p *Payload) GoString() string { return p.String() }

// ParsePayload parses and shape-checks a pairing payload. Members it does not
// know are kept in the tree (they are signed too).
func ParsePayload(data []byte) (*Payload, error) {
	if len(data) > MaxPayloadBytes {
		return nil, fmt.Errorf("pairing payload of %d bytes exceeds %d bytes", len(data), MaxPayloadBytes)
	}
	m, err := ParseObject(data)
	if err != nil {
		return nil, fmt.Errorf("pairing payload: %w", err)
	}
	p := &Payload{tree: m, raw: append([]byte(nil), data...)}
	v, ok := intMember(m, "hermes")
	if !ok || v < 1 || v > 3 {
		return nil, errors.New("pairing payload: hermes must be 1, 2 or 3")
	}
	p.Version = int(v)
	if p.Host, ok = m["host"].(string); !ok || p.Host == "" {
		return nil, errors.New("pairing payload: host must be a non-empty string")
	}
	port, ok := intMember(m, "port")
	if !ok || port < 1 || port > 65535 {
		return nil, errors.New("pairing payload: port must be 1-65535")
	}
	p.Port = int(port)
	if p.apiKey, ok = m["key"].(string); !ok {
		return nil, errors.New("pairing payload: key must be a string")
	}
	if p.TLS, ok = m["tls"].(bool); !ok {
		return nil, errors.New("pairing payload: tls must be a boolean")
	}
	if r, present := m["relay"]; present && r != nil {
		rb, err := parseRelayBlock(r)
		if err != nil {
			return nil, err
		}
		p.Relay = rb
	}
	if e, present := m["endpoints"]; present {
		arr, ok := e.([]any)
		if !ok {
			return nil, errors.New("pairing payload: endpoints must be an array")
		}
		p.Endpoints = make([]Endpoint, len(arr))
		for i, x := range arr {
			o, ok := x.(map[string]any)
			if !ok || Endpoint(o).Role() == "" {
				return nil, fmt.Errorf("pairing payload: endpoint %d is not an object with a role", i)
			}
			p.Endpoints[i] = Endpoint(o)
		}
		if len(arr) > 0 && p.Version != 3 {
			return nil, errors.New("pairing payload: endpoints present but hermes is not 3")
		}
	}
	if d, present := m["dashboard_url"]; present && d != nil {
		if p.DashboardURL, ok = d.(string); !ok {
			return nil, errors.New("pairing payload: dashboard_url must be a string")
		}
	}
	if s, present := m["sig"]; present {
		if p.Sig, ok = s.(string); !ok {
			return nil, errors.New("pairing payload: sig must be a string")
		}
	}
	return p, nil
}

func parseRelayBlock(v any) (*RelayBlock, error) {
	r, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("pairing payload: relay must be an object")
	}
	rb := &RelayBlock{}
	if rb.URL, ok = r["url"].(string); !ok {
		return nil, errors.New("pairing payload: relay.url must be a string")
	}
	if c, present := r["code"]; present {
		if rb.Code, ok = c.(string); !ok || !codePattern.MatchString(rb.Code) {
			return nil, errors.New("pairing payload: relay.code must be 6 characters A-Z0-9")
		}
	}
	if t, present := r["ttl_seconds"]; present && t != nil {
		f, ok := numberValue(t)
		if !ok || f < 0 {
			return nil, errors.New("pairing payload: relay.ttl_seconds must be a number >= 0")
		}
		rb.TTLSeconds = &f
	}
	if g, present := r["grants"]; present && g != nil {
		gm, ok := g.(map[string]any)
		if !ok {
			return nil, errors.New("pairing payload: relay.grants must be an object")
		}
		rb.Grants = make(map[string]float64, len(gm))
		for k, x := range gm {
			f, ok := numberValue(x)
			if !ok || f < 0 {
				return nil, errors.New("pairing payload: relay.grants values must be numbers >= 0")
			}
			rb.Grants[k] = f
		}
	}
	if h, present := r["transport_hint"]; present && h != nil {
		if rb.TransportHint, ok = h.(string); !ok {
			return nil, errors.New("pairing payload: relay.transport_hint must be a string")
		}
	}
	return rb, nil
}

// intMember returns m[k] when it is an Int that fits an int64.
func intMember(m map[string]any, k string) (int64, bool) {
	i, ok := m[k].(Int)
	if !ok {
		return 0, false
	}
	return i.Int64()
}

// numberValue returns a JSON number (Int or float) as a float64.
func numberValue(v any) (float64, bool) {
	switch x := v.(type) {
	case Int:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil || math.IsInf(f, 0) {
			return 0, false
		}
		return f, true
	case float64:
		return x, true
	}
	return 0, false
}

func joinHostPortInt(h string, p int) string {
	if strings.HasPrefix(h, "[") {
		return h + ":" + strconv.Itoa(p)
	}
	return net.JoinHostPort(h, strconv.Itoa(p))
}

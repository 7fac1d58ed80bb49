package pairing

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// goldenCert is a self-signed ECDSA certificate for host.example made by
// pinning.LoadOrCreate, and goldenPin its pin; fixed so that the golden JSON
// below is a literal.
const (
	goldenCert = "MIIBbTCCARKgAwIBAgIQZXdYy87JbVEQ7LIIc9LnMzAKBggqhkjOPQQDAjAXMRUwEwYDVQQDEwxob3N0LmV4YW1wbGUwHhcNMjYxMTI5MjAxNzM4WhcNMzYxMTI5MjExNzM4WjAXMRUwEwYDVQQDEwxob3N0LmV4YW1wbGUwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAATq9GZ1NGGQU3VRqmv+cKiuNG1l5bumkat21DTRMdaYqvXulQiF1hgOxEsVDtf5EleEfNwzpzHL/PMQo89oI7S6o0AwPjAOBgNVHQ8BAf8EBAMCB4AwEwYDVR0lBAwwCgYIKwYBBQUHAwEwFwYDVR0RBBAwDoIMaG9zdC5leGFtcGxlMAoGCCqGSM49BAMCA0kAMEYCIQCQhzvE/ATohGEBikkycwFRJaI+Pg1OSWs0+pvGa9YiZwIhAICDQcIX2hZeNLFiJjuFyPPS3usQoPX2fd7U1Rc7pt4+"
	goldenPin  = "sha256/+KboMhsHfDlZREcioCMNz8FUsgiyVEP5UksBNJKb68c="
)

// golden is the reach.md shape with real values, compact, in the spec's
// key order — what QRJSON must reproduce byte for byte.
var golden = `{"role":"outbound_broker","priority":2,"recommended":false,"experimental":true,` +
	`"security":"e2ee_pinned_tls",` +
	`"broker":{"protocol_version":1,"url":"wss://broker.example/v1/connect","host_id":"AAECAwQFBgcICQoLDA0ODw",` +
	`"credential_kind":"bootstrap","token":"ZXhhbXBsZS1ib290c3RyYXAtdG9rZW4tbm90LXJlYWw","expires_at":1780000000},` +
	`"proxy":{"url":"https://host.example:9443","transport_hint":"https","pin_sha256":"` + goldenPin + `",` +
	`"cert_der":"` + goldenCert + `","surfaces":["relay","api","dashboard"]}}`

func TestParseBrokerCandidateGolden(t *testing.T) {
	c, err := ParseBrokerCandidate([]byte(golden))
	if err != nil {
		t.Fatal(err)
	}
	if c.Broker.CredentialKind != "bootstrap" || c.Broker.ExpiresAt != 1780000000 ||
		string(c.Broker.Token) != "ZXhhbXBsZS1ib290c3RyYXAtdG9rZW4tbm90LXJlYWw" || c.Priority != 2 {
		t.Fatalf("parsed %+v", c)
	}
	host, port := c.Authority()
	if host != "host.example" || port != 9443 {
		t.Fatalf("authority %s %d", host, port)
	}
	out, err := c.QRJSON()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != golden {
		t.Fatalf("QRJSON differs from the golden form:\n%s\n%s", out, golden)
	}
	// Plain json.Marshal and fmt never reveal the token.
	redacted, _ := json.Marshal(c)
	if strings.Contains(string(redacted), string(c.Broker.Token)) || strings.Contains(fmt.Sprintf("%+v %v", c, c), string(c.Broker.Token)) {
		t.Fatal("the token leaks through json.Marshal or fmt")
	}
	if c.CurlPin() != "sha256//"+strings.TrimPrefix(goldenPin, "sha256/") {
		t.Fatalf("curl pin %s", c.CurlPin())
	}
	n, err := NewBrokerCandidate(2, c.Broker, c.Proxy.URL, c.Proxy.PinSHA256, c.Proxy.CertDER)
	if err != nil || !reflect.DeepEqual(n, c) {
		t.Fatalf("NewCandidate built %+v, %v", n, err)
	}
	// Whitespace between tokens is fine: it is JSON, not bytes.
	spaced := strings.ReplaceAll(golden, `,"`, `, "`)
	if _, err := ParseBrokerCandidate([]byte(" \n" + spaced + "\n")); err != nil {
		t.Fatalf("whitespace: %v", err)
	}
}

func TestParseBrokerCandidateRejects(t *testing.T) {
	g := golden
	rep := func(old, new string) string {
		if !strings.Contains(g, old) {
			t.Fatalf("golden lacks %q", old)
		}
		return strings.Replace(g, old, new, 1)
	}
	cases := map[string]string{
		"plugin_proxy role":       rep(`"role":"outbound_broker"`, `"role":"plugin_proxy"`),
		"pinned_tls security":     rep(`"security":"e2ee_pinned_tls"`, `"security":"pinned_tls"`),
		"recommended":             rep(`"recommended":false`, `"recommended":true`),
		"not experimental":        rep(`"experimental":true`, `"experimental":false`),
		"string boolean":          rep(`"experimental":true`, `"experimental":"true"`),
		"wrong path":              rep(`/v1/connect"`, `/v1/other"`),
		"no path":                 rep(`broker.example/v1/connect"`, `broker.example"`),
		"ws broker":               rep(`"wss://broker`, `"ws://broker`),
		"broker query":            rep(`/v1/connect"`, `/v1/connect?x=1"`),
		"float expires_at":        rep(`1780000000`, `1780000000.5`),
		"whole float expires_at":  rep(`1780000000`, `1780000000.0`),
		"exponent expires_at":     rep(`1780000000`, `1.78e9`),
		"string expires_at":       rep(`1780000000`, `"1780000000"`),
		"zero expires_at":         rep(`1780000000`, `0`),
		"null expires_at":         rep(`1780000000`, `null`),
		"version 1.0":             rep(`"protocol_version":1`, `"protocol_version":1.0`),
		"version true":            rep(`"protocol_version":1`, `"protocol_version":true`),
		"version 2":               rep(`"protocol_version":1`, `"protocol_version":2`),
		"missing pin":             rep(`"pin_sha256":"`+goldenPin+`",`, ``),
		"empty pin":               rep(goldenPin, ``),
		"pin of another key":      rep(goldenPin, "sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
		"bad cert":                rep(`"cert_der":"MII`, `"cert_der":"xMII`),
		"http proxy":              rep(`"https://host.example:9443"`, `"http://host.example:9443"`),
		"proxy without port":      rep(`"https://host.example:9443"`, `"https://host.example"`),
		"proxy path":              rep(`"https://host.example:9443"`, `"https://host.example:9443/relay"`),
		"transport hint":          rep(`"transport_hint":"https"`, `"transport_hint":"brokered_tls"`),
		"unknown surface":         rep(`"dashboard"]`, `"admin"]`),
		"repeated surface":        rep(`"dashboard"]`, `"relay"]`),
		"no surfaces":             rep(`["relay","api","dashboard"]`, `[]`),
		"route kind host":         rep(`"credential_kind":"bootstrap"`, `"credential_kind":"host"`),
		"short token":             rep(`"ZXhhbXBsZS1ib290c3RyYXAtdG9rZW4tbm90LXJlYWw"`, `"short"`),
		"non-canonical host_id":   rep(`AAECAwQFBgcICQoLDA0ODw`, `AAECAwQFBgcICQoLDA0ODx`),
		"negative priority":       rep(`"priority":2`, `"priority":-1`),
		"extra key":               rep(`"priority":2,`, `"priority":2,"display_name":"x",`),
		"extra broker key":        rep(`"protocol_version":1,`, `"protocol_version":1,"extra":1,`),
		"proxy services":          rep(`"surfaces":`, `"services":{},"surfaces":`),
		"duplicate key":           rep(`"priority":2,`, `"priority":2,"priority":2,`),
		"missing broker":          `{"role":"outbound_broker"}`,
		"trailing data":           g + `{}`,
		"array":                   `[` + g + `]`,
		"not JSON":                `{"role":`,
		"broker is a string":      rep(`"broker":{`, `"broker":"x","x":{`),
		"oversize":                g + strings.Repeat(" ", maxCandidateBytes),
		"invalid UTF-8 in string": rep(`host.example:9443"`, "host.example:9443\xff\""),
	}
	for name, in := range cases {
		c, err := ParseBrokerCandidate([]byte(in))
		if err == nil {
			t.Errorf("%s: accepted %+v", name, c)
			continue
		}
		if strings.Contains(err.Error(), "ZXhhbXBsZS1ib290c3RyYXAtdG9rZW4tbm90LXJlYWw") {
			t.Errorf("%s: error reveals the token: %v", name, err)
		}
	}
}

func FuzzParseBrokerCandidate(f *testing.F) {
	f.Add([]byte(golden))
	f.Add([]byte(strings.Replace(golden, `1780000000`, `1780000000.5`, 1)))
	f.Add([]byte(strings.Replace(golden, `"bootstrap"`, `"route"`, 1)))
	f.Add([]byte(strings.Replace(golden, `"priority":2,`, `"priority":2,"priority":3,`, 1)))
	f.Add([]byte(strings.Replace(golden, `outbound_broker`, `plugin_proxy`, 1)))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"role":"outbound_broker","broker":{"url":"wss://x/v1/connect"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseBrokerCandidate(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed but invalid: %v", err)
		}
		out, err := c.QRJSON()
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseBrokerCandidate(out)
		if err != nil {
			t.Fatalf("QRJSON output does not parse: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(again, c) {
			t.Fatalf("round trip changed the candidate")
		}
		if host, port := c.Authority(); host == "" || port == 0 {
			t.Fatal("valid candidate without authority")
		}
	})
}

func TestBrokerCandidateExpired(t *testing.T) {
	c, err := ParseBrokerCandidate([]byte(golden))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Expired(time.Unix(1780000000, 0)) || c.Expired(time.Unix(1779999999, 0)) {
		t.Fatal("expiry boundary")
	}
}

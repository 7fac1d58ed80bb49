package pairing

import (
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hermes-securelink/securelink/pinning"
)

// testQRKey is the QR secret of the fake Relay and of the Python vectors.
var testQRKey = []byte("0123456789abcdef0123456789abcdef")

// testAPIKey, testCode and the broker token are the secrets that must never
// appear in an error.
const (
	testAPIKey = "API-KEY-SECRET-XYZ"
	testCode   = "K7Q2ZP"
)

func testCandidate(t testing.TB) PluginProxyCandidate {
	t.Helper()
	a := pinning.Authority{Host: "192.0.2.10", Port: 9443}
	id, err := pinning.LoadOrCreate(pinning.IdentityConfig{StateDir: filepath.Join(t.TempDir(), "state"), Authority: a})
	if err != nil {
		t.Fatal(err)
	}
	return NewPluginProxyCandidate(a, id)
}

func testBroker() BrokerBootstrap {
	return BrokerBootstrap{
		Token:     base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("T", 32))),
		PairingID: "pairing-1",
		ExpiresAt: 1780000000,
		HostID:    base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("H", 16))),
		BrokerURL: "wss://broker.example/v1/connect",
	}
}

func testEndpoints(t testing.TB, withBroker bool, lans ...string) []Endpoint {
	t.Helper()
	return testEndpointsFor(t, testCandidate(t), withBroker, lans...)
}

func testEndpointsFor(t testing.TB, c PluginProxyCandidate, withBroker bool, lans ...string) []Endpoint {
	t.Helper()
	var routes []LANRoute
	for _, l := range lans {
		r, err := ParseLAN(l)
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, r)
	}
	var b *BrokerBootstrap
	if withBroker {
		bb := testBroker()
		b = &bb
	}
	eps, err := BuildEndpoints(c, routes, b)
	if err != nil {
		t.Fatal(err)
	}
	return eps
}

// relayPayload builds what the Relay's /pairing/mint signs for endpoints:
// the top-level API fields, the relay block with the session lifetime as a
// float (the Relay converts it), the endpoints verbatim, and the sig.
// mutate, when set, changes the tree before signing.
func relayPayload(t testing.TB, endpoints []any, ttl *float64, mutate func(map[string]any)) []byte {
	t.Helper()
	relay := map[string]any{"url": "ws://192.0.2.10:8767", "code": testCode}
	if ttl != nil {
		relay["ttl_seconds"] = *ttl
	}
	tree := map[string]any{
		"hermes": IntOf(1), "host": "192.0.2.10", "port": IntOf(8642), "key": testAPIKey, "tls": false,
		"relay": relay,
	}
	if endpoints != nil {
		tree["hermes"] = IntOf(3)
		tree["endpoints"] = endpoints
	}
	if mutate != nil {
		mutate(tree)
	}
	sig, err := Sign(testQRKey, tree)
	if err != nil {
		t.Fatal(err)
	}
	tree["sig"] = sig
	out, err := Canonical(tree)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func endpointsAny(eps []Endpoint) []any {
	out := make([]any, len(eps))
	for i, e := range eps {
		out[i] = map[string]any(e.Clone())
	}
	return out
}

func assertNoSecrets(t testing.TB, err error, extra ...string) {
	t.Helper()
	if err == nil {
		return
	}
	for _, s := range append([]string{testAPIKey, testCode, testBroker().Token}, extra...) {
		if strings.Contains(err.Error(), s) {
			t.Errorf("error reveals a secret: %v", err)
		}
	}
}

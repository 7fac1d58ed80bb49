package wire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// seqID is the ID of bytes 00..0f; its text was computed outside Go
// (xxd -r -p | base64 | tr '+/' '-_' | tr -d '=').
var seqID = ID{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}

const seqIDText = "AAECAwQFBgcICQoLDA0ODw"

func TestIDText(t *testing.T) {
	if got := seqID.String(); got != seqIDText {
		t.Fatalf("String() = %q, want %q", got, seqIDText)
	}
	id, err := ParseID(seqIDText)
	if err != nil || id != seqID {
		t.Fatalf("ParseID(%q) = %v, %v", seqIDText, id, err)
	}
}

func TestNewIDIsRandomAndCanonical(t *testing.T) {
	seen := map[ID]bool{}
	for range 64 {
		id := NewID()
		if seen[id] {
			t.Fatal("NewID repeated a value")
		}
		seen[id] = true
		back, err := ParseID(id.String())
		if err != nil || back != id || len(id.String()) != IDLen {
			t.Fatalf("NewID %q does not round-trip: %v", id, err)
		}
	}
}

func TestParseIDRejectsNonCanonical(t *testing.T) {
	bad := map[string]string{
		"empty":                 "",
		"21 chars":              seqIDText[:21],
		"23 chars":              seqIDText + "A",
		"padded":                seqIDText + "==",
		"plus":                  "+AECAwQFBgcICQoLDA0ODw",
		"slash":                 "/AECAwQFBgcICQoLDA0ODw",
		"space":                 " AECAwQFBgcICQoLDA0ODw",
		"newline inside":        "AAECAwQFBgcICQoLDA0OD\n",
		"non-zero trailing bit": "AAAAAAAAAAAAAAAAAAAAAB", // last char 'B' sets an unused bit
		"trailing bits 'P'":     "AAAAAAAAAAAAAAAAAAAAAP",
		"non-ASCII":             "AAECAwQFBgcICQoLDA0Oé",
	}
	for name, s := range bad {
		if _, err := ParseID(s); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%s: ParseID(%q) err = %v, want unauthorized", name, s, err)
		}
	}
	// The four legal last characters of a 16-byte value.
	for _, last := range "AQgw" {
		s := "AAAAAAAAAAAAAAAAAAAAA" + string(last)
		if _, err := ParseID(s); err != nil {
			t.Errorf("ParseID(%q) = %v, want ok", s, err)
		}
	}
}

func TestIDInJSONStructs(t *testing.T) {
	type rec struct {
		Host ID `json:"host_id"`
	}
	b, err := json.Marshal(rec{Host: seqID})
	if err != nil || string(b) != `{"host_id":"`+seqIDText+`"}` {
		t.Fatalf("Marshal = %s, %v", b, err)
	}
	var r rec
	if err := json.Unmarshal(b, &r); err != nil || r.Host != seqID {
		t.Fatalf("Unmarshal = %v, %v", r, err)
	}
	if err := json.Unmarshal([]byte(`{"host_id":"AAAAAAAAAAAAAAAAAAAAAB"}`), &r); err == nil {
		t.Error("non-canonical id accepted through UnmarshalText")
	}
}

func TestTokens(t *testing.T) {
	tok := NewToken()
	if len(tok) != TokenLen || !ValidWireToken(string(tok)) {
		t.Fatalf("NewToken length %d", len(tok))
	}
	if _, err := ParseDigest(string(tok)); err != nil { // same shape as a digest: 32 bytes
		t.Errorf("token is not canonical base64url of 32 bytes: %v", err)
	}
	if NewToken() == tok {
		t.Error("NewToken repeated a value")
	}
	cases := []struct {
		s  string
		ok bool
	}{
		{strings.Repeat("a", 31), false},
		{strings.Repeat("a", 32), true},
		{strings.Repeat("a", 512), true},
		{strings.Repeat("a", 513), false},
		// Characters, not bytes: 32 two-byte characters pass, 513 fail.
		{strings.Repeat("é", 32), true},
		{strings.Repeat("é", 31), false},
		{strings.Repeat("é", 512), true},
		{strings.Repeat("é", 513), false},
		{strings.Repeat("😀", 512), true},
		// Any alphabet, as the reference: punctuation and spaces count.
		{"bootstrap-" + strings.Repeat("b", 40), true},
		{strings.Repeat("a b+/=", 6), true},
		{strings.Repeat("a", 40) + "\xff", false}, // not UTF-8
	}
	for _, c := range cases {
		if got := ValidWireToken(c.s); got != c.ok {
			t.Errorf("ValidWireToken(%d bytes, %d runes) = %v, want %v",
				len(c.s), len([]rune(c.s)), got, c.ok)
		}
	}
}

func TestSecretRedacts(t *testing.T) {
	s := Secret("super-secret-token-value-0123456789")
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d", "%10s"} {
		if out := fmt.Sprintf(verb, s); strings.Contains(out, "super") || strings.Contains(out, "7375706572") {
			t.Errorf("%s printed the secret: %s", verb, out)
		}
	}
	if out := fmt.Sprintf("%+v", Register{Token: s}); strings.Contains(out, "super") {
		t.Errorf("struct print leaked: %s", out)
	}
	b, _ := json.Marshal(struct{ T Secret }{s})
	if bytes.Contains(b, []byte("super")) {
		t.Errorf("json leaked: %s", b)
	}
	var back struct{ T Secret }
	if err := json.Unmarshal([]byte(`{"T":"from-config"}`), &back); err != nil || string(back.T) != "from-config" {
		t.Errorf("a Secret must still be readable from config: %q %v", string(back.T), err)
	}
}

func TestDigestVector(t *testing.T) {
	// FIPS 180-2 test vector SHA-256("abc"), and its base64url computed with
	// coreutils (base64 | tr '+/' '-_' | tr -d '=').
	wantHex := "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	const wantText = "ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0"
	d := TokenDigest("abc")
	if hex.EncodeToString(d[:]) != wantHex {
		t.Fatalf("digest bytes %x", d)
	}
	if d.String() != wantText || len(wantText) != DigestLen {
		t.Fatalf("String() = %q, want %q", d.String(), wantText)
	}
	p, err := ParseDigest(wantText)
	if err != nil || !p.Equal(d) {
		t.Fatalf("ParseDigest = %v, %v", p, err)
	}
	// UTF-8 bytes are hashed: "é" is c3 a9.
	if TokenDigest("é") != TokenDigest(string([]byte{0xc3, 0xa9})) {
		t.Error("digest is not over UTF-8 bytes")
	}
	if TokenDigest("abd").Equal(d) {
		t.Error("different tokens compare equal")
	}
}

func TestParseDigestRejectsNonCanonical(t *testing.T) {
	const good = "ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0"
	bad := []string{
		"", good[:42], good + "A", good + "=",
		"ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0", // std alphabet
		good[:42] + "1", // '1' sets an unused bit of the last character
	}
	for _, s := range bad {
		if _, err := ParseDigest(s); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("ParseDigest(%q) err = %v", s, err)
		}
	}
}

func TestRouteCredentialID(t *testing.T) {
	// First 16 bytes of SHA-256("abc"), base64url by coreutils.
	const want = "ungWv48Bz-pBQUDeXa4iIw"
	if got := RouteCredentialID("abc"); got != want {
		t.Fatalf("RouteCredentialID = %q, want %q", got, want)
	}
	if !ValidLabel(want) {
		t.Error("credential id is not a valid label")
	}
}

func TestLabels(t *testing.T) {
	good := []string{"a", "pair-1", "route_1", "ungWv48Bz-pBQUDeXa4iIw", strings.Repeat("Z", 128)}
	bad := []string{"", strings.Repeat("Z", 129), "a b", "a.b", "a/b", "é", "a\x00", "a+b", "a=b"}
	for _, s := range good {
		if !ValidLabel(s) {
			t.Errorf("ValidLabel(%q) = false", s)
		}
	}
	for _, s := range bad {
		if ValidLabel(s) {
			t.Errorf("ValidLabel(%q) = true", s)
		}
	}
	if ValidExtension("Credit") || !ValidExtension("credit") || ValidExtension(strings.Repeat("a", 33)) {
		t.Error("extension names are 1..32 of [a-z0-9_-]")
	}
}

func TestParseExpiresAt(t *testing.T) {
	ok := map[string]int64{
		"1780000000":              1780000000,
		"1780000000.0":            1780000000,
		"1780000000.999":          1780000000,
		"1.78e9":                  1780000000,
		"1780000000e0":            1780000000,
		"0":                       0,
		"-1":                      -1,
		"-0.5":                    -1,
		"-1.5":                    -2,
		"9223372036854775807":     math.MaxInt64,
		"9223372036854775808":     math.MaxInt64, // overflow clamps
		"99999999999999999999999": math.MaxInt64,
		"-9223372036854775809":    math.MinInt64,
		"1e19":                    math.MaxInt64,
		"1e400":                   math.MaxInt64, // ±Inf in float64
		"-1e400":                  math.MinInt64,
		"1e-400":                  0,
		"9.2e18":                  9200000000000000000,
	}
	for in, want := range ok {
		got, err := ParseExpiresAt(json.RawMessage(in))
		if err != nil || got != want {
			t.Errorf("ParseExpiresAt(%s) = %d, %v, want %d", in, got, err, want)
		}
	}
	bad := []string{"true", "false", "null", `"1780000000"`, `"2026-05-01T00:00:00Z"`,
		"[1]", "{}", "", "-", "1.", "01", "+1", "NaN", "Infinity", "1 2"}
	for _, in := range bad {
		if _, err := ParseExpiresAt(json.RawMessage(in)); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("ParseExpiresAt(%q) err = %v, want unauthorized", in, err)
		}
	}
}

func TestCheckExpiry(t *testing.T) {
	now := time.Unix(1_700_000_000, 500_000_000)
	n := now.Unix()
	day := int64(24 * 3600)
	cases := []struct {
		kind    Kind
		in, out int64
		err     error
	}{
		{KindRoute, n - 1, 0, ErrExpired},
		{KindRoute, n, 0, ErrExpired},
		{KindBootstrap, n, 0, ErrExpired},
		{KindRoute, math.MinInt64, 0, ErrExpired},
		{KindRoute, n + 1, n + 1, nil},
		{KindRoute, n + 90*day, n + 90*day, nil},
		{KindRoute, n + 90*day + 1, n + 90*day, nil}, // clamped
		{KindRoute, math.MaxInt64, n + 90*day, nil},
		{KindBootstrap, n + 3600, n + 3600, nil},
		{KindBootstrap, n + 3601, 0, ErrUnauthorized},
		{KindBootstrap, math.MaxInt64, 0, ErrUnauthorized},
		{KindHost, n + 10, 0, ErrUnauthorized},
	}
	for _, c := range cases {
		got, err := CheckExpiry(c.kind, c.in, now)
		if !errors.Is(err, c.err) || (c.err == nil && err != nil) || got != c.out {
			t.Errorf("CheckExpiry(%s, now%+d) = %d, %v; want %d, %v", c.kind, c.in-n, got, err, c.out, c.err)
		}
	}
}

func TestParseBrokerURL(t *testing.T) {
	good := []string{
		"wss://broker.example/v1/connect",
		"wss://broker.example:8443/v1/connect",
		"wss://127.0.0.1:9444/v1/connect",
		"wss://[::1]:9444/v1/connect",
		"WSS://broker.example/v1/connect", // scheme is case-insensitive
	}
	for _, s := range good {
		if _, err := ParseBrokerURL(s); err != nil {
			t.Errorf("ParseBrokerURL(%q) = %v", s, err)
		}
	}
	bad := []string{
		"", "ws://broker.example/v1/connect", "https://broker.example/v1/connect",
		"wss://broker.example", "wss://broker.example/", "wss://broker.example/v1/connect/",
		"wss://broker.example/v1/tunnel", "wss://broker.example/x/v1/connect",
		"wss://broker.example/v1/%63onnect", "wss://broker.example/v1/connect?token=x",
		"wss://broker.example/v1/connect?", "wss://broker.example/v1/connect#",
		"wss://broker.example/v1/connect#f", "wss://user:pw@broker.example/v1/connect",
		"wss://user@broker.example/v1/connect", "wss:///v1/connect", "wss://:9444/v1/connect",
		"wss://broker.example:0/v1/connect", "wss://broker.example:65536/v1/connect",
		"wss://broker.example:/v1/connect", "wss://broker.example:09444/v1/connect",
		" wss://broker.example/v1/connect", "wss://broker.example/v1/connect\n",
	}
	for _, s := range bad {
		u, err := ParseBrokerURL(s)
		if err == nil {
			t.Errorf("ParseBrokerURL(%q) accepted: %v", s, u)
		} else if strings.Contains(err.Error(), "pw") || strings.Contains(err.Error(), "token=") {
			t.Errorf("error repeats URL parts: %v", err)
		}
	}
}

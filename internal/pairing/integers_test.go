package pairing

import (
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

type integerVectors struct {
	Key     string `json:"key"`
	Vectors []struct {
		Name             string `json:"name"`
		RelayQRPayload   string `json:"relay_qr_payload"`
		IntegerCanonical string `json:"integer_canonical"`
		IntegerSig       string `json:"integer_sig"`
	} `json:"vectors"`
}

// The vectors come from testdata/app_integers_vectors.py, which signs the
// way the Relay's plugin/relay/qr_sign.py does: the Relay's payload with its
// float seconds, and the same payload with integers. Normalizing the first
// and re-signing it in Go must give Python's bytes and signature.
func TestAppIntegersMatchThePythonSigner(t *testing.T) {
	data, err := os.ReadFile("testdata/app_integers_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var tv integerVectors
	if err := json.Unmarshal(data, &tv); err != nil || len(tv.Vectors) == 0 {
		t.Fatalf("vectors: %v", err)
	}
	key := []byte(tv.Key)
	for _, v := range tv.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			resp := mintResponseFor(t, []byte(v.RelayQRPayload))
			if err := Verify(key, resp.Payload.Tree()); err != nil {
				t.Fatalf("the Relay's own signature: %v", err)
			}
			norm, changed, err := NormalizeAppIntegers(resp.Payload.Tree())
			if err != nil {
				t.Fatal(err)
			}
			if len(changed) == 0 || !slices.ContainsFunc(changed, func(s string) bool { return strings.HasPrefix(s, "relay.") }) {
				t.Fatalf("changed %v", changed)
			}
			in, err := SigningInput(norm)
			if err != nil || string(in) != v.IntegerCanonical {
				t.Fatalf("canonical after normalizing (%v)\n got %s\nwant %s", err, in, v.IntegerCanonical)
			}
			out, err := resp.Resigned(key, norm)
			if err != nil {
				t.Fatal(err)
			}
			if out.Payload.Sig != v.IntegerSig {
				t.Fatalf("sig %s, Python %s", out.Payload.Sig, v.IntegerSig)
			}
			if floatText.Match(out.QRPayload) {
				t.Fatalf("a float survived: %s", out.QRPayload)
			}
			if back, err := ParseInviteURL(out.PairingURL); err != nil || string(back) != string(out.QRPayload) {
				t.Fatalf("invite URL does not carry the re-signed payload: %v", err)
			}
			if out.Code != resp.Code || out.ExpiresAt != resp.ExpiresAt {
				t.Fatalf("code or expiry changed")
			}
			// The Relay's original is untouched.
			if _, again, _ := NormalizeAppIntegers(resp.Payload.Tree()); !slices.Equal(again, changed) {
				t.Fatalf("normalizing modified its input: %v", again)
			}
		})
	}
}

var floatText = regexp.MustCompile(`[0-9]\.0[,}\]]`)

// mintResponseFor wraps a Relay-written qr_payload as parseMintResponse
// would have returned it.
func mintResponseFor(t *testing.T, qr []byte) MintResponse {
	t.Helper()
	p, err := ParsePayload(qr)
	if err != nil {
		t.Fatal(err)
	}
	return MintResponse{Code: p.Relay.Code, QRPayload: qr, PairingURL: InviteURL(qr), ExpiresAt: 1780000000, Payload: p}
}

func TestNormalizeAppIntegersRules(t *testing.T) {
	base := func() map[string]any {
		m, err := ParseObject([]byte(`{"hermes":3.0,"host":"h","port":8642,"key":"","tls":true,` +
			`"relay":{"url":"wss://h","code":"ABC123","ttl_seconds":0.0,"grants":{"b":86400.0,"a":60}},` +
			`"endpoints":[{"role":"lan","priority":1.0,"api":{"host":"h","port":8642.0}},` +
			`{"role":"outbound_broker","priority":2,"broker":{"protocol_version":1.0,"expires_at":1780000000.0},"extra":1.5}],` +
			`"other":2.5}`))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	norm, changed, err := NormalizeAppIntegers(base())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"hermes", "relay.ttl_seconds", "relay.grants.b", "endpoints.0.priority", "endpoints.0.api.port",
		"endpoints.1.broker.protocol_version", "endpoints.1.broker.expires_at"}
	if !slices.Equal(changed, want) {
		t.Fatalf("changed %v\nwant %v", changed, want)
	}
	c, _ := Canonical(norm)
	for _, s := range []string{`"hermes":3,`, `"ttl_seconds":0,`, `"b":86400}`, `"expires_at":1780000000,`, `"port":8642}`} {
		if !strings.Contains(string(c), s) {
			t.Errorf("normalized payload lacks %s: %s", s, c)
		}
	}
	// Members the app does not read as integers keep their floats.
	if !strings.Contains(string(c), `"extra":1.5`) || !strings.Contains(string(c), `"other":2.5`) {
		t.Errorf("a member the app does not read was changed: %s", c)
	}

	for name, mut := range map[string]func(m map[string]any){
		"fraction":       func(m map[string]any) { m["relay"].(map[string]any)["ttl_seconds"] = 1.5 },
		"grant fraction": func(m map[string]any) { m["relay"].(map[string]any)["grants"].(map[string]any)["a"] = 0.25 },
		"int32 overflow": func(m map[string]any) { m["port"] = 4294967296.0 },
		"int64 overflow": func(m map[string]any) { m["relay"].(map[string]any)["ttl_seconds"] = 1e19 },
		"big Int":        func(m map[string]any) { m["endpoints"].([]any)[0].(map[string]any)["priority"] = Int("3000000000") },
	} {
		m := base()
		mut(m)
		if _, _, err := NormalizeAppIntegers(m); !errors.Is(err, ErrNotAppInteger) {
			t.Errorf("%s: %v, want ErrNotAppInteger", name, err)
		}
	}

	// Already integers: nothing to do.
	if _, changed, err := NormalizeAppIntegers(norm); err != nil || len(changed) != 0 {
		t.Errorf("second pass: %v %v", changed, err)
	}
}

func TestResignedRefusesAShortKey(t *testing.T) {
	resp := mintResponseFor(t, []byte(pythonPayload))
	norm, _, _ := NormalizeAppIntegers(resp.Payload.Tree())
	if _, err := resp.Resigned([]byte("short"), norm); err == nil {
		t.Fatal("re-signed with a 5-byte key")
	}
}

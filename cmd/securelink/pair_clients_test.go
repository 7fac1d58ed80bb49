package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hermes-securelink/securelink/internal/pairing"
)

// floatRelay answers POST /pairing/mint as the stock Hermes Relay does with
// ttl_seconds and grants: it turns them into floats (plugin/relay/server.py
// _parse_pairing_metadata: float(raw_ttl), float(value)) and signs the
// payload with its QR secret (plugin/relay/qr_sign.py sign_payload).
func floatRelay(t *testing.T, secret []byte) *httptest.Server {
	return mintRelay(t, secret, "FLT123", func(m map[string]any) map[string]any {
		asFloat := func(v any) float64 {
			n, _ := v.(pairing.Int).Int64()
			return float64(n)
		}
		relay := map[string]any{"url": "ws://127.0.0.1:8767", "code": "FLT123"}
		if v, ok := m["ttl_seconds"]; ok {
			relay["ttl_seconds"] = asFloat(v)
		}
		if g, ok := m["grants"].(map[string]any); ok {
			fg := map[string]any{}
			for k, v := range g {
				fg[k] = asFloat(v)
			}
			relay["grants"] = fg
		}
		return map[string]any{"hermes": pairing.IntOf(3), "host": "127.0.0.1", "port": pairing.IntOf(8642),
			"key": "api-key-secret", "tls": false, "relay": relay, "endpoints": m["endpoints"]}
	})
}

var floatInQR = regexp.MustCompile(`"(ttl_seconds|terminal|bridge)":[0-9]+\.0`)

// pairing.md "Whole numbers": with the QR secret readable, pair turns the
// Relay's floats into integers, re-signs, and the QR verifies.
func TestPairResignsTheRelaysFloatsAsIntegers(t *testing.T) {
	dir := t.TempDir()
	secret := bytes.Repeat([]byte{9}, 32)
	home := newHermesHome(t, dir, secret)
	cfgPath := writeConfig(t, dir, floatRelay(t, secret).URL)
	d := startDaemon(t, cfgPath)
	so, se, err := runPairCLI(t, home, "200", "--config", cfgPath, "--json", "--ttl", "30d", "--grants", "terminal=7d,bridge=1d")
	if err != nil {
		t.Fatalf("pair: %v\n%s", err, se)
	}
	var out struct {
		Payload   json.RawMessage `json:"payload"`
		InviteURL string          `json:"invite_url"`
	}
	if err := json.Unmarshal([]byte(so), &out); err != nil {
		t.Fatalf("%v\n%s", err, so)
	}
	if floatInQR.Match(out.Payload) || !bytes.Contains(out.Payload, []byte(`"ttl_seconds":2592000`)) ||
		!bytes.Contains(out.Payload, []byte(`"terminal":604800`)) || !bytes.Contains(out.Payload, []byte(`"bridge":86400`)) {
		t.Fatalf("payload still has floats or lost the seconds: %s", out.Payload)
	}
	p, err := pairing.ParsePayload(out.Payload)
	if err != nil {
		t.Fatal(err)
	}
	if err := pairing.Verify(secret, p.Tree()); err != nil {
		t.Fatalf("the re-signed QR does not verify with the Relay's secret: %v", err)
	}
	if _, changed, err := pairing.NormalizeAppIntegers(p.Tree()); err != nil || len(changed) != 0 {
		t.Fatalf("the QR still has numbers the app cannot read as integers: %v %v", changed, err)
	}
	if !bytes.Contains(out.Payload, []byte(d.pin)) {
		t.Fatal("the re-signed QR lost the pin")
	}
	raw, err := pairing.ParseInviteURL(out.InviteURL)
	if err != nil || !bytes.Equal(raw, out.Payload) {
		t.Fatalf("the invite URL does not carry the re-signed payload: %v", err)
	}
	if !strings.Contains(se, "re-signed with integers") {
		t.Errorf("stderr does not say the payload was re-signed: %s", se)
	}

	// The text output and the PNG carry the same re-signed payload.
	png := filepath.Join(dir, "qr.png")
	so, se, err = runPairCLI(t, home, "200", "--config", cfgPath, "--ttl", "30d", "--png", png)
	if err != nil || floatInQR.MatchString(so) {
		t.Fatalf("text pair: %v\n%s\n%s", err, so, se)
	}
	if _, err := os.Stat(png); err != nil {
		t.Fatal(err)
	}
}

// Without the QR secret pair cannot re-sign: it fails, prints no QR, and
// says how to get one the app accepts.
func TestPairFailsOnFloatsWithoutTheQRSecret(t *testing.T) {
	dir := t.TempDir()
	secret := bytes.Repeat([]byte{9}, 32)
	cfgPath := writeConfig(t, dir, floatRelay(t, secret).URL)
	startDaemon(t, cfgPath)
	so, se, err := runPairCLI(t, t.TempDir(), "200", "--config", cfgPath, "--ttl", "30d")
	if err == nil {
		t.Fatalf("pair printed a QR the Android app rejects:\n%s", so)
	}
	if strings.Contains(so, "hermes-relay://") || strings.ContainsAny(so, "▀▄█") {
		t.Fatalf("a QR or invite was printed:\n%s", so)
	}
	for _, want := range []string{"relay.ttl_seconds", "Android app rejects", "run pair as root with the Hermes user's HERMES_HOME", "drop --ttl/--grants"} {
		if !strings.Contains(se, want) {
			t.Errorf("stderr lacks %q:\n%s", want, se)
		}
	}
	// Without --ttl/--grants the same Relay's QR has no floats and pairs.
	if so, se, err := runPairCLI(t, t.TempDir(), "200", "--config", cfgPath, "--json"); err != nil {
		t.Fatalf("pair without --ttl: %v\n%s\n%s", err, so, se)
	}
}

// pairing.md "Names, not addresses", "Android needs ACME mode", "Re-pair on
// the desktop client": what pair tells the operator per client.
func TestPairTellsTheOperatorPerClient(t *testing.T) {
	cfgPath, d, hh := setupPair(t, nil)
	so, se, err := runPairCLI(t, hh, "200", "--config", cfgPath)
	if err != nil {
		t.Fatalf("pair: %v\n%s", err, se)
	}
	for _, want := range []string{
		"desktop: the authority 127.0.0.1 is an IP address", "advertise: <DNS name>",
		"android: the identity is self-signed", "tls.mode: acme",
		"hermes-relay hosts forget wss://" + d.addr + "/relay/ws --yes",
	} {
		if !strings.Contains(so, want) {
			t.Errorf("pair output lacks %q:\n%s", want, so)
		}
	}
	if strings.Contains(so, "Reach route") || strings.Contains(so, "IPv6") {
		t.Errorf("pair mentions Reach or IPv6 without either:\n%s", so)
	}
	if !strings.ContainsAny(so, "▀▄█") {
		t.Errorf("the QR is still printed with notes:\n%s", so)
	}

	so, se, err = runPairCLI(t, hh, "200", "--config", cfgPath, "--json")
	if err != nil {
		t.Fatalf("pair --json: %v\n%s", err, se)
	}
	var out struct {
		Notes []pairing.ClientNote `json:"client_notes"`
	}
	if err := json.Unmarshal([]byte(so), &out); err != nil || len(out.Notes) != 2 ||
		out.Notes[0].Client != pairing.ClientDesktop || out.Notes[1].Client != pairing.ClientAndroid || out.Notes[1].Fix == "" {
		t.Fatalf("client_notes: %v %+v", err, out.Notes)
	}
}

// With Reach in the QR, pair says it serves the desktop client only.
func TestPairWithReachSaysDesktopOnly(t *testing.T) {
	rs := startReachStack(t)
	secret := bytes.Repeat([]byte{5}, 32)
	home := newHermesHome(t, rs.dir, secret)
	so, se, err := runPairCLI(t, home, "200", "--config", rs.cfgPath, "--relay", fakeMintRelay(t, secret, nil).URL)
	if err != nil {
		t.Fatalf("pair: %v\n%s", err, se)
	}
	if !strings.Contains(so, "android: the QR includes a Reach route: it serves the desktop client, not the Android app") || !strings.Contains(so, "--lan") {
		t.Fatalf("pair output:\n%s", so)
	}
}

// pin --rotate tells desktop users to forget the host before re-pairing.
func TestPinRotateTellsDesktopToForget(t *testing.T) {
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, "http://127.0.0.1:1")
	configuredPin(t, cfgPath)
	_, se, err := runCLI(t, "pin", "--rotate", "--yes", "--config", cfgPath)
	if err != nil {
		t.Fatalf("rotate: %v %s", err, se)
	}
	if !regexp.MustCompile(`hermes-relay hosts forget wss://127\.0\.0\.1:[0-9]+/relay/ws --yes`).MatchString(se) ||
		!strings.Contains(se, "before scanning the new QR") || !strings.Contains(se, "desktop: the authority 127.0.0.1 is an IP address") {
		t.Fatalf("rotate output:\n%s", se)
	}
}

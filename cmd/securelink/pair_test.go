package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/makiuchi-d/gozxing"
	"github.com/makiuchi-d/gozxing/qrcode"

	"github.com/hermes-securelink/securelink/internal/pairing"
)

// fakeMintRelay implements POST /pairing/mint the way the Hermes Relay does:
// it builds the payload around the endpoints it is given, signs it with the
// QR secret, and answers the code, the payload and the invite URL. mutate
// lets a test play a Relay that alters what it signs.
func fakeMintRelay(t *testing.T, secret []byte, mutate func(eps []any) []any) *httptest.Server {
	return mintRelay(t, secret, "ABC123", func(m map[string]any) map[string]any {
		eps, _ := m["endpoints"].([]any)
		if mutate != nil {
			eps = mutate(eps)
		}
		relay := map[string]any{"url": "ws://127.0.0.1:8767", "code": "ABC123"}
		if ttl, ok := m["ttl_seconds"]; ok {
			relay["ttl_seconds"] = ttl
		}
		return map[string]any{
			"hermes": pairing.IntOf(3), "host": "127.0.0.1", "port": pairing.IntOf(8642),
			"key": "api-key-secret", "tls": false, "relay": relay, "endpoints": eps,
		}
	})
}

// mintRelay is the part every fake Relay shares: GET /health, and POST
// /pairing/mint parsed, handed to build for the payload, signed with secret
// and answered with code, the QR payload and its invite URL.
func mintRelay(t *testing.T, secret []byte, code string, build func(req map[string]any) map[string]any) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			w.Write([]byte(`{"status":"ok"}`))
			return
		}
		if r.Method != http.MethodPost || r.URL.Path != "/pairing/mint" {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		req, err := pairing.Parse(body)
		if err != nil {
			http.Error(w, "bad json", 400)
			return
		}
		payload := build(req.(map[string]any))
		sig, err := pairing.Sign(secret, payload)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		payload["sig"] = sig
		qr, _ := pairing.Canonical(payload)
		exp := time.Now().Add(10 * time.Minute).Unix()
		resp, _ := json.Marshal(map[string]any{"ok": true, "code": code, "qr_payload": string(qr),
			"pairing_url": pairing.InviteURL(qr), "expires_at": exp})
		w.Header().Set("Content-Type", "application/json")
		w.Write(resp)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func setupPair(t *testing.T, mutate func([]any) []any) (cfgPath string, d *daemonProc, hermesHome string) {
	t.Helper()
	dir := t.TempDir()
	secret := bytes.Repeat([]byte{7}, 32)
	hermesHome = newHermesHome(t, dir, secret)
	relaySrv := fakeMintRelay(t, secret, mutate)
	cfgPath = writeConfig(t, dir, relaySrv.URL)
	d = startDaemon(t, cfgPath)
	return cfgPath, d, hermesHome
}

func runPairCLI(t *testing.T, hermesHome, columns string, args ...string) (string, string, error) {
	t.Helper()
	return runCLIEnv(t, []string{"HERMES_HOME=" + hermesHome, "COLUMNS=" + columns}, append([]string{"pair"}, args...)...)
}

func TestPairJSONCarriesTheServedPin(t *testing.T) {
	cfgPath, d, hh := setupPair(t, nil)
	so, se, err := runPairCLI(t, hh, "200", "--config", cfgPath, "--json", "--lan", "192.168.1.20")
	if err != nil {
		t.Fatalf("pair --json: %v\n%s", err, se)
	}
	var out struct {
		Payload struct {
			Endpoints []map[string]any `json:"endpoints"`
			Sig       string           `json:"sig"`
		} `json:"payload"`
		InviteURL     string   `json:"invite_url"`
		CodeExpiresAt int64    `json:"code_expires_at"`
		Routes        []string `json:"routes"`
	}
	if err := json.Unmarshal([]byte(so), &out); err != nil {
		t.Fatalf("json: %v\n%s", err, so)
	}
	if len(out.Payload.Endpoints) != 2 || out.Payload.Endpoints[0]["role"] != "plugin_proxy" || out.Payload.Endpoints[1]["role"] != "lan" {
		t.Fatalf("endpoints: %+v", out.Payload.Endpoints)
	}
	proxy := out.Payload.Endpoints[0]["proxy"].(map[string]any)
	if proxy["pin_sha256"] != d.pin {
		t.Fatalf("QR pin %v != served pin %s", proxy["pin_sha256"], d.pin)
	}
	if out.Payload.Sig == "" || out.CodeExpiresAt < time.Now().Unix() || !strings.HasPrefix(out.InviteURL, "hermes-relay://pair?payload=") {
		t.Fatalf("unexpected output: %+v", out)
	}
	raw, err := pairing.ParseInviteURL(out.InviteURL)
	if err != nil || !bytes.Contains(raw, []byte(d.pin)) {
		t.Fatalf("invite URL does not carry the pin: %v", err)
	}
}

func TestPairTerminalAndPNG(t *testing.T) {
	cfgPath, d, hh := setupPair(t, nil)
	pngPath := filepath.Join(t.TempDir(), "qr.png")
	so, se, err := runPairCLI(t, hh, "200", "--config", cfgPath, "--png", pngPath)
	if err != nil {
		t.Fatalf("pair: %v\n%s", err, se)
	}
	if !strings.Contains(so, "hermes-relay://pair?payload=") || !strings.ContainsAny(so, "▀▄█") || !strings.Contains(so, d.pin) {
		t.Fatalf("terminal output lacks invite URL, QR or pin:\n%s", so)
	}
	f, err := os.Open(pngPath)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	bmp, _ := gozxing.NewBinaryBitmapFromImage(img)
	res, err := qrcode.NewQRCodeReader().Decode(bmp, map[gozxing.DecodeHintType]any{gozxing.DecodeHintType_PURE_BARCODE: true})
	if err != nil {
		t.Fatalf("decode PNG: %v", err)
	}
	if !strings.Contains(res.GetText(), d.pin) || !strings.Contains(res.GetText(), `"sig"`) {
		t.Fatalf("QR text lacks pin or sig: %s", res.GetText())
	}

	// At 80 columns the QR does not fit: say so, point to --png and the URL.
	so, se, err = runPairCLI(t, hh, "80", "--config", cfgPath)
	if err != nil {
		t.Fatalf("pair at 80 columns: %v\n%s", err, se)
	}
	if strings.ContainsAny(so, "▀▄") || !strings.Contains(so, "--png") || !strings.Contains(so, "hermes-relay://pair?payload=") {
		t.Fatalf("80 columns output:\n%s", so)
	}
}

func TestPairRefusesAlteredOrForeignCandidates(t *testing.T) {
	cases := map[string]func([]any) []any{
		"altered pin": func(eps []any) []any {
			ep := eps[0].(map[string]any)
			ep["proxy"].(map[string]any)["pin_sha256"] = "sha256/" + strings.Repeat("A", 43) + "="
			return eps
		},
		"foreign plugin_proxy": func(eps []any) []any {
			foreign := map[string]any{}
			for k, v := range eps[0].(map[string]any) {
				foreign[k] = v
			}
			foreign["priority"] = pairing.IntOf(int64(len(eps)))
			return append(eps, foreign)
		},
		"dropped": func(eps []any) []any { return nil },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			cfgPath, _, hh := setupPair(t, mutate)
			so, se, err := runPairCLI(t, hh, "200", "--config", cfgPath)
			if err == nil {
				t.Fatalf("pair accepted a Relay that %s:\n%s", name, so)
			}
			if strings.ContainsAny(so, "▀▄█") || strings.Contains(so, "hermes-relay://") {
				t.Fatalf("a QR or invite was printed despite the failure:\n%s", so)
			}
			if !strings.Contains(se, "refusing the Relay's payload") {
				t.Fatalf("stderr: %s", se)
			}
		})
	}
}

func TestPairFailsClosedWithoutRelayOrDaemon(t *testing.T) {
	dir := t.TempDir()
	// No daemon.
	cfgPath := writeConfig(t, dir, "http://127.0.0.1:1")
	_, se, err := runPairCLI(t, dir, "200", "--config", cfgPath)
	if err == nil || !strings.Contains(se, "no securelink daemon") {
		t.Fatalf("no daemon: %v %s", err, se)
	}
	// Daemon up, Relay down.
	startDaemon(t, cfgPath)
	so, se, err := runPairCLI(t, dir, "200", "--config", cfgPath)
	if err == nil || !strings.Contains(se, "Relay") || strings.Contains(so, "hermes-relay://") {
		t.Fatalf("relay down: %v\n%s\n%s", err, so, se)
	}
}

func TestPairOversizeFailsWithSuggestion(t *testing.T) {
	// A Relay that pads the payload past the QR limit: the rest prints, the
	// command fails and says what to do.
	cfgPath, _, hh := setupPair(t, func(eps []any) []any {
		return append(eps, map[string]any{"role": "lan", "priority": pairing.IntOf(int64(len(eps))),
			"api":   map[string]any{"host": "192.168.1.2", "port": pairing.IntOf(8642), "tls": false},
			"relay": map[string]any{"url": "ws://192.168.1.2:8767/" + strings.Repeat("x", 3000), "transport_hint": "ws"}})
	})
	so, se, err := runPairCLI(t, hh, "200", "--config", cfgPath)
	if err == nil {
		t.Fatalf("oversize payload accepted:\n%s", so)
	}
	if !strings.Contains(so, "hermes-relay://pair?payload=") || strings.ContainsAny(so, "▀▄█") || !strings.Contains(se, "--no-reach") {
		t.Fatalf("oversize: stdout:\n%s\nstderr:\n%s", so, se)
	}
}

// pairing.md step 4: without a readable QR secret the signature cannot be
// checked; pair warns and still prints the QR (the Relay signed it).
func TestPairWarnsWhenQRSecretUnreadable(t *testing.T) {
	cfgPath, d, _ := setupPair(t, nil)
	so, se, err := runPairCLI(t, t.TempDir(), "200", "--config", cfgPath, "--json")
	if err != nil {
		t.Fatalf("pair without a readable QR secret: %v\n%s", err, se)
	}
	if !strings.Contains(se, "warning: cannot read the QR secret") || !strings.Contains(so, d.pin) {
		t.Fatalf("want a warning and the payload; stdout %s\nstderr %s", so, se)
	}
}

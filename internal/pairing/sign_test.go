package pairing

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// pythonPayload was produced by the Relay's code path in Python 3.11:
// json.dumps(payload, separators=(",", ":")) after
// payload["sig"] = base64(HMAC-SHA256(testQRKey, canonical)); the canonical
// bytes and the sig below are Python's.
const (
	pythonPayload   = "{\"hermes\":3,\"host\":\"192.0.2.10\",\"port\":8642,\"key\":\"api-key-\\u00e9/<&>\",\"tls\":false,\"relay\":{\"url\":\"ws://192.0.2.10:8767\",\"code\":\"ABC123\",\"ttl_seconds\":2592000.0,\"grants\":{\"terminal\":604800.0,\"bridge\":86400.0},\"transport_hint\":\"ws\"},\"endpoints\":[{\"role\":\"lan\",\"priority\":0,\"api\":{\"host\":\"192.0.2.10\",\"port\":8642,\"tls\":false},\"relay\":{\"url\":\"ws://192.0.2.10:8767\",\"transport_hint\":\"ws\"}},{\"role\":\"outbound_broker\",\"priority\":1,\"broker\":{\"expires_at\":1780000000,\"protocol_version\":1}}],\"dashboard_url\":\"https://dash.example/x?a=1&b=<2>\",\"sig\":\"x305s47SHW4bZ8sDuMnHFeEZh2jbZwcr8Pirg6/y6x0=\"}"
	pythonCanonical = `{"dashboard_url":"https://dash.example/x?a=1&b=<2>","endpoints":[{"api":{"host":"192.0.2.10","port":8642,"tls":false},"priority":0,"relay":{"transport_hint":"ws","url":"ws://192.0.2.10:8767"},"role":"lan"},{"broker":{"expires_at":1780000000,"protocol_version":1},"priority":1,"role":"outbound_broker"}],"hermes":3,"host":"192.0.2.10","key":"api-key-\u00e9/<&>","port":8642,"relay":{"code":"ABC123","grants":{"bridge":86400.0,"terminal":604800.0},"transport_hint":"ws","ttl_seconds":2592000.0,"url":"ws://192.0.2.10:8767"},"tls":false}`
	pythonSig       = "x305s47SHW4bZ8sDuMnHFeEZh2jbZwcr8Pirg6/y6x0="
)

func TestSignMatchesPython(t *testing.T) {
	p, err := ParsePayload([]byte(pythonPayload))
	if err != nil {
		t.Fatal(err)
	}
	in, err := SigningInput(p.Tree())
	if err != nil {
		t.Fatal(err)
	}
	if string(in) != pythonCanonical {
		t.Fatalf("signing input\n got %s\nwant %s", in, pythonCanonical)
	}
	sig, err := Sign(testQRKey, p.Tree())
	if err != nil {
		t.Fatal(err)
	}
	if sig != pythonSig || p.Sig != pythonSig {
		t.Fatalf("Sign = %s, payload sig %s, want %s", sig, p.Sig, pythonSig)
	}
	if err := Verify(testQRKey, p.Tree()); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

func TestVerifyRejects(t *testing.T) {
	tamper := func(old, new string) map[string]any {
		t.Helper()
		s := strings.Replace(pythonPayload, old, new, 1)
		if s == pythonPayload && old != new {
			t.Fatalf("tamper %q: no change", old)
		}
		m, err := ParseObject([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for name, tc := range map[string]struct {
		tree map[string]any
		key  []byte
		want error
	}{
		"changed host":       {tamper(`"host":"192.0.2.10"`, `"host":"192.0.2.11"`), testQRKey, ErrBadSignature},
		"float for int":      {tamper(`"port":8642`, `"port":8642.0`), testQRKey, ErrBadSignature},
		"int for float":      {tamper(`"ttl_seconds":2592000.0`, `"ttl_seconds":2592000`), testQRKey, ErrBadSignature},
		"reordered":          {tamper(`"priority":0`, `"priority":1`), testQRKey, ErrBadSignature},
		"other key":          {tamper(`"tls":false`, `"tls":false`), []byte("fedcba9876543210fedcba9876543210"), ErrBadSignature},
		"no sig":             {tamper(`,"sig":"x305s47SHW4bZ8sDuMnHFeEZh2jbZwcr8Pirg6/y6x0="`, ``), testQRKey, ErrUnsigned},
		"sig not base64":     {tamper(pythonSig, "!!!!"), testQRKey, ErrBadSignature},
		"sig unpadded":       {tamper(pythonSig, strings.TrimSuffix(pythonSig, "=")), testQRKey, ErrBadSignature},
		"sig url alphabet":   {tamper(pythonSig, strings.ReplaceAll(pythonSig, "/", "_")), testQRKey, ErrBadSignature},
		"sig truncated hmac": {tamper(pythonSig, "AAAA"), testQRKey, ErrBadSignature},
		"sig not a string":   {tamper(`"`+pythonSig+`"`, "1"), testQRKey, ErrBadSignature},
	} {
		if err := Verify(tc.key, tc.tree); !errors.Is(err, tc.want) {
			t.Errorf("%s: Verify = %v, want %v", name, err, tc.want)
		}
	}
	m, _ := ParseObject([]byte(pythonPayload))
	if err := Verify([]byte("short"), m); err == nil {
		t.Error("Verify accepted a key shorter than 16 bytes")
	}
	if _, err := Sign([]byte("short"), m); err == nil {
		t.Error("Sign accepted a key shorter than 16 bytes")
	}
}

func TestSignIgnoresExistingSig(t *testing.T) {
	m, _ := ParseObject([]byte(pythonPayload))
	m["sig"] = "something else"
	sig, err := Sign(testQRKey, m)
	if err != nil || sig != pythonSig {
		t.Fatalf("Sign with a stale sig = %q, %v", sig, err)
	}
}

func TestLoadQRSecret(t *testing.T) {
	dir := t.TempDir()
	secret := []byte("0123456789abcdef0123456789abcdef")
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadQRSecret(good)
	if err != nil || string(got) != string(secret) {
		t.Fatalf("LoadQRSecret = %q, %v", got, err)
	}

	loose := filepath.Join(dir, "loose")
	if err := os.WriteFile(loose, secret, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = LoadQRSecret(loose)
	var lm *LooseModeError
	if !errors.As(err, &lm) || string(got) != string(secret) || lm.Mode.Perm() != 0o644 {
		t.Fatalf("loose mode: got %q, %v; want the secret and a *LooseModeError", got, err)
	}
	if strings.Contains(err.Error(), string(secret)) {
		t.Fatal("the warning reveals the secret")
	}

	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("fifteen bytes!!"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := LoadQRSecret(short); err == nil || got != nil {
		t.Fatalf("15-byte secret: %q, %v", got, err)
	}
	sixteen := filepath.Join(dir, "sixteen")
	if err := os.WriteFile(sixteen, []byte("sixteen bytes!!!"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadQRSecret(sixteen); err != nil {
		t.Fatalf("16-byte secret: %v", err)
	}

	huge := filepath.Join(dir, "huge")
	if err := os.WriteFile(huge, make([]byte, maxQRSecretBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadQRSecret(huge); err == nil {
		t.Fatal("accepted an oversized secret file")
	}

	if _, err := LoadQRSecret(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v, want fs.ErrNotExist", err)
	}
	if _, err := LoadQRSecret(dir); err == nil {
		t.Fatal("accepted a directory")
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadQRSecret(fifo); err == nil {
		t.Fatal("accepted a FIFO")
	}
}

func TestDefaultQRSecretPath(t *testing.T) {
	t.Setenv("HERMES_HOME", "/srv/hermes")
	if p, err := DefaultQRSecretPath(); err != nil || p != "/srv/hermes/hermes-relay-qr-secret" {
		t.Fatalf("with HERMES_HOME: %q, %v", p, err)
	}
	t.Setenv("HERMES_HOME", "")
	t.Setenv("HOME", "/home/op")
	if p, err := DefaultQRSecretPath(); err != nil || p != "/home/op/.hermes/hermes-relay-qr-secret" {
		t.Fatalf("without HERMES_HOME: %q, %v", p, err)
	}
}

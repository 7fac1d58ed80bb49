package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
)

// mustBeWireError fails unless err is an *Error with a v1 code: parsers
// return nothing else, so the broker can always answer with a code.
func mustBeWireError(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || !e.Code.Known() {
		t.Fatalf("error %v is not a wire error", err)
	}
	return e
}

func FuzzParseFrame(f *testing.F) {
	f.Add(mustHex("0102000102030405060708090a0b0c0d0e0f6869"))
	f.Add(mustHex("0104f0e0d0c0b0a090807060504030201000"))
	f.Add(append(header(1, FlagWindow), 0, 0, 1, 0))
	f.Add(append(header(1, FlagWindow), 0x7f, 0xff, 0xff, 0xff))
	f.Add(append(header(1, FlagWindow), 0x80, 0, 0, 0))
	f.Add(append(header(1, FlagWindow), 0, 0, 0, 0))
	f.Add(append(header(1, FlagWindow), 0, 0, 1))
	f.Add(header(1, FlagData))
	f.Add(append(header(1, FlagClose), 1))
	f.Add(append(header(2, FlagData), 1))
	f.Add(append(header(1, 6), 1))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, d := range []Dialect{{}, {Credit: true}} {
			fr, err := d.ParseFrame(b)
			if err != nil {
				if e := mustBeWireError(t, err); !e.Violation {
					t.Fatalf("frame error is not a violation: %v", err)
				}
				continue
			}
			if fr.Flags == FlagWindow && !d.Credit {
				t.Fatal("WINDOW accepted in plain v1")
			}
			if fr.Flags == FlagWindow {
				if inc := fr.Increment(); len(fr.Payload) != 4 || inc == 0 || inc > MaxWindow {
					t.Fatalf("WINDOW accepted with a %d-byte payload, increment %d", len(fr.Payload), inc)
				}
			}
			enc, err := AppendFrame(nil, fr)
			if len(b) > MaxHostFrameOut {
				if err == nil {
					t.Fatalf("encoded a %d-byte frame", len(b))
				}
				continue
			}
			if err != nil || !bytes.Equal(enc, b) {
				t.Fatalf("round trip: %x -> %x (%v)", b, enc, err)
			}
		}
	})
}

func FuzzParseRegister(f *testing.F) {
	f.Add(kv(registerPairs()...))
	f.Add(kv(replaced(registerPairs(), "protocol_version", "true")...))
	f.Add(kv(replaced(registerPairs(), "protocol_version", "1.0")...))
	f.Add(kv(append(registerPairs(), "x", "1")...))
	f.Add(kv(replaced(registerPairs(), "token", `"\u00e9\"\\`+strings.Repeat("z", 40)+`"`)...))
	f.Add(kv(replaced(registerPairs(), "host_id", `"AAAAAAAAAAAAAAAAAAAAAB"`)...))
	f.Add([]byte(`{"type": "register", "type": "register"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRegister(b)
		if err != nil {
			mustBeWireError(t, err)
			return
		}
		enc, err := Marshal(r)
		if err != nil {
			t.Fatalf("accepted register does not encode: %v", err)
		}
		back, err := ParseRegister(enc)
		if err != nil || back != r {
			t.Fatalf("re-parse of %s: %+v %v", enc, back, err)
		}
	})
}

func FuzzParseHostControl(f *testing.F) {
	for _, typ := range []string{TypePublishBootstrap, TypePublishRoute, TypeRevoke} {
		f.Add(kv(hostControlPairs(typ)...))
		f.Add(kv(append(hostControlPairs(typ), "x", "1")...))
		f.Add(kv(replaced(hostControlPairs(typ), "protocol_version", "2")...))
	}
	f.Add(kv(replaced(hostControlPairs(TypePublishRoute), "expires_at", "1e400")...))
	f.Add(kv(replaced(hostControlPairs(TypePublishBootstrap), "expires_at", "-1.5")...))
	f.Add([]byte(`{"type":"extensions","protocol_version":1,"extensions":["credit"]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseHostControl(b)
		if err != nil {
			mustBeWireError(t, err)
			return
		}
		enc, err := Marshal(m)
		if err != nil {
			t.Fatalf("accepted %T does not encode: %v", m, err)
		}
		back, err := ParseHostControl(enc)
		if err != nil || back != m {
			t.Fatalf("re-parse of %s: %+v %v", enc, back, err)
		}
	})
}

func FuzzParseBrokerMessage(f *testing.F) {
	d, _ := ParseDigest(abcDigest)
	for _, m := range []Message{Registered{}, Registered{Extensions: []string{"credit"}},
		Published{KindBootstrap, "p"}, Published{KindRoute, "r"}, Revoked{"r"},
		Open{revID, seqID}, Matched{revID}, ErrorMsg{CodeHostBusy}, PublishRoute{"x", d, 1, d}} {
		b, _ := Marshal(m)
		f.Add(b)
	}
	f.Add([]byte(`{"type": "error", "protocol_version": 1, "code": "rate_limited"}`))
	f.Add([]byte(`{"type":"matched","protocol_version":true,"stream_id":"` + revIDText + `"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseBrokerMessage(b)
		if err != nil {
			if e := mustBeWireError(t, err); !e.Violation {
				t.Fatalf("broker message error is not a violation: %v", err)
			}
			return
		}
		enc, err := Marshal(m)
		if err != nil {
			if em, ok := m.(ErrorMsg); ok && !em.Code.Known() {
				return // accepted on receive, never sent by us
			}
			t.Fatalf("accepted %T does not encode: %v", m, err)
		}
		back, err := ParseBrokerMessage(enc)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", enc, err)
		}
		again, _ := Marshal(back)
		if !bytes.Equal(again, enc) {
			t.Fatalf("not idempotent: %s vs %s", enc, again)
		}
	})
}

func FuzzParseID(f *testing.F) {
	for _, s := range []string{seqIDText, revIDText, "AAAAAAAAAAAAAAAAAAAAAB", seqIDText + "==",
		"+AECAwQFBgcICQoLDA0ODw", "AAECAwQFBgcICQoLDA0OD\n", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if err != nil {
			mustBeWireError(t, err)
			return
		}
		if id.String() != s {
			t.Fatalf("ParseID(%q) accepted a non-canonical form of %q", s, id.String())
		}
	})
}

func FuzzParseDigest(f *testing.F) {
	for _, s := range []string{abcDigest, nullDigest, abcDigest[:42] + "1", abcDigest + "=", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDigest(s)
		if err != nil {
			mustBeWireError(t, err)
			return
		}
		if d.String() != s {
			t.Fatalf("ParseDigest(%q) accepted a non-canonical form", s)
		}
	})
}

func FuzzParseExpiresAt(f *testing.F) {
	for _, s := range []string{"1780000000", "1780000000.5", "-1.5", "1e400", "99999999999999999999",
		"true", `"1"`, "null", "1.", "-0", "0.0000001e-5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseExpiresAt(json.RawMessage(s))
		trimmed := strings.TrimSpace(s)
		isNumber := json.Valid([]byte(trimmed)) && trimmed != "" &&
			strings.IndexByte("-0123456789", trimmed[0]) >= 0
		if err != nil {
			mustBeWireError(t, err)
			if isNumber {
				t.Fatalf("ParseExpiresAt(%q) refused a JSON number: %v", s, err)
			}
			return
		}
		if !isNumber {
			t.Fatalf("ParseExpiresAt(%q) = %d for a non-number", s, v)
		}
		// Floor: v <= x < v+1 wherever float64 can tell.
		x, rangeErr := strconv.ParseFloat(trimmed, 64)
		if rangeErr == nil && x > -1e15 && x < 1e15 && (float64(v) > x || float64(v)+1 <= x) {
			t.Fatalf("ParseExpiresAt(%q) = %d is not the floor of %v", s, v, x)
		}
	})
}

func FuzzParseBrokerURL(f *testing.F) {
	for _, s := range []string{"wss://broker.example/v1/connect", "wss://a:1/v1/connect",
		"wss://u@a/v1/connect", "wss://a/v1/connect?x", "ws://a/v1/connect", "wss://[::1]:9/v1/connect"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseBrokerURL(s)
		if err != nil {
			return
		}
		if u.Scheme != "wss" || u.User != nil || u.RawQuery != "" || u.Fragment != "" ||
			u.EscapedPath() != ConnectPath || u.Hostname() == "" {
			t.Fatalf("ParseBrokerURL(%q) accepted %#v", s, u)
		}
	})
}

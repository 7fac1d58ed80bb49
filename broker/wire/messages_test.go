package wire

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// Fixed values for golden bytes. revID is f0 e0 … 10 00; its text was
// computed outside Go like seqIDText.
var revID = ID{0xf0, 0xe0, 0xd0, 0xc0, 0xb0, 0xa0, 0x90, 0x80, 0x70, 0x60, 0x50, 0x40, 0x30, 0x20, 0x10, 0x00}

const (
	revIDText  = "8ODQwLCgkIBwYFBAMCAQAA"
	abcDigest  = "ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0" // token_sha256("abc")
	nullDigest = "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU" // token_sha256("")
	testToken  = "tok-0123456789abcdefghijklmnopqrstuvwxyzABCD"
)

func mustDigest(t testing.TB, s string) Digest {
	t.Helper()
	d, err := ParseDigest(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// kv builds a JSON object from key / raw-value pairs in the given order.
func kv(pairs ...string) []byte {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i < len(pairs); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + pairs[i] + `":` + pairs[i+1])
	}
	b.WriteByte('}')
	return []byte(b.String())
}

// without removes one key; with appends one.
func without(pairs []string, key string) []string {
	var out []string
	for i := 0; i < len(pairs); i += 2 {
		if pairs[i] != key {
			out = append(out, pairs[i], pairs[i+1])
		}
	}
	return out
}

func replaced(pairs []string, key, raw string) []string {
	out := append([]string(nil), pairs...)
	for i := 0; i < len(out); i += 2 {
		if out[i] == key {
			out[i+1] = raw
		}
	}
	return out
}

func registerPairs() []string {
	return []string{"type", `"register"`, "protocol_version", "1", "role", `"host"`,
		"host_id", `"` + seqIDText + `"`, "connection_id", `"` + revIDText + `"`,
		"credential_kind", `"host"`, "token", `"` + testToken + `"`}
}

func TestGoldenMessages(t *testing.T) {
	d := mustDigest(t, abcDigest)
	n := mustDigest(t, nullDigest)
	type parser func([]byte) (Message, error)
	reg := func(b []byte) (Message, error) { return ParseRegister(b) }
	cases := []struct {
		name  string
		msg   Message
		want  string
		parse parser
	}{
		{"register host", Register{RoleHost, seqID, revID, KindHost, testToken},
			`{"type":"register","protocol_version":1,"role":"host","host_id":"AAECAwQFBgcICQoLDA0ODw","connection_id":"8ODQwLCgkIBwYFBAMCAQAA","credential_kind":"host","token":"` + testToken + `"}`, reg},
		{"register client route", Register{RoleClient, seqID, revID, KindRoute, testToken},
			`{"type":"register","protocol_version":1,"role":"client","host_id":"AAECAwQFBgcICQoLDA0ODw","connection_id":"8ODQwLCgkIBwYFBAMCAQAA","credential_kind":"route","token":"` + testToken + `"}`, reg},
		{"register client bootstrap", Register{RoleClient, seqID, revID, KindBootstrap, testToken},
			`{"type":"register","protocol_version":1,"role":"client","host_id":"AAECAwQFBgcICQoLDA0ODw","connection_id":"8ODQwLCgkIBwYFBAMCAQAA","credential_kind":"bootstrap","token":"` + testToken + `"}`, reg},
		{"registered", Registered{},
			`{"type":"registered","protocol_version":1}`, ParseBrokerMessage},
		{"registered with credit", Registered{Extensions: []string{"credit"}},
			`{"type":"registered","protocol_version":1,"extensions":["credit"]}`, ParseBrokerMessage},
		{"publish_bootstrap", PublishBootstrap{"pair-1", d, 1780000000},
			`{"type":"publish_bootstrap","protocol_version":1,"pairing_id":"pair-1","token_sha256":"` + abcDigest + `","expires_at":1780000000,"max_uses":1}`, ParseHostControl},
		{"publish_route", PublishRoute{"ungWv48Bz-pBQUDeXa4iIw", d, 1780000000, n},
			`{"type":"publish_route","protocol_version":1,"credential_id":"ungWv48Bz-pBQUDeXa4iIw","token_sha256":"` + abcDigest + `","expires_at":1780000000,"device_id_hash":"` + nullDigest + `"}`, ParseHostControl},
		{"revoke", Revoke{"route-1"},
			`{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"route-1"}`, ParseHostControl},
		{"published bootstrap", Published{KindBootstrap, "pair-1"},
			`{"type":"published","protocol_version":1,"credential_kind":"bootstrap","pairing_id":"pair-1"}`, ParseBrokerMessage},
		{"published route", Published{KindRoute, "route-1"},
			`{"type":"published","protocol_version":1,"credential_kind":"route","credential_id":"route-1"}`, ParseBrokerMessage},
		{"revoked", Revoked{"route-1"},
			`{"type":"revoked","protocol_version":1,"credential_kind":"route","credential_id":"route-1"}`, ParseBrokerMessage},
		{"open", Open{StreamID: revID, HostConnectionID: seqID},
			`{"type":"open","protocol_version":1,"stream_id":"8ODQwLCgkIBwYFBAMCAQAA","host_connection_id":"AAECAwQFBgcICQoLDA0ODw"}`, ParseBrokerMessage},
		{"matched", Matched{StreamID: revID},
			`{"type":"matched","protocol_version":1,"stream_id":"8ODQwLCgkIBwYFBAMCAQAA"}`, ParseBrokerMessage},
	}
	for _, c := range Codes() {
		cases = append(cases, struct {
			name  string
			msg   Message
			want  string
			parse parser
		}{"error " + string(c), ErrorMsg{c},
			`{"type":"error","protocol_version":1,"code":"` + string(c) + `"}`, ParseBrokerMessage})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Marshal(c.msg)
			if err != nil || string(got) != c.want {
				t.Fatalf("Marshal:\n got %s (%v)\nwant %s", got, err, c.want)
			}
			back, err := c.parse([]byte(c.want))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if !reflect.DeepEqual(back, c.msg) {
				t.Fatalf("parse = %#v, want %#v", back, c.msg)
			}
			if back.Type() != c.msg.Type() {
				t.Fatalf("Type() = %q", back.Type())
			}
		})
	}
}

// The reference broker and connector use Python's json.dumps defaults, which
// put a space after ':' and ','. Whitespace must never matter.
func TestReferenceSpacingAccepted(t *testing.T) {
	frames := []string{
		`{"type": "registered", "protocol_version": 1}`,
		`{"type": "matched", "protocol_version": 1, "stream_id": "` + revIDText + `"}`,
		`{"type": "error", "protocol_version": 1, "code": "host_offline"}`,
		"\n{ \"type\" :\t\"open\" , \"protocol_version\" : 1 , \"stream_id\" : \"" + revIDText +
			"\", \"host_connection_id\": \"" + seqIDText + "\" }\r\n",
	}
	for _, f := range frames {
		if _, err := ParseBrokerMessage([]byte(f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	reg := `{"type": "register", "protocol_version": 1, "role": "client", "host_id": "` + seqIDText +
		`", "connection_id": "` + revIDText + `", "credential_kind": "route", "token": "` + testToken + `"}`
	if _, err := ParseRegister([]byte(reg)); err != nil {
		t.Errorf("register with spaces: %v", err)
	}
	pub := `{"type": "publish_route", "protocol_version": 1, "credential_id": "route-1", "token_sha256": "` +
		abcDigest + `", "expires_at": 1780000000.25, "device_id_hash": "` + nullDigest + `"}`
	m, err := ParseHostControl([]byte(pub))
	if err != nil || m.(PublishRoute).ExpiresAt != 1780000000 {
		t.Errorf("publish_route with float expiry: %v %v", m, err)
	}
}

func wantErr(t *testing.T, what string, err error, code Code, violation bool) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Errorf("%s: err = %v, want *Error %s", what, err, code)
		return
	}
	if e.Code != code || e.Violation != violation {
		t.Errorf("%s: got code %s violation %v (%s), want %s violation %v",
			what, e.Code, e.Violation, e.Detail, code, violation)
	}
}

func TestRegisterExactKeySet(t *testing.T) {
	base := registerPairs()
	if _, err := ParseRegister(kv(base...)); err != nil {
		t.Fatalf("base frame rejected: %v", err)
	}
	for i := 0; i < len(base); i += 2 {
		key := base[i]
		_, err := ParseRegister(kv(without(base, key)...))
		wantErr(t, "missing "+key, err, CodeUnauthorized, true)
	}
	for _, extra := range [][]string{
		{"x", "1"}, {"extensions", `[]`}, {"Type", `"register"`}, {"token ", `"x"`}, {"", `""`},
	} {
		_, err := ParseRegister(kv(append(registerPairs(), extra...)...))
		wantErr(t, "extra key "+extra[0], err, CodeUnauthorized, true)
	}
	// A renamed key (same count) is a wrong key set too.
	renamed := replacedKey(base, "token", "Token")
	_, err := ParseRegister(kv(renamed...))
	wantErr(t, "renamed key", err, CodeUnauthorized, true)
	// Duplicate keys: two parsers could disagree which value counts.
	dup := append(registerPairs(), "role", `"client"`)
	_, err = ParseRegister(kv(dup...))
	wantErr(t, "duplicate key", err, CodeUnauthorized, true)
	for _, typ := range []string{`"registered"`, `"Register"`, `1`, `null`, `"register "`} {
		_, err := ParseRegister(kv(replaced(base, "type", typ)...))
		wantErr(t, "type "+typ, err, CodeUnauthorized, true)
	}
}

func replacedKey(pairs []string, from, to string) []string {
	out := append([]string(nil), pairs...)
	for i := 0; i < len(out); i += 2 {
		if out[i] == from {
			out[i] = to
		}
	}
	return out
}

func TestRegisterVersion(t *testing.T) {
	base := registerPairs()
	for _, v := range []string{"true", "1.0", "2", `"1"`, "1e0", "0", "-1", "null", "1.5", "[1]", "10", "01e0"} {
		_, err := ParseRegister(kv(replaced(base, "protocol_version", v)...))
		if v == "01e0" { // not JSON at all
			wantErr(t, "version "+v, err, CodeUnauthorized, true)
			continue
		}
		wantErr(t, "version "+v, err, CodeUnsupportedVersion, false)
	}
	// The key set is checked before the version.
	bad := replaced(base, "protocol_version", "2")
	_, err := ParseRegister(kv(append(bad, "x", "1")...))
	wantErr(t, "extra key and bad version", err, CodeUnauthorized, true)
	_, err = ParseRegister(kv(without(bad, "token")...))
	wantErr(t, "missing key and bad version", err, CodeUnauthorized, true)
	_, err = ParseRegister(kv(replaced(bad, "type", `"hello"`)...))
	wantErr(t, "wrong type and bad version", err, CodeUnauthorized, true)
}

func TestRegisterFields(t *testing.T) {
	base := registerPairs()
	bad := map[string][]string{
		"role admin":              replaced(base, "role", `"admin"`),
		"role number":             replaced(base, "role", `1`),
		"host with bootstrap":     replaced(base, "credential_kind", `"bootstrap"`),
		"client with host kind":   replaced(base, "role", `"client"`),
		"kind unknown":            replaced(base, "credential_kind", `"session"`),
		"host_id non-canonical":   replaced(base, "host_id", `"AAAAAAAAAAAAAAAAAAAAAB"`),
		"host_id padded":          replaced(base, "host_id", `"`+seqIDText+`=="`),
		"connection_id number":    replaced(base, "connection_id", `12`),
		"connection_id 23 chars":  replaced(base, "connection_id", `"`+revIDText+`A"`),
		"token 31":                replaced(base, "token", `"`+strings.Repeat("t", 31)+`"`),
		"token 513":               replaced(base, "token", `"`+strings.Repeat("t", 513)+`"`),
		"token number":            replaced(base, "token", strings.Repeat("1", 40)),
		"token null":              replaced(base, "token", `null`),
		"token escaped 31 chars":  replaced(base, "token", `"`+strings.Repeat(`\u00e9`, 31)+`"`),
		"host_id escaped padding": replaced(base, "host_id", `"`+seqIDText[:21]+`\u003d"`),
	}
	for name, pairs := range bad {
		_, err := ParseRegister(kv(pairs...))
		wantErr(t, name, err, CodeUnauthorized, false)
	}
	for _, n := range []int{32, 512} {
		r, err := ParseRegister(kv(replaced(base, "token", `"`+strings.Repeat("t", n)+`"`)...))
		if err != nil || len(r.Token) != n {
			t.Errorf("token of %d chars: %v", n, err)
		}
	}
	// Escapes count as the characters they stand for.
	r, err := ParseRegister(kv(replaced(base, "token", `"`+strings.Repeat(`\u00e9`, 32)+`"`)...))
	if err != nil || string(r.Token) != strings.Repeat("é", 32) {
		t.Errorf("escaped token: %v", err)
	}
}

func TestRegisterFraming(t *testing.T) {
	good := kv(registerPairs()...)
	pad := func(n int) []byte { // valid JSON padded with trailing spaces to n bytes
		return append(append([]byte(nil), good...), strings.Repeat(" ", n-len(good))...)
	}
	if _, err := ParseRegister(pad(MaxControlBytes)); err != nil {
		t.Errorf("4096-byte frame rejected: %v", err)
	}
	_, err := ParseRegister(pad(MaxControlBytes + 1))
	wantErr(t, "4097 bytes", err, CodeUnauthorized, true)
	frames := map[string]string{
		"empty":          "",
		"not JSON":       "register",
		"array":          "[" + string(good) + "]",
		"string":         `"register"`,
		"null":           "null",
		"trailing data":  string(good) + "{}",
		"trailing comma": strings.TrimSuffix(string(good), "}") + ",}",
		"two objects":    string(good) + string(good),
		"truncated":      string(good[:len(good)-1]),
		"bad UTF-8":      strings.Replace(string(good), testToken, testToken+"\xff", 1),
		"BOM":            "\ufeff" + string(good),
	}
	for name, f := range frames {
		_, err := ParseRegister([]byte(f))
		wantErr(t, name, err, CodeUnauthorized, true)
	}
}

func TestRegisterTokenEscapingRoundTrips(t *testing.T) {
	tok := Secret(`quote" backslash\ tab` + "\t nl\n ctl\x01 é 😀 \u2028 <&>" + strings.Repeat("x", 10))
	m := Register{RoleClient, seqID, revID, KindRoute, tok}
	b, err := Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var std map[string]any
	if err := json.Unmarshal(b, &std); err != nil || std["token"] != string(tok) {
		t.Fatalf("encoding/json reads %q (%v)", std["token"], err)
	}
	back, err := ParseRegister(b)
	if err != nil || back != m {
		t.Fatalf("round trip: %+v %v", back, err)
	}
}

func TestMarshalRefusesInvalidMessages(t *testing.T) {
	d := mustDigest(t, abcDigest)
	tooMany := make([]string, MaxExtensions+1)
	for i := range tooMany {
		tooMany[i] = "x"
	}
	bad := map[string]Message{
		"host with route kind":    Register{RoleHost, seqID, revID, KindRoute, testToken},
		"client with host kind":   Register{RoleClient, seqID, revID, KindHost, testToken},
		"empty role":              Register{"", seqID, revID, KindHost, testToken},
		"short token":             Register{RoleHost, seqID, revID, KindHost, "short"},
		"bad pairing_id":          PublishBootstrap{"pair 1", d, 1},
		"empty credential_id":     PublishRoute{"", d, 1, d},
		"revoke bad id":           Revoke{"a/b"},
		"published host kind":     Published{KindHost, "x"},
		"published empty label":   Published{KindRoute, ""},
		"revoked bad id":          Revoked{strings.Repeat("a", 129)},
		"bad extension":           Registered{Extensions: []string{"Credit"}},
		"too many extensions":     Registered{Extensions: tooMany},
		"error with unknown code": ErrorMsg{"nope"},
		"error with empty code":   ErrorMsg{},
	}
	for name, m := range bad {
		if b, err := Marshal(m); err == nil {
			t.Errorf("%s: Marshal produced %s", name, b)
		}
	}
	// Negative and extreme expiries still encode as JSON integers.
	b, err := Marshal(PublishBootstrap{"p", d, -9223372036854775808})
	if err != nil || !strings.Contains(string(b), `"expires_at":-9223372036854775808,`) {
		t.Errorf("min int64 expiry: %s %v", b, err)
	}
}

func hostControlPairs(typ string) []string {
	switch typ {
	case TypePublishBootstrap:
		return []string{"type", `"publish_bootstrap"`, "protocol_version", "1", "pairing_id", `"pair-1"`,
			"token_sha256", `"` + abcDigest + `"`, "expires_at", "1780000000", "max_uses", "1"}
	case TypePublishRoute:
		return []string{"type", `"publish_route"`, "protocol_version", "1", "credential_id", `"route-1"`,
			"token_sha256", `"` + abcDigest + `"`, "expires_at", "1780000000", "device_id_hash", `"` + nullDigest + `"`}
	default:
		return []string{"type", `"revoke"`, "protocol_version", "1", "credential_kind", `"route"`,
			"credential_id", `"route-1"`}
	}
}

func TestHostControlKeySets(t *testing.T) {
	for _, typ := range []string{TypePublishBootstrap, TypePublishRoute, TypeRevoke} {
		base := hostControlPairs(typ)
		m, err := ParseHostControl(kv(base...))
		if err != nil || m.Type() != typ {
			t.Fatalf("%s base: %v %v", typ, m, err)
		}
		for i := 0; i < len(base); i += 2 {
			_, err := ParseHostControl(kv(without(base, base[i])...))
			wantErr(t, typ+" missing "+base[i], err, CodeUnauthorized, true)
		}
		_, err = ParseHostControl(kv(append(hostControlPairs(typ), "x", "1")...))
		wantErr(t, typ+" extra key", err, CodeUnauthorized, true)
		_, err = ParseHostControl(kv(append(hostControlPairs(typ), "type", `"`+typ+`"`)...))
		wantErr(t, typ+" duplicate type", err, CodeUnauthorized, true)
		// Version after key set: right keys, wrong version → unsupported_version,
		// and the host stays connected.
		for _, v := range []string{"true", "1.0", "2", `"1"`, "1e0"} {
			_, err := ParseHostControl(kv(replaced(base, "protocol_version", v)...))
			wantErr(t, typ+" version "+v, err, CodeUnsupportedVersion, false)
		}
		_, err = ParseHostControl(kv(append(replaced(base, "protocol_version", "2"), "x", "1")...))
		wantErr(t, typ+" extra key and bad version", err, CodeUnauthorized, true)
	}
	// A publish_bootstrap shaped like a route (device_id_hash instead of
	// max_uses) is a wrong key set, not a field error.
	mixed := replacedKey(hostControlPairs(TypePublishBootstrap), "max_uses", "device_id_hash")
	_, err := ParseHostControl(kv(mixed...))
	wantErr(t, "bootstrap with route keys", err, CodeUnauthorized, true)

	for _, f := range []string{
		string(kv(registerPairs()...)),                                       // register after registration
		`{"type":"extensions","protocol_version":1,"extensions":["credit"]}`, // not in plain v1
		`{"type":"ping","protocol_version":1}`,
		`{"protocol_version":1}`,
		`{"type":null,"protocol_version":1}`,
		`not json`,
		`[]`,
	} {
		_, err := ParseHostControl([]byte(f))
		wantErr(t, "frame "+f, err, CodeUnauthorized, true)
	}
	big := kv(hostControlPairs(TypeRevoke)...)
	big = append(big, strings.Repeat(" ", MaxControlBytes+1-len(big))...)
	_, err = ParseHostControl(big)
	wantErr(t, "4097-byte control frame", err, CodeUnauthorized, true)
}

func TestHostControlFields(t *testing.T) {
	boot := hostControlPairs(TypePublishBootstrap)
	route := hostControlPairs(TypePublishRoute)
	rev := hostControlPairs(TypeRevoke)
	bad := map[string][]string{
		"pairing_id with space":   replaced(boot, "pairing_id", `"pair 1"`),
		"pairing_id empty":        replaced(boot, "pairing_id", `""`),
		"pairing_id 129":          replaced(boot, "pairing_id", `"`+strings.Repeat("p", 129)+`"`),
		"pairing_id number":       replaced(boot, "pairing_id", `1`),
		"digest short":            replaced(boot, "token_sha256", `"`+abcDigest[:42]+`"`),
		"digest padded":           replaced(boot, "token_sha256", `"`+abcDigest+`="`),
		"expires_at string":       replaced(boot, "expires_at", `"1780000000"`),
		"expires_at bool":         replaced(boot, "expires_at", `true`),
		"expires_at null":         replaced(boot, "expires_at", `null`),
		"expires_at ISO":          replaced(boot, "expires_at", `"2026-05-01T00:00:00Z"`),
		"max_uses 2":              replaced(boot, "max_uses", `2`),
		"max_uses 1.0":            replaced(boot, "max_uses", `1.0`),
		"max_uses true":           replaced(boot, "max_uses", `true`),
		"max_uses string":         replaced(boot, "max_uses", `"1"`),
		"credential_id with dot":  replaced(route, "credential_id", `"route.1"`),
		"device_id_hash raw":      replaced(route, "device_id_hash", `"my phone"`),
		"device_id_hash null":     replaced(route, "device_id_hash", `null`),
		"route expires_at object": replaced(route, "expires_at", `{}`),
		"revoke bootstrap kind":   replaced(rev, "credential_kind", `"bootstrap"`),
		"revoke empty id":         replaced(rev, "credential_id", `""`),
	}
	for name, pairs := range bad {
		_, err := ParseHostControl(kv(pairs...))
		wantErr(t, name, err, CodeUnauthorized, false)
	}
	for raw, want := range map[string]int64{"1780000000.9": 1780000000, "1.78e9": 1780000000, "-5": -5} {
		m, err := ParseHostControl(kv(replaced(boot, "expires_at", raw)...))
		if err != nil || m.(PublishBootstrap).ExpiresAt != want {
			t.Errorf("expires_at %s: %v %v", raw, m, err)
		}
	}
}

func TestBrokerMessagesAreStrict(t *testing.T) {
	matched := `{"type":"matched","protocol_version":1,"stream_id":"` + revIDText + `"`
	bad := []string{
		matched + `,"extra":1}`,
		matched + `,"extensions":[]}`, // only registered may carry extensions
		`{"type":"matched","protocol_version":1}`,
		`{"type":"matched","protocol_version":1,"stream_id":"AAAAAAAAAAAAAAAAAAAAAB"}`,
		`{"type":"error","protocol_version":1,"code":"host_offline","message":"x"}`,
		`{"type":"error","protocol_version":1,"code":"Host Offline"}`,
		`{"type":"error","protocol_version":1,"code":""}`,
		`{"type":"error","protocol_version":1,"code":7}`,
		`{"type":"error","protocol_version":1}`,
		`{"type":"registered","protocol_version":1,"host_id":"` + seqIDText + `"}`,
		`{"type":"registered","protocol_version":1,"extensions":"credit"}`,
		`{"type":"registered","protocol_version":1,"extensions":null}`,
		`{"type":"registered","protocol_version":1,"extensions":[1]}`,
		`{"type":"registered","protocol_version":1,"extensions":["Credit"]}`,
		`{"type":"registered","protocol_version":1,"extensions":[` + strings.Repeat(`"a",`, MaxExtensions) + `"a"]}`,
		`{"type":"published","protocol_version":1,"credential_kind":"bootstrap","credential_id":"x"}`,
		`{"type":"published","protocol_version":1,"credential_kind":"route","pairing_id":"x"}`,
		`{"type":"published","protocol_version":1,"credential_kind":"host","credential_id":"x"}`,
		`{"type":"published","protocol_version":1,"credential_kind":"route","credential_id":"a b"}`,
		`{"type":"revoked","protocol_version":1,"credential_kind":"bootstrap","credential_id":"x"}`,
		`{"type":"open","protocol_version":1,"stream_id":"` + revIDText + `"}`,
		`{"type":"open","protocol_version":1,"stream_id":"` + revIDText + `","host_connection_id":"x"}`,
		`{"type":"publish_route","protocol_version":1}`,
		string(kv(registerPairs()...)),
		`{"type":"matched","type":"matched","protocol_version":1,"stream_id":"` + revIDText + `"}`,
		`[]`, ``, `{}`,
	}
	for _, f := range bad {
		_, err := ParseBrokerMessage([]byte(f))
		wantErr(t, f, err, CodeUnauthorized, true)
	}
	for _, v := range []string{"true", "1.0", "2", `"1"`} {
		_, err := ParseBrokerMessage([]byte(`{"type":"matched","protocol_version":` + v + `,"stream_id":"` + revIDText + `"}`))
		wantErr(t, "broker version "+v, err, CodeUnsupportedVersion, true)
	}
	// A well-formed code this version does not know still reaches the caller.
	m, err := ParseBrokerMessage([]byte(`{"type":"error","protocol_version":1,"code":"rate_limited"}`))
	if err != nil || m.(ErrorMsg).Code != "rate_limited" || m.(ErrorMsg).Code.Known() {
		t.Errorf("unknown code: %v %v", m, err)
	}
	m, err = ParseBrokerMessage([]byte(`{"type":"error","protocol_version":1,"code":"revoked"}`))
	if err != nil || !errors.Is(m.(ErrorMsg).Err(), ErrRevoked) {
		t.Errorf("revoked: %v %v", m, err)
	}
	// Unknown extension names are accepted; the connector ignores them.
	m, err = ParseBrokerMessage([]byte(`{"type":"registered","protocol_version":1,"extensions":["credit","zstd-2"]}`))
	if err != nil || !reflect.DeepEqual(m, Registered{Extensions: []string{"credit", "zstd-2"}}) {
		t.Errorf("registered with extensions: %v %v", m, err)
	}
}

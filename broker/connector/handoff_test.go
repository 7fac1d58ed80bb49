package connector

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// handoffNow is 2026-01-01T00:00:00Z.
var handoffNow = time.Unix(1767225600, 0)

const (
	plus30d = 1767225600 + 30*86400
	plus90d = 1767225600 + 90*86400
)

func testRoute(credID string, exp int64) routeCredential {
	return routeCredential{
		brokerURL: "wss://broker.example/v1/connect", hostID: "AAECAwQFBgcICQoLDA0ODw",
		credentialID: credID, token: "TOKEN-abcdefghijklmnopqrstuvwxyz0123456789", expiresAt: exp,
	}
}

func routeJSON(credID string, exp int64) string {
	return `"route_credential":{"kind":"broker_route","broker_url":"wss://broker.example/v1/connect",` +
		`"host_id":"AAECAwQFBgcICQoLDA0ODw","credential_id":"` + credID +
		`","token":"TOKEN-abcdefghijklmnopqrstuvwxyz0123456789","expires_at":` + strconv.FormatInt(exp, 10) + `}`
}

func TestHandoffGolden(t *testing.T) {
	cases := []struct {
		name, in, session string
		exp               int64
		// out is in with the credential inserted at the marker "@".
		out string
	}{
		{
			name: "null expiry, raw values and escapes untouched",
			in: `{"channel":"system","type":"auth.ok","id":"1","payload":{"session_token":"s\u00e9ss-tok",` +
				`"server_version":"0.9","profiles":[{"name":"caf\u00e9","weight":1.5e9}],"expires_at":null,` +
				`"grants":{"chat":1.5e9,"voice":null,"x":-0.0},"transport_hint":"wss"},"trailer":{"z":1,"a":2}}`,
			session: "séss-tok", exp: plus30d,
			out: `{"channel":"system","type":"auth.ok","id":"1","payload":{"session_token":"s\u00e9ss-tok",` +
				`"server_version":"0.9","profiles":[{"name":"caf\u00e9","weight":1.5e9}],"expires_at":null,` +
				`"grants":{"chat":1.5e9,"voice":null,"x":-0.0},"transport_hint":"wss"@},"trailer":{"z":1,"a":2}}`,
		},
		{
			name:    "float expiry floored",
			in:      `{"type":"auth.ok","channel":"system","payload":{"expires_at":1769000000.75,"session_token":"t"}}`,
			session: "t", exp: 1769000000,
			out: `{"type":"auth.ok","channel":"system","payload":{"expires_at":1769000000.75,"session_token":"t"@}}`,
		},
		{
			name:    "beyond 90 days clamped",
			in:      `{"channel":"system","type":"auth.ok","payload":{"session_token":"t","expires_at":1.9e9}}`,
			session: "t", exp: plus90d,
			out: `{"channel":"system","type":"auth.ok","payload":{"session_token":"t","expires_at":1.9e9@}}`,
		},
		{
			name:    "no expiry member",
			in:      `{"channel":"system","type":"auth.ok","payload":{"session_token":"t"}}`,
			session: "t", exp: plus30d,
			out: `{"channel":"system","type":"auth.ok","payload":{"session_token":"t"@}}`,
		},
		{
			name: "whitespace everywhere",
			in: "{ \"type\" : \"auth.ok\" ,\n \"channel\":\"system\", \"payload\" : { \"session_token\" : \"t1\" ," +
				" \"expires_at\" : null\t}  , \"n\" : 1E+2 }\n",
			session: "t1", exp: plus30d,
			out: "{ \"type\" : \"auth.ok\" ,\n \"channel\":\"system\", \"payload\" : { \"session_token\" : \"t1\" ," +
				" \"expires_at\" : null@\t}  , \"n\" : 1E+2 }\n",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			info, err := parseAuthOK([]byte(tc.in), handoffNow)
			if err != nil {
				t.Fatal(err)
			}
			if info.sessionToken != tc.session || info.expiresAt != tc.exp {
				t.Fatalf("session %q exp %d, want %q %d", info.sessionToken, info.expiresAt, tc.session, tc.exp)
			}
			credID := wire.RouteCredentialID(tc.session)
			got := string(insertRoute([]byte(tc.in), info, testRoute(credID, info.expiresAt)))
			want := strings.Replace(tc.out, "@", ","+routeJSON(credID, tc.exp), 1)
			if got != want {
				t.Fatalf("got\n%s\nwant\n%s", got, want)
			}
			// The Android client reads expires_at as an integer.
			var m struct {
				Payload struct {
					RC map[string]json.RawMessage `json:"route_credential"`
				} `json:"payload"`
			}
			if err := json.Unmarshal([]byte(got), &m); err != nil {
				t.Fatal(err)
			}
			if raw := string(m.Payload.RC["expires_at"]); strings.ContainsAny(raw, ".eE") {
				t.Fatalf("expires_at %s is not an integer", raw)
			}
		})
	}
}

func TestHandoffLeavesOtherMessagesAlone(t *testing.T) {
	cases := map[string]struct {
		in   string
		want error
	}{
		"existing credential": {`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","route_credential":{"kind":"x"}}}`, errHasRoute},
		"existing null":       {`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","route_credential":null}}`, errHasRoute},
		"escaped key":         {`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","route\u005fcredential":1}}`, errHasRoute},
		"past expiry":         {`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","expires_at":1.5e9}}`, errPastExpiry},
		"string expiry":       {`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","expires_at":"2030-01-01"}}`, errBadExpiry},
		"bool expiry":         {`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","expires_at":true}}`, errBadExpiry},
		"no session":          {`{"channel":"system","type":"auth.ok","payload":{"expires_at":null}}`, errNoSession},
		"empty session":       {`{"channel":"system","type":"auth.ok","payload":{"session_token":""}}`, errNoSession},
		"numeric session":     {`{"channel":"system","type":"auth.ok","payload":{"session_token":12345}}`, errNoSession},
		"empty payload":       {`{"channel":"system","type":"auth.ok","payload":{}}`, errNoSession},
		"auth.fail":           {`{"channel":"system","type":"auth.fail","payload":{"session_token":"t"}}`, errNotAuthOK},
		"other channel":       {`{"channel":"chat","type":"auth.ok","payload":{"session_token":"t"}}`, errNotAuthOK},
		"payload array":       {`{"channel":"system","type":"auth.ok","payload":[1]}`, errNotAuthOK},
		"payload null":        {`{"channel":"system","type":"auth.ok","payload":null}`, errNotAuthOK},
		"no payload":          {`{"channel":"system","type":"auth.ok"}`, errNotAuthOK},
		"duplicate top key":   {`{"channel":"system","type":"auth.ok","type":"auth.ok","payload":{"session_token":"t"}}`, errDuplicateKeys},
		"duplicate payload":   {`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","session_token":"u"}}`, errDuplicateKeys},
		"trailing data":       {`{"channel":"system","type":"auth.ok","payload":{"session_token":"t"}} {}`, errNotAuthOK},
		"not json":            {`{"channel":"system",`, errNotAuthOK},
		"array":               {`[{"channel":"system","type":"auth.ok"}]`, errNotAuthOK},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := parseAuthOK([]byte(tc.in), handoffNow)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
}

func TestDeviceIDOf(t *testing.T) {
	cases := map[string]string{
		`{"type":"auth","payload":{"pairing_code":"X","device_id":"dev-1"}}`:          "dev-1",
		`{"type":"auth","payload":{"device_id":"Bailey\u0027s t\u00e9l\u00e9phone"}}`: "Bailey's téléphone",
		`{"type":"auth","payload":{"Device_ID":"dev-1"}}`:                             "",
		`{"type":"auth","payload":{"device_id":7}}`:                                   "",
		`{"type":"auth","payload":{}}`:                                                "",
		`{"type":"auth"}`:                                                             "",
		`not json`:                                                                    "",
		``:                                                                            "",
	}
	for in, want := range cases {
		if got := deviceIDOf([]byte(in)); got != want {
			t.Errorf("deviceIDOf(%s) = %q, want %q", in, got, want)
		}
	}
}

// fakeClock is a settable wall clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

const sessionAuthOK = `{"channel":"system","type":"auth.ok","id":"1","payload":{"session_token":"%s","expires_at":null,"grants":{"chat":1.5e9}}}`

func authOKFor(session string) []byte {
	return []byte(strings.Replace(sessionAuthOK, "%s", session, 1))
}

// routeOf extracts payload.route_credential from a handed-off auth.ok.
func routeOf(t *testing.T, msg []byte) (token, credID string, exp int64) {
	t.Helper()
	var m struct {
		Payload struct {
			RC *struct {
				Kind         string `json:"kind"`
				Token        string `json:"token"`
				CredentialID string `json:"credential_id"`
				ExpiresAt    int64  `json:"expires_at"`
			} `json:"route_credential"`
		} `json:"payload"`
	}
	if err := json.Unmarshal(msg, &m); err != nil || m.Payload.RC == nil || m.Payload.RC.Kind != "broker_route" {
		t.Fatalf("no route credential in %s (%v)", msg, err)
	}
	return m.Payload.RC.Token, m.Payload.RC.CredentialID, m.Payload.RC.ExpiresAt
}

// TestHandoffPublishesThenReusesAndRenews runs the hook against a fake
// broker that shows exactly which control messages the connector sends.
func TestHandoffPublishesThenReusesAndRenews(t *testing.T) {
	clock := &fakeClock{t: handoffNow}
	_, c, h := startFake(t, func(cfg *Config) { cfg.Now = clock.now })
	hook := c.Handoff()
	auth := []byte(`{"type":"auth","payload":{"pairing_code":"P","device_id":"dev-7"}}`)

	type res struct{ out []byte }
	call := func(client []byte, session string) chan res {
		ch := make(chan res, 1)
		go func() { ch <- res{hook.AuthOK(context.Background(), client, authOKFor(session))} }()
		return ch
	}
	expectPublish := func(session, device string, exp int64) wire.PublishRoute {
		t.Helper()
		m, _ := h.Read()
		pr, ok := m.(wire.PublishRoute)
		if !ok {
			t.Fatalf("got %#v, want publish_route", m)
		}
		if pr.CredentialID != wire.RouteCredentialID(session) || pr.DeviceIDHash != wire.TokenDigest(device) || pr.ExpiresAt != exp {
			t.Fatalf("publish_route %+v", pr)
		}
		return pr
	}

	// First auth.ok: published (digest only), then released with the token.
	ch := call(auth, "sess-A")
	pr := expectPublish("sess-A", "dev-7", plus30d)
	h.SendText(wire.Published{CredentialKind: wire.KindRoute, Label: pr.CredentialID})
	out := (<-ch).out
	tok, credID, exp := routeOf(t, out)
	if wire.TokenDigest(tok) != pr.TokenSHA256 || credID != pr.CredentialID || exp != plus30d {
		t.Fatal("the credential handed out is not the one published")
	}

	// Same session again within its lifetime: reused, nothing published.
	clock.advance(22 * 24 * time.Hour) // 8 days remain
	out2 := (<-call(auth, "sess-A")).out
	if tok2, _, exp2 := routeOf(t, out2); tok2 != tok || exp2 != exp {
		t.Fatal("a cached credential with more than 7 days left was not reused")
	}

	// Without a device_id the session token is the device.
	ch = call([]byte(`{"type":"auth","payload":{"session_token":"sess-B"}}`), "sess-B")
	now := clock.now().Unix()
	prB := expectPublish("sess-B", "sess-B", now+30*86400)

	// While B's publish is unanswered, A (cached) still authenticates.
	select {
	case r := <-call(auth, "sess-A"):
		if tokA, _, _ := routeOf(t, r.out); tokA != tok {
			t.Fatal("A got another token")
		}
	case <-time.After(step):
		t.Fatal("a pending publish for one session blocked another session's auth.ok")
	}
	h.SendText(wire.Published{CredentialKind: wire.KindRoute, Label: prB.CredentialID})
	<-ch

	// Less than 7 days left: renewed under the same credential_id.
	clock.advance(2 * 24 * time.Hour) // 6 days remain for A
	ch = call(auth, "sess-A")
	pr3 := expectPublish("sess-A", "dev-7", clock.now().Unix()+30*86400)
	if pr3.TokenSHA256 == pr.TokenSHA256 {
		t.Fatal("renewal reused the old token")
	}
	h.SendText(wire.Published{CredentialKind: wire.KindRoute, Label: pr3.CredentialID})
	if tok3, _, _ := routeOf(t, (<-ch).out); tok3 == tok {
		t.Fatal("renewal handed out the old token")
	}

	// A broker error: the auth.ok goes out unchanged, and nothing is cached.
	ch = call(auth, "sess-C")
	expectPublish("sess-C", "dev-7", clock.now().Unix()+30*86400)
	h.SendText(wire.ErrorMsg{Code: wire.CodeQuotaExceeded})
	if r := <-ch; r.out != nil {
		t.Fatalf("publish failed but the auth.ok changed: %s", r.out)
	}
	ch = call(auth, "sess-C")
	prC := expectPublish("sess-C", "dev-7", clock.now().Unix()+30*86400)
	h.SendText(wire.Published{CredentialKind: wire.KindRoute, Label: prC.CredentialID})
	if r := <-ch; r.out == nil {
		t.Fatal("retry after a failed publish got no credential")
	}
	if n := c.Counts()["route_reused"]; n != 2 {
		t.Fatalf("route_reused = %d", n)
	}
}

func TestHandoffTimesOutUnchanged(t *testing.T) {
	_, c, h := startFake(t, func(cfg *Config) { cfg.PublishTimeout = 100 * time.Millisecond })
	out := c.Handoff().AuthOK(context.Background(), nil, authOKFor("sess-slow"))
	if out != nil {
		t.Fatalf("a publish without reply still changed the auth.ok: %s", out)
	}
	if m, _ := h.Read(); m.Type() != wire.TypePublishRoute {
		t.Fatalf("got %#v", m)
	}
	// The bridge's own deadline is honoured as well.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if out := c.Handoff().AuthOK(ctx, nil, authOKFor("sess-slow-2")); out != nil {
		t.Fatal("changed after the bridge's deadline")
	}
}

func TestHandoffWithoutRegistrationIsUnchanged(t *testing.T) {
	c := newConnector(t, goodConfig())
	if out := c.Handoff().AuthOK(context.Background(), nil, authOKFor("s")); out != nil {
		t.Fatal("changed without a registration")
	}
	if _, err := c.PublishBootstrap(context.Background(), 0); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("PublishBootstrap without registration: %v", err)
	}
	if err := c.Revoke(context.Background(), "abc"); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("Revoke without registration: %v", err)
	}
}

// FuzzParseAuthOK checks, for any message, that a handoff either leaves it
// alone or only inserts the credential: every original byte stays, the
// result is valid JSON and carries an integer expiry in range.
func FuzzParseAuthOK(f *testing.F) {
	seeds := []string{
		`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","expires_at":null}}`,
		`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","expires_at":1.9e9,"a":[1,{"b":"\u00e9"}]}}`,
		`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","expires_at":1769000000.75}}`,
		"{ \"channel\" : \"system\" , \"type\":\"auth.ok\",\"payload\":{\"session_token\":\"t\"\n}\t}",
		`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","route_credential":{}}}`,
		`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","session_token":"u"}}`,
		`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","expires_at":1e400}}`,
		`{"channel":"system","type":"auth.ok","payload":{"session_token":"t","expires_at":-1e400}}`,
		`{"channel":"system","type":"auth.ok","payload":"x"}`,
		`[]`, `{}`, ``, `{"channel":"system","type":"auth.ok","payload":{"session_token":"\ud800"}}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		info, err := parseAuthOK(msg, handoffNow)
		if err != nil {
			return
		}
		if info.expiresAt <= handoffNow.Unix() || info.expiresAt > plus90d || info.sessionToken == "" {
			t.Fatalf("info %+v", info)
		}
		rc := testRoute(wire.RouteCredentialID(info.sessionToken), info.expiresAt)
		out := insertRoute(msg, info, rc)
		ins := len(out) - len(msg)
		if string(out[:info.insertAt]) != string(msg[:info.insertAt]) ||
			string(out[info.insertAt+ins:]) != string(msg[info.insertAt:]) {
			t.Fatal("bytes outside the insertion changed")
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON: %s", out)
		}
		again, err := parseAuthOK(out, handoffNow)
		if !errors.Is(err, errHasRoute) {
			t.Fatalf("the result does not carry the credential: %v %+v", err, again)
		}
		tok, id, exp := routeOfFuzz(out)
		if tok != string(rc.token) || id != rc.credentialID || exp != info.expiresAt {
			t.Fatal("credential round trip failed")
		}
	})
}

// routeOfFuzz reads payload.route_credential with exact keys (maps), as
// the message may hold case variants that encoding/json structs would
// confuse.
func routeOfFuzz(msg []byte) (string, string, int64) {
	var top, payload, rc map[string]json.RawMessage
	json.Unmarshal(msg, &top)
	json.Unmarshal(top["payload"], &payload)
	json.Unmarshal(payload["route_credential"], &rc)
	var tok, id string
	var exp int64
	json.Unmarshal(rc["token"], &tok)
	json.Unmarshal(rc["credential_id"], &id)
	json.Unmarshal(rc["expires_at"], &exp)
	return tok, id, exp
}

func FuzzDeviceIDOf(f *testing.F) {
	for _, s := range []string{
		`{"type":"auth","payload":{"device_id":"dev-1"}}`,
		`{"payload":{"device_id":"\u00e9\ud83d\ude00"}}`,
		`{"payload":{"device_id":null}}`, `{"payload":[]}`, `[]`, `"x"`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got := deviceIDOf(in)
		if got == "" {
			return
		}
		var top map[string]json.RawMessage
		var payload map[string]any
		if json.Unmarshal(in, &top) != nil || json.Unmarshal(top["payload"], &payload) != nil {
			t.Fatalf("device id %q from invalid input", got)
		}
		if s, ok := payload["device_id"].(string); !ok || s != got {
			t.Fatalf("device id %q, payload says %v", got, payload["device_id"])
		}
	})
}

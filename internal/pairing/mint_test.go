package pairing

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeRelay behaves like hermes-relay's loopback /pairing/mint: it reads the
// request, converts ttl_seconds and grants to floats, carries the endpoints
// verbatim, signs with testQRKey and answers with the QR payload, the
// invite URL and the code expiry. Hooks let a test make it misbehave.
type fakeRelay struct {
	t        *testing.T
	requests atomic.Int32
	lastBody atomic.Pointer[[]byte]
	// mutate changes the payload tree before signing.
	mutate func(map[string]any)
	// answer replaces the whole response.
	answer func(w http.ResponseWriter, r *http.Request) bool
	// response changes the response object before it is written.
	response func(map[string]any)
}

func (f *fakeRelay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.requests.Add(1)
	if f.answer != nil && f.answer(w, r) {
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/pairing/mint" {
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	f.lastBody.Store(&body)
	req, err := ParseObject(body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"ok":false,"error":"invalid JSON"}`)
		return
	}
	relay := map[string]any{"url": "ws://192.0.2.10:8767", "code": testCode}
	if v, ok := req["ttl_seconds"]; ok {
		f, _ := numberValue(v)
		relay["ttl_seconds"] = f
	}
	if g, ok := req["grants"].(map[string]any); ok {
		fg := map[string]any{}
		for k, v := range g {
			fv, _ := numberValue(v)
			fg[k] = fv
		}
		relay["grants"] = fg
	}
	tree := map[string]any{"hermes": IntOf(2), "host": "192.0.2.10", "port": IntOf(8642), "key": testAPIKey,
		"tls": false, "relay": relay}
	if e, ok := req["endpoints"].([]any); ok && len(e) > 0 {
		tree["hermes"] = IntOf(3)
		tree["endpoints"] = e
	}
	if d, ok := req["dashboard_url"].(string); ok {
		tree["dashboard_url"] = d
	}
	if f.mutate != nil {
		f.mutate(tree)
	}
	sig, err := Sign(testQRKey, tree)
	if err != nil {
		f.t.Error(err)
	}
	tree["sig"] = sig
	qr, err := Canonical(tree)
	if err != nil {
		f.t.Error(err)
	}
	resp := map[string]any{"ok": true, "code": testCode, "qr_payload": string(qr), "pairing_url": InviteURL(qr),
		"expires_at": IntOf(1780000000), "host": "192.0.2.10", "port": IntOf(8642), "tls": false,
		"relay_url": "ws://192.0.2.10:8767"}
	if f.response != nil {
		f.response(resp)
	}
	out, err := Canonical(resp)
	if err != nil {
		f.t.Error(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(out)
}

func startRelay(t *testing.T, f *fakeRelay) *url.URL {
	t.Helper()
	f.t = t
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestMintRoundTrip(t *testing.T) {
	f := &fakeRelay{}
	base := startRelay(t, f)
	eps := testEndpoints(t, true, "192.168.1.5")
	ttl := int64(2592000)
	resp, err := Mint(context.Background(), base, MintRequest{
		Endpoints: eps, TTLSeconds: &ttl, Grants: map[string]int64{"terminal": 604800, "bridge": 86400},
		DashboardURL: "https://dash.example/hermes",
	})
	if err != nil {
		t.Fatalf("Mint: %v", err)
	}
	if resp.Code != testCode || resp.ExpiresAt != 1780000000 || resp.Payload == nil {
		t.Fatalf("Mint response: %v", resp)
	}
	// The request body is canonical JSON with exactly the members we chose.
	body := *f.lastBody.Load()
	m, err := ParseObject(body)
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := Canonical(m); string(c) != string(body) {
		t.Errorf("request body is not canonical JSON")
	}
	want := `"dashboard_url":"https://dash.example/hermes","endpoints":[`
	if !strings.HasPrefix(string(body), "{"+want) || !strings.HasSuffix(string(body), `],"grants":{"bridge":86400,"terminal":604800},"ttl_seconds":2592000}`) {
		t.Errorf("request body shape: %.120s...%.80s", body, body[len(body)-80:])
	}
	if err := resp.Payload.CheckEndpoints(eps); err != nil {
		t.Fatalf("CheckEndpoints: %v", err)
	}
	if err := Verify(testQRKey, resp.Payload.Tree()); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	rb := resp.Payload.Relay
	if rb == nil || rb.TTLSeconds == nil || *rb.TTLSeconds != 2592000 || rb.Grants["terminal"] != 604800 {
		t.Errorf("relay block: %+v", rb)
	}
	if !strings.Contains(string(resp.QRPayload), `"ttl_seconds":2592000.0`) {
		t.Errorf("the Relay's float ttl is not kept as written")
	}
	if s := resp.String(); strings.Contains(s, testCode) || strings.Contains(s, testAPIKey) {
		t.Errorf("MintResponse.String reveals secrets: %s", s)
	}
}

func TestMintOmitsUnsetMembers(t *testing.T) {
	f := &fakeRelay{}
	base := startRelay(t, f)
	eps := testEndpoints(t, false)
	if _, err := Mint(context.Background(), base, MintRequest{Endpoints: eps}); err != nil {
		t.Fatal(err)
	}
	m, _ := ParseObject(*f.lastBody.Load())
	if len(m) != 1 || m["endpoints"] == nil {
		t.Errorf("request members: %v", keysOf(m))
	}
	zero := int64(0)
	if _, err := Mint(context.Background(), base, MintRequest{Endpoints: eps, TTLSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(*f.lastBody.Load()), `,"ttl_seconds":0}`) {
		t.Errorf("ttl 0 (never) not sent as 0")
	}
}

func keysOf(m map[string]any) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	return k
}

func TestMintRefusals(t *testing.T) {
	eps := testEndpoints(t, true)
	token := testBroker().Token
	cases := map[string]struct {
		relay *fakeRelay
		check func(error) bool
		want  string
	}{
		"403 with error text": {
			relay: &fakeRelay{answer: func(w http.ResponseWriter, r *http.Request) bool {
				w.WriteHeader(http.StatusForbidden)
				io.WriteString(w, `{"ok":false,"error":"loopback only \u001b[31m `+token+`"}`)
				return true
			}},
			check: func(err error) bool {
				var re *RelayRefusedError
				return errors.As(err, &re) && re.Status == 403 && strings.Contains(re.Message, "loopback only [31m [redacted]")
			},
			want: "loopback callers",
		},
		"404 old relay": {
			relay: &fakeRelay{answer: func(w http.ResponseWriter, r *http.Request) bool { http.NotFound(w, r); return true }},
			want:  "upgrade it",
		},
		"ok false": {
			relay: &fakeRelay{response: func(m map[string]any) { m["ok"] = false; m["error"] = "could not mint a unique code" }},
			want:  "could not mint a unique code",
		},
		"redirect not followed": {
			relay: &fakeRelay{answer: func(w http.ResponseWriter, r *http.Request) bool {
				http.Redirect(w, r, "http://192.0.2.1/pairing/mint", http.StatusTemporaryRedirect)
				return true
			}},
			want: "HTTP 307",
		},
		"code not matching payload": {
			relay: &fakeRelay{response: func(m map[string]any) { m["code"] = "ZZZZZZ" }},
			want:  "does not carry the minted code",
		},
		"pairing_url of another payload": {
			relay: &fakeRelay{response: func(m map[string]any) { m["pairing_url"] = InviteURL([]byte(`{"x":1}`)) }},
			want:  "pairing_url does not carry its qr_payload",
		},
		"float expires_at": {
			relay: &fakeRelay{response: func(m map[string]any) { m["expires_at"] = 1780000000.0 }},
			want:  "no integer expires_at",
		},
		"no qr_payload": {
			relay: &fakeRelay{response: func(m map[string]any) { delete(m, "qr_payload") }},
			want:  "no qr_payload",
		},
		"bad code": {
			relay: &fakeRelay{response: func(m map[string]any) { m["code"] = "abc" }},
			want:  "no valid code",
		},
		"not JSON": {
			relay: &fakeRelay{answer: func(w http.ResponseWriter, r *http.Request) bool {
				io.WriteString(w, "<html>"+testAPIKey+"</html>")
				return true
			}},
			want: "invalid JSON",
		},
		"oversized answer": {
			relay: &fakeRelay{answer: func(w http.ResponseWriter, r *http.Request) bool {
				w.Write([]byte(`{"ok":true,"x":"` + strings.Repeat("a", 8<<10) + `"}`))
				return true
			}},
			want: "exceeds 4096 bytes",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			relay := tc.relay
			base := startRelay(t, relay)
			o := DefaultMintOptions()
			o.MaxResponseBytes = 4096
			if name != "oversized answer" {
				o.MaxResponseBytes = 256 << 10
			}
			_, err := MintWithOptions(context.Background(), base, MintRequest{Endpoints: eps}, o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Mint = %v, want an error containing %q", err, tc.want)
			}
			if tc.check != nil && !tc.check(err) {
				t.Errorf("error details: %#v", err)
			}
			assertNoSecrets(t, err)
			if n := relay.requests.Load(); n != 1 {
				t.Errorf("the Relay saw %d requests, want 1", n)
			}
		})
	}
}

func TestMintTimeout(t *testing.T) {
	release := make(chan struct{})
	relay := &fakeRelay{answer: func(w http.ResponseWriter, r *http.Request) bool {
		select {
		case <-r.Context().Done():
		case <-release:
		}
		return true
	}}
	base := startRelay(t, relay)
	defer close(release)
	o := DefaultMintOptions()
	o.Timeout = 100 * time.Millisecond
	_, err := MintWithOptions(context.Background(), base, MintRequest{Endpoints: testEndpoints(t, false)}, o)
	if !errors.Is(err, ErrRelayUnreachable) || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("Mint = %v, want ErrRelayUnreachable after the deadline", err)
	}
}

func TestMintRelayDown(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	u, _ := url.Parse(srv.URL)
	srv.Close()
	_, err := Mint(context.Background(), u, MintRequest{Endpoints: testEndpoints(t, false)})
	if !errors.Is(err, ErrRelayUnreachable) {
		t.Fatalf("Mint = %v, want ErrRelayUnreachable", err)
	}
}

func TestCheckRelayBase(t *testing.T) {
	for _, s := range []string{"http://127.0.0.1:8767", "http://127.0.0.2:1/prefix", "http://[::1]:8767", "http://localhost:8767"} {
		u, _ := url.Parse(s)
		if err := CheckRelayBase(u); err != nil {
			t.Errorf("CheckRelayBase(%s): %v", s, err)
		}
	}
	for _, s := range []string{"https://127.0.0.1:8767", "http://192.0.2.1:8767", "http://example.com", "http://u:p@127.0.0.1:1",
		"http://127.0.0.1:1/?x=1", "http://127.0.0.1:1/#f", "http://[::ffff:192.0.2.1]:1", "http://0.0.0.0:1", "unix:///run/x"} {
		u, _ := url.Parse(s)
		if err := CheckRelayBase(u); err == nil {
			t.Errorf("CheckRelayBase(%s) accepted it", s)
		} else if strings.Contains(err.Error(), ":p@") {
			t.Errorf("error shows the URL's password: %v", err)
		}
	}
	if err := CheckRelayBase(nil); err == nil {
		t.Error("accepted a nil URL")
	}
}

func TestLoopbackDialGuard(t *testing.T) {
	// The guard runs on the resolved address, so a name that resolves
	// elsewhere cannot carry the request off the host.
	for _, a := range []string{"192.0.2.1:80", "[2001:db8::1]:80", "[::ffff:192.0.2.1]:80", "garbage"} {
		if err := loopbackOnly("tcp", a, nil); err == nil {
			t.Errorf("loopbackOnly(%s) allowed it", a)
		}
	}
	for _, a := range []string{"127.0.0.1:80", "127.0.0.2:80", "[::1]:80", "[::ffff:127.0.0.1]:80"} {
		if err := loopbackOnly("tcp", a, nil); err != nil {
			t.Errorf("loopbackOnly(%s): %v", a, err)
		}
	}
}

func TestMintRequestValidation(t *testing.T) {
	base, _ := url.Parse("http://127.0.0.1:1")
	eps := testEndpoints(t, false)
	neg := int64(-1)
	for name, req := range map[string]MintRequest{
		"no endpoints":         {},
		"negative ttl":         {Endpoints: eps, TTLSeconds: &neg},
		"bad grant":            {Endpoints: eps, Grants: map[string]int64{"Bad": 1}},
		"dashboard path /":     {Endpoints: eps, DashboardURL: "https://dash.example/"},
		"dashboard userinfo":   {Endpoints: eps, DashboardURL: "https://u:p@dash.example"},
		"dashboard relative":   {Endpoints: eps, DashboardURL: "/dashboard"},
		"dashboard javascript": {Endpoints: eps, DashboardURL: "javascript:alert(1)"},
	} {
		if _, err := Mint(context.Background(), base, req); err == nil || errors.Is(err, ErrRelayUnreachable) {
			t.Errorf("%s: Mint = %v, want a validation error before any request", name, err)
		}
	}
	if err := (MintOptions{Timeout: 0, MaxResponseBytes: 4096}).Validate(); err == nil {
		t.Error("zero timeout accepted")
	}
	if err := (MintOptions{Timeout: time.Second, MaxResponseBytes: 10}).Validate(); err == nil {
		t.Error("tiny response limit accepted")
	}
}

func FuzzParseMintResponse(f *testing.F) {
	qr := []byte(pythonPayload)
	ok, _ := Canonical(map[string]any{"ok": true, "code": "ABC123", "qr_payload": pythonPayload,
		"pairing_url": InviteURL(qr), "expires_at": IntOf(1780000000)})
	f.Add(ok)
	f.Add([]byte(`{"ok":false,"error":"x"}`))
	f.Add([]byte(`{"ok":true,"code":"ABC123","qr_payload":"{}","pairing_url":"hermes-relay://pair?payload=e30","expires_at":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := parseMintResponse(data, []string{"secret-token"})
		if err != nil {
			if strings.Contains(err.Error(), "secret-token") {
				t.Fatalf("error reveals a secret: %v", err)
			}
			return
		}
		if r.Payload == nil || r.Payload.Relay == nil || r.Payload.Relay.Code != r.Code || r.ExpiresAt <= 0 {
			t.Fatalf("accepted an inconsistent response: %v", r)
		}
		if InviteURL(r.QRPayload) != r.PairingURL {
			t.Fatal("accepted a pairing_url that does not carry the payload")
		}
	})
}

package client

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/hermes-securelink/securelink/internal/testfake"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// TestBrokerSeesNoApplicationSecrets records the outer connection as the
// broker sees it while an API request with a bearer token travels through
// DialTLS, and proves that neither the bearer nor the path is readable
// there — while the front did receive both, and the recorder did see the
// plaintext protocol (so the search is not vacuous).
func TestBrokerSeesNoApplicationSecrets(t *testing.T) {
	e := newEnv(t, nil)
	id, _ := newIdentity(t)
	front := newHTTPFront(t, id)
	h := e.host(0, front.serve)
	tok := wire.NewToken()
	h.publishRoute("route-1", tok)

	rec := &testfake.Recorder{}
	cfg := e.config(0, wire.KindRoute, tok)
	cfg.WrapOuter = rec.Wrap
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	tc, err := DialTLS(ctx, cfg, authorityHost, id.Pin)
	if err != nil {
		t.Fatal(err)
	}
	hdr := http.Header{"Authorization": {"Bearer SECRET-XYZ"}, "Cookie": {"session=COOKIE-ABC"}}
	if code, _ := get(t, tc, "/api/secret-path", hdr); code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	tc.Close()

	reqs := front.requests()
	if len(reqs) != 1 || reqs[0].URL.Path != "/api/secret-path" || reqs[0].Header.Get("Authorization") != "Bearer SECRET-XYZ" {
		t.Fatalf("the front did not get the request: %v", reqs)
	}

	sent, received, err := rec.BrokerView()
	if err != nil {
		t.Fatal(err)
	}
	// Positive controls: the view is the broker's plaintext.
	for _, want := range []string{"GET /v1/connect HTTP/1.1", `"type":"register"`, string(tok)} {
		if !bytes.Contains(sent, []byte(want)) {
			t.Fatalf("the recorded client bytes lack %q: the capture is not the broker's view", want)
		}
	}
	if !bytes.Contains(received, []byte(`"type":"matched"`)) {
		t.Fatal("the recorded broker bytes lack `matched`")
	}
	if bytes.Contains(rec.Sent(), []byte(`"type":"register"`)) {
		t.Fatal("client frames should be masked on the wire")
	}
	for _, secret := range []string{"SECRET-XYZ", "/api/secret-path", "secret-path", "COOKIE-ABC", "Authorization"} {
		found, err := rec.Contains([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		if found {
			t.Fatalf("the broker could read %q", secret)
		}
	}
	if rec.Truncated() {
		t.Fatal("capture truncated")
	}
}

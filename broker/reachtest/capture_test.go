package reachtest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hermes-securelink/securelink/internal/testfake"

	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// TestBrokerSeesNoSecrets records every byte the broker process reads and
// writes during a full session, decrypted, and checks that none of the
// phone's or the host's secrets is among them.
//
// How the broker's view is captured: the test terminates the outer TLS
// itself and hands the broker the decrypted connections (the broker runs
// with insecure_plaintext on 127.0.0.1, as it would behind a TLS-terminating
// proxy), each wrapped in a testfake.Recorder. So the recorders hold exactly
// the bytes the broker's HTTP server reads and writes: the upgrade requests
// and every WebSocket frame of the host connection and of each client
// connection. Connector and clients are unchanged and speak wss:// with the
// test CA. Clients additionally record their side with Config.WrapOuter.
// Recorder.BrokerView unmasks client-to-broker frames, so a secret split
// across frames or hidden by the mask would still be found.
//
// The session: registration and a bootstrap publish; a phone pairs through
// a bootstrap stream (Relay auth with pairing code and device id, auth.ok
// with the session token and the route credential, Relay messages both
// ways); then reconnects with the route credential and calls the API with
// a bearer token and a cookie and the Dashboard with a cookie, both on
// secret paths, and gets cookies back.
func TestBrokerSeesNoSecrets(t *testing.T) {
	r := startReach(t, reachOptions{broker: brokerOptions{capture: true}})
	pairingCode, deviceID := testenv.RandomSecret("pair-"), testenv.RandomSecret("device-")
	apiBearer, apiCookie, dashCookie := testenv.RandomSecret("bearer-"), testenv.RandomSecret("cookie-"), testenv.RandomSecret("dashcookie-")
	apiPath, dashPath := "/v1/"+testenv.RandomSecret("apipath-"), "/"+testenv.RandomSecret("dashpath-")
	setCookie, relayMsg := testenv.RandomSecret("setcookie-"), testenv.RandomSecret("relay-message-")
	r.front.api.handle(apiPath, func(w http.ResponseWriter, req *http.Request) {
		io.WriteString(w, `{"ok":true}`)
	})
	r.front.dash.handle(dashPath, func(w http.ResponseWriter, req *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "sid", Value: setCookie})
		io.WriteString(w, "dashboard")
	})

	var phone1, phone2 testfake.Recorder
	in, err := r.dialTLS(wire.KindBootstrap, r.bootstrap(), authorityHost, r.front.pin(), phone1.Wrap)
	if err != nil {
		t.Fatal(err)
	}
	ws, authOK := in.relayWS(authFrame(map[string]string{"pairing_code": pairingCode, "device_id": deviceID}))
	rc := parseAuthOK(t, authOK)
	echo(t, ws, relayMsg)
	ws.CloseNow()
	in.tc.Close()

	in2, err := r.dialTLS(wire.KindRoute, rc.token, authorityHost, r.front.pin(), phone2.Wrap)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := in2.get("/api"+apiPath, http.Header{
		"Authorization": {"Bearer " + apiBearer},
		"Cookie":        {"session=" + apiCookie},
	})
	if resp.StatusCode != http.StatusOK || string(body) != `{"ok":true}` {
		t.Fatalf("API: %d %q", resp.StatusCode, body)
	}
	resp, body = in2.get("/dashboard"+dashPath, http.Header{"Cookie": {"dash=" + dashCookie}})
	if resp.StatusCode != http.StatusOK || string(body) != "dashboard" || !strings.Contains(resp.Header.Get("Set-Cookie"), setCookie) {
		t.Fatalf("Dashboard: %d %q %q", resp.StatusCode, body, resp.Header.Get("Set-Cookie"))
	}
	in2.tc.Close()

	// The secrets really travelled, through the broker, to the upstreams.
	var sawAPI, sawDash bool
	for _, s := range r.front.api.requestsSeen() {
		// (The front drops cookies towards the API; the phone still sent it.)
		sawAPI = sawAPI || (s.path == apiPath && s.authorization == "Bearer "+apiBearer)
	}
	for _, s := range r.front.dash.requestsSeen() {
		sawDash = sawDash || (s.path == dashPath && s.cookie == "dash="+dashCookie)
	}
	if !sawAPI || !sawDash {
		t.Fatalf("the upstreams did not get the secrets (API %v, Dashboard %v)", sawAPI, sawDash)
	}
	relayAuth := string(r.front.relay.Auths()[0])
	if !strings.Contains(relayAuth, pairingCode) || !strings.Contains(relayAuth, deviceID) {
		t.Fatalf("the Relay got %s", relayAuth)
	}

	// End every connection, so each capture ends on a frame boundary.
	testenv.WaitFor(t, "the streams to end", func() bool { return r.tb.B.Stats().ActiveStreams == 0 })
	r.stopC()
	testenv.WaitFor(t, "the host to go offline", func() bool { return r.tb.B.Stats().HostsOnline == 0 })
	r.tb.Stop()

	secrets := map[string]string{
		"pairing code": pairingCode, "device id": deviceID, "Relay session token": rc.sessionToken,
		"API bearer": apiBearer, "API cookie": apiCookie, "Dashboard cookie": dashCookie,
		"Set-Cookie value": setCookie, "API path": apiPath, "Dashboard path": dashPath,
		"Relay message": relayMsg,
	}
	recs := r.tb.recorders()
	if len(recs) != 3 {
		t.Fatalf("the broker accepted %d connections, want 3 (host, two phones)", len(recs))
	}
	var all [][]byte
	for i, rec := range append(recs, &phone1, &phone2) {
		sent, received, err := rec.BrokerView()
		if err != nil || rec.Truncated() {
			t.Fatalf("capture %d is incomplete: %v", i, err)
		}
		all = append(all, sent, received, rec.Sent(), rec.Received())
		for what, s := range secrets {
			if found, _ := rec.Contains([]byte(s)); found {
				t.Errorf("capture %d contains the %s", i, what)
			}
		}
	}
	// The JSON form of the session token (escapes) as well.
	sessJSON, _ := json.Marshal(rc.sessionToken)
	for _, b := range all {
		if bytes.Contains(b, sessJSON[1:len(sessJSON)-1]) {
			t.Error("a capture contains the escaped session token")
		}
	}

	// Positive controls: the captures are the real thing.
	view := func(rec *testfake.Recorder) string {
		sent, received, _ := rec.BrokerView()
		return string(received) + string(sent)
	}
	host, p1, p2 := view(recs[0]), view(recs[1]), view(recs[2])
	for _, want := range []string{`"type":"register"`, `"role":"host"`, r.tb.hostID, `"registered"`,
		`"publish_bootstrap"`, `"publish_route"`, rc.credentialID, `"type":"open"`, "GET " + wire.ConnectPath} {
		if !strings.Contains(host, want) {
			t.Errorf("the host connection's capture lacks %q", want)
		}
	}
	if !strings.Contains(p1, `"credential_kind":"bootstrap"`) || !strings.Contains(p1, `"matched"`) ||
		!strings.Contains(p2, `"credential_kind":"route"`) || !strings.Contains(p2, string(rc.token)) {
		t.Error("the phones' captures lack their registrations")
	}
	if !strings.Contains(view(&phone2), string(rc.token)) {
		t.Error("the client-side capture lacks the route registration")
	}
	if len(host) < 10<<10 {
		t.Errorf("the host connection's capture holds only %d bytes: the streams' data is missing", len(host))
	}
	// Nor in anybody's logs.
	for name, logs := range map[string]string{"broker": r.tb.Logs.String(), "connector": r.clog.String()} {
		for what, s := range secrets {
			if strings.Contains(logs, s) {
				t.Errorf("the %s log contains the %s", name, what)
			}
		}
		if strings.Contains(logs, string(rc.token)) || strings.Contains(logs, string(r.tb.hostToken)) {
			t.Errorf("the %s log contains a Reach token", name)
		}
	}
	if st := r.c.Status(); st.State != connector.StateStopped {
		t.Fatalf("connector %+v", st)
	}
}

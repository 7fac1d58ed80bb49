package relay

import (
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

// syncBuffer collects log lines written from the bridge's goroutines.
type syncBuffer = testfake.LogBuffer

// Logs never contain pairing codes, session tokens, the proxy secret or the
// client's query string (which may carry credentials), on any path through
// the bridge, at debug level: an unreachable Relay, a failed and a
// successful authentication.
func TestBridgeLogsCarryNoSecrets(t *testing.T) {
	const querySecret, proxySecret = "query-secret-3", "proxy-secret-4"
	var logs syncBuffer
	logTo := func(o *Options) {
		o.ProxySecret = proxySecret
		o.Log = zerolog.New(&logs).Level(zerolog.DebugLevel)
	}

	// A Relay that is down: the dial error must not quote the request URL.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := &url.URL{Scheme: "http", Host: ln.Addr().String()}
	ln.Close()
	o := Options{Upstream: down}
	logTo(&o)
	front := frontFor(t, newBridge(t, o), false)
	if _, resp, err := dial(t, front, dialOpt{query: "token=" + querySecret}); err == nil || resp == nil || resp.StatusCode != 502 {
		t.Fatalf("dial with the Relay down: %v, %v; want 502", resp, err)
	}

	relay, _, front := setup(t, nil, logTo)
	failAuth(t, front, "127.0.0.1")
	c := mustDial(t, front, dialOpt{query: "token=" + querySecret})
	if got := testfake.Authenticate(t, c, testfake.GoodCode); got != testfake.AuthOKMsg {
		t.Fatalf("verdict %s", got)
	}
	c.Close(websocket.StatusNormalClosure, "")
	relay.NextEnd()
	relay.NextEnd()
	waitFor(t, "the bridge to log both sessions' end", func() bool {
		return strings.Count(logs.String(), "relay: closed") == 2
	})

	out := logs.String()
	if !strings.Contains(out, "relay: upstream upgrade failed") {
		t.Fatalf("the Relay-down failure was not logged; nothing was checked:\n%s", out)
	}
	for _, s := range []string{querySecret, proxySecret, testfake.GoodCode, testfake.SessionToken, "WRONG1"} {
		if strings.Contains(out, s) {
			t.Errorf("log contains %q:\n%s", s, out)
		}
	}
}

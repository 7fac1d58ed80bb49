package reachtest

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// getRoute runs a phone's first session: a bootstrap stream, /relay/ws,
// auth with a pairing code; the auth.ok carries the route credential.
func getRoute(t *testing.T, r *reach, pairingCode, deviceID string) (routeCredential, *websocket.Conn) {
	t.Helper()
	in := r.open()
	ws, authOK := in.relayWS(authFrame(map[string]string{"pairing_code": pairingCode, "device_id": deviceID}))
	return parseAuthOK(t, authOK), ws
}

// echo sends msg on ws and expects it back.
func echo(t *testing.T, ws *websocket.Conn, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	if err := ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("echo write: %v", err)
	}
	if _, got, err := ws.Read(ctx); err != nil || string(got) != msg {
		t.Fatalf("echo: %q %v", got, err)
	}
}

// rawListener stands in the broker's port while it is down and keeps the
// first bytes of every connection.
type rawListener struct {
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	seen [][]byte
}

func listenRaw(t *testing.T, addr string) *rawListener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("take over the broker port: %v", err)
	}
	rl := &rawListener{ln: ln}
	rl.wg.Add(1)
	go func() {
		defer rl.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rl.wg.Add(1)
			go func() {
				defer rl.wg.Done()
				defer c.Close()
				// A ClientHello arrives at once; whatever a peer sends
				// before it gets an answer is what it would leak.
				c.SetReadDeadline(time.Now().Add(time.Second))
				buf := make([]byte, 8<<10)
				n, _ := c.Read(buf)
				rl.mu.Lock()
				rl.seen = append(rl.seen, buf[:n])
				rl.mu.Unlock()
			}()
		}
	}()
	return rl
}

func (rl *rawListener) close() {
	rl.ln.Close()
	rl.wg.Wait()
}

func (rl *rawListener) conns() [][]byte {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return append([][]byte(nil), rl.seen...)
}

// TestBrokerRestartKeepsRoutesAndNeverDowngrades: the broker is killed
// (connections cut, no close frames, state file as it was on disk) and
// restarted on the same port with the same files. While it is down, a
// plaintext listener on its port sees the connector and a client offer
// nothing but a TLS ClientHello; ws:// URLs are refused by both configs
// without a connection. After the restart the connector registers again and
// a route credential handed out before the crash still opens a stream.
func TestBrokerRestartKeepsRoutesAndNeverDowngrades(t *testing.T) {
	r := startReach(t, reachOptions{})
	rc, ws := getRoute(t, r, testenv.RandomSecret("pair-"), testenv.RandomSecret("device-"))
	echo(t, ws, "before the crash")
	attempts := r.c.Status().Attempts

	r.tb.kill(t)
	testenv.WaitFor(t, "the connector to notice", func() bool { return r.c.Status().State != connector.StateConnected })
	raw := listenRaw(t, r.tb.Addr)
	testenv.WaitFor(t, "the connector to try the plaintext listener twice", func() bool { return len(raw.conns()) >= 2 })

	// A client with the route credential tries too.
	ctx, cancel := context.WithTimeout(context.Background(), step)
	defer cancel()
	if c, err := client.Dial(ctx, r.clientConfig(wire.KindRoute, rc.token)); err == nil {
		c.Close()
		t.Fatal("a client got a stream from a plaintext listener")
	}
	// ws:// is refused before anything is dialed: a listener of its own
	// (nothing else knows its port) sees no connection.
	spare := listenRaw(t, "127.0.0.1:0")
	plainCfg := r.clientConfig(wire.KindRoute, rc.token)
	plainCfg.BrokerURL = "ws://" + spare.ln.Addr().String() + wire.ConnectPath
	if c, err := client.Dial(ctx, plainCfg); err == nil || !strings.Contains(err.Error(), "wss") {
		if c != nil {
			c.Close()
		}
		t.Fatalf("client accepted a ws:// broker URL: %v", err)
	}
	ccfg, _ := connectorConfig(t, r.tb)
	ccfg.BrokerURL = plainCfg.BrokerURL
	if _, err := connector.New(ccfg); err == nil || !strings.Contains(err.Error(), "wss") {
		t.Fatalf("connector accepted a ws:// broker URL: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // give a wrongly started dial time to arrive
	spare.close()
	if n := len(spare.conns()); n != 0 {
		t.Fatalf("a ws:// configuration made %d connections", n)
	}
	raw.close()
	conns := raw.conns()
	if len(conns) < 3 {
		t.Fatalf("the plaintext listener saw %d connections, want the connector's and the client's", len(conns))
	}
	for i, b := range conns {
		switch {
		case len(b) == 0:
			t.Fatalf("connection %d sent nothing", i)
		case b[0] != 0x16:
			t.Fatalf("connection %d began with %q, not a TLS handshake record", i, b[:min(len(b), 16)])
		case bytes.Contains(b, []byte("GET ")), bytes.Contains(b, []byte("register")),
			bytes.Contains(b, []byte(r.tb.hostToken)), bytes.Contains(b, []byte(rc.token)),
			bytes.Contains(b, []byte(wire.ConnectPath)):
			t.Fatalf("connection %d leaked plaintext: %q", i, b)
		}
	}

	r.tb.Start() // same port, same hosts and state files
	testenv.WaitFor(t, "the connector to register again", func() bool {
		st := r.c.Status()
		return st.State == connector.StateConnected && st.Attempts > attempts
	})
	in, err := r.dialTLS(wire.KindRoute, rc.token, authorityHost, r.front.pin(), nil)
	if err != nil {
		t.Fatalf("the route credential after the restart: %v", err)
	}
	sess, _ := json.Marshal(rc.sessionToken)
	ws2, authOK := in.relayWS(`{"type":"auth","payload":{"session_token":` + string(sess) + `}}`)
	if rc2 := parseAuthOK(t, authOK); rc2.credentialID != rc.credentialID {
		t.Fatalf("the session got another credential id after the restart")
	}
	echo(t, ws2, "after the restart")
}

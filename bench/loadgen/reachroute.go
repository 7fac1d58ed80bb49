package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/admin"
)

// adminBootstrap asks the front's admin socket for a one-stream bootstrap
// credential, as `securelink pair` does.
func adminBootstrap(ctx context.Context, sock string, ttl int) (admin.BootstrapReply, error) {
	b, _, err := admin.NewClient(sock).Bootstrap(ctx, admin.BootstrapRequest{TTLSeconds: int64(ttl)})
	if err != nil {
		return b, fmt.Errorf("POST %s: %w", admin.PathBootstrap, err)
	}
	return b, nil
}

// routeCredential is payload.route_credential of the auth.ok a /relay/ws
// connection receives when it arrived through a broker stream.
type routeCredential struct {
	Kind         string          `json:"kind"`
	BrokerURL    string          `json:"broker_url"`
	HostID       string          `json:"host_id"`
	CredentialID string          `json:"credential_id"`
	Token        string          `json:"token"`
	ExpiresAt    json.RawMessage `json:"expires_at"`
}

// parseRouteCredential reads the route credential out of an auth.ok frame.
func parseRouteCredential(frame []byte) (routeCredential, error) {
	var m struct {
		Channel string `json:"channel"`
		Type    string `json:"type"`
		Payload struct {
			RouteCredential *routeCredential `json:"route_credential"`
		} `json:"payload"`
	}
	if err := json.Unmarshal(frame, &m); err != nil {
		return routeCredential{}, errors.New("the first reply is not JSON")
	}
	if m.Channel != "system" || m.Type != "auth.ok" {
		return routeCredential{}, fmt.Errorf("the first reply is %s/%s, not system/auth.ok", m.Channel, m.Type)
	}
	rc := m.Payload.RouteCredential
	if rc == nil {
		return routeCredential{}, errors.New("auth.ok carries no payload.route_credential (did the stream arrive through the broker?)")
	}
	if rc.Kind != "broker_route" {
		return routeCredential{}, fmt.Errorf("route_credential.kind is %q, want broker_route", rc.Kind)
	}
	if !wire.ValidWireToken(rc.Token) {
		return routeCredential{}, errors.New("route_credential.token is not a valid token")
	}
	if _, err := strconv.ParseInt(string(rc.ExpiresAt), 10, 64); err != nil {
		return routeCredential{}, errors.New("route_credential.expires_at is not a JSON integer")
	}
	return *rc, nil
}

// cmdReachRoute turns a bootstrap (one stream, ever) into a route
// credential (several streams, reusable) the way a phone does: it connects
// to /relay/ws through the broker with the bootstrap, authenticates with the
// Relay, and keeps the route_credential the front adds to auth.ok.
func cmdReachRoute(args []string) error {
	fs := flag.NewFlagSet("reach-route", flag.ExitOnError)
	sock := fs.String("admin", "", "the front's admin socket (<state_dir>/admin.sock)")
	addr := fs.String("addr", "", "the front's host:port (its authority)")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the front")
	caFile := fs.String("ca-file", "", "the broker's certificate (PEM)")
	out := fs.String("out", "", "write the route credential here (0600)")
	ttl := fs.Int("ttl", int(wire.DefaultBootstrapTTL/time.Second), "bootstrap lifetime in seconds")
	device := fs.String("device", "bench", "device of the Relay login (auth id and device_id): one route credential per device")
	fs.Parse(args)
	if !validDeviceName(*device) {
		return errors.New("-device must be 1..32 letters, digits, '-' or '_'")
	}
	if *sock == "" || *out == "" {
		return errors.New("need -admin and -out")
	}
	if err := loopbackOnly(*addr); err != nil {
		return err
	}
	pool, err := loadPool(*caFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	boot, err := adminBootstrap(ctx, *sock, *ttl)
	if err != nil {
		return err
	}
	if err := brokerLoopback(boot.BrokerURL); err != nil {
		return err
	}
	cfg := reachCred{boot.BrokerURL, boot.HostID, "bootstrap", wire.Secret(boot.Token)}.config(pool)
	ws, err := dialWSVia(ctx, "wss://"+*addr+"/relay/ws", func(ctx context.Context) (*tls.Conn, error) {
		return client.DialTLS(ctx, cfg, frontServerName, *pin)
	})
	if err != nil {
		return fmt.Errorf("/relay/ws through the broker with the bootstrap: %w", err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"channel":"system","type":"auth","id":"route-`+*device+`","payload":{"session_token":"bench","device_id":"`+*device+`"}}`)); err != nil {
		return err
	}
	_, first, err := ws.Read(ctx)
	if err != nil {
		return fmt.Errorf("waiting for auth.ok: %w", err)
	}
	rc, err := parseRouteCredential(first)
	if err != nil {
		return err
	}
	if rc.BrokerURL != boot.BrokerURL || rc.HostID != boot.HostID {
		return errors.New("route_credential names another broker or host than the bootstrap")
	}
	if err := writeCred(*out, reachCred{rc.BrokerURL, rc.HostID, "route", wire.Secret(rc.Token)}); err != nil {
		return err
	}
	ws.Close(websocket.StatusNormalClosure, "")
	fmt.Printf("route credential_id=%s expires_at=%s host_id=%s broker_url=%s\n", rc.CredentialID, rc.ExpiresAt, rc.HostID, rc.BrokerURL)
	return nil
}

// validDeviceName keeps -device safe to splice into the JSON auth frame.
func validDeviceName(s string) bool {
	if len(s) == 0 || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

package server

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

func TestPublishErrorsKeepHostConnected(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxCredentialsPerHost = 3 })
	host := e.host(0)
	other := e.host(1)
	now := e.clock.Now().Unix()
	digest := wire.TokenDigest("some token").String()
	device := wire.TokenDigest("device").String()
	taken := wire.NewToken()
	e.publishRoute(other, "theirs", taken)

	cases := []struct {
		name, msg string
		code      wire.Code
	}{
		{"version true", fmt.Sprintf(`{"type":"publish_route","protocol_version":true,"credential_id":"a","token_sha256":"%s","expires_at":%d,"device_id_hash":"%s"}`, digest, now+60, device), wire.CodeUnsupportedVersion},
		{"bad credential_id", fmt.Sprintf(`{"type":"publish_route","protocol_version":1,"credential_id":"a b","token_sha256":"%s","expires_at":%d,"device_id_hash":"%s"}`, digest, now+60, device), wire.CodeUnauthorized},
		{"bad digest", fmt.Sprintf(`{"type":"publish_route","protocol_version":1,"credential_id":"a","token_sha256":"%s","expires_at":%d,"device_id_hash":"%s"}`, digest[:42], now+60, device), wire.CodeUnauthorized},
		{"expires_at string", fmt.Sprintf(`{"type":"publish_route","protocol_version":1,"credential_id":"a","token_sha256":"%s","expires_at":"2030-01-01T00:00:00Z","device_id_hash":"%s"}`, digest, device), wire.CodeUnauthorized},
		{"past expiry", fmt.Sprintf(`{"type":"publish_route","protocol_version":1,"credential_id":"a","token_sha256":"%s","expires_at":%d,"device_id_hash":"%s"}`, digest, now-1, device), wire.CodeExpired},
		{"bootstrap max_uses 2", fmt.Sprintf(`{"type":"publish_bootstrap","protocol_version":1,"pairing_id":"p","token_sha256":"%s","expires_at":%d,"max_uses":2}`, digest, now+60), wire.CodeUnauthorized},
		{"bootstrap over an hour", fmt.Sprintf(`{"type":"publish_bootstrap","protocol_version":1,"pairing_id":"p","token_sha256":"%s","expires_at":%d,"max_uses":1}`, digest, now+3601), wire.CodeUnauthorized},
		{"digest of another host", fmt.Sprintf(`{"type":"publish_route","protocol_version":1,"credential_id":"a","token_sha256":"%s","expires_at":%d,"device_id_hash":"%s"}`, wire.TokenDigest(string(taken)), now+60, device), wire.CodeUnauthorized},
		{"revoke a bootstrap", `{"type":"revoke","protocol_version":1,"credential_kind":"bootstrap","credential_id":"p"}`, wire.CodeUnauthorized},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sendText(t, host, c.msg)
			expectMsg(t, host, wire.ErrorMsg{Code: c.code})
			e.alive(host)
		})
	}
	t.Run("quota_exceeded at the credential limit", func(t *testing.T) {
		for i := 0; i < 3; i++ {
			e.publishRoute(host, fmt.Sprintf("q%d", i), wire.NewToken())
		}
		e.publishRouteExp(host, "q3", wire.NewToken(), now+60)
		expectMsg(t, host, wire.ErrorMsg{Code: wire.CodeQuotaExceeded})
		// Replacing an existing credential_id is not a new credential.
		e.publishRoute(host, "q1", wire.NewToken())
		e.alive(host)
	})
	if e.b.Stats().Counts["host:violation"] != 0 {
		t.Fatal("a field error ended a registration")
	}
}

func TestRouteExpiryIsClampedTo90Days(t *testing.T) {
	e := newEnv(t, nil)
	host := e.host(0)
	tok := wire.NewToken()
	// A float far beyond 90 days, as the stock connector may publish.
	msg := fmt.Sprintf(`{"type":"publish_route","protocol_version":1,"credential_id":"r","token_sha256":"%s","expires_at":%d.75,"device_id_hash":"%s"}`,
		wire.TokenDigest(string(tok)), e.clock.Now().Unix()+400*24*3600, wire.TokenDigest("d"))
	sendText(t, host, msg)
	expectMsg(t, host, wire.Published{CredentialKind: wire.KindRoute, Label: "r"})
	e.clock.Advance(wire.MaxRouteLifetime - time.Minute)
	c, _ := e.client(host, 0, wire.KindRoute, tok)
	c.Close(1000, "")
	readBinary(t, host)
	e.clock.Advance(2 * time.Minute)
	if code := e.refused(0, wire.KindRoute, tok, wire.NewID()); code != wire.CodeExpired {
		t.Fatalf("after 90 days: %s", code)
	}
}

func TestControlRepliesInOrder(t *testing.T) {
	e := newEnv(t, nil)
	host := e.host(0)
	now := e.clock.Now().Unix()
	var want []wire.Message
	var batch []string
	for i := 0; i < 30; i++ {
		tok := wire.NewToken()
		switch i % 3 {
		case 0:
			m, _ := wire.Marshal(wire.PublishRoute{CredentialID: fmt.Sprintf("r%d", i), TokenSHA256: wire.TokenDigest(string(tok)), ExpiresAt: now + 60, DeviceIDHash: wire.TokenDigest("d")})
			batch = append(batch, string(m))
			want = append(want, wire.Published{CredentialKind: wire.KindRoute, Label: fmt.Sprintf("r%d", i)})
		case 1:
			m, _ := wire.Marshal(wire.PublishBootstrap{PairingID: fmt.Sprintf("p%d", i), TokenSHA256: wire.TokenDigest(string(tok)), ExpiresAt: now - 1})
			batch = append(batch, string(m))
			want = append(want, wire.ErrorMsg{Code: wire.CodeExpired})
		case 2:
			m, _ := wire.Marshal(wire.Revoke{CredentialID: fmt.Sprintf("r%d", i-2)})
			batch = append(batch, string(m))
			want = append(want, wire.Revoked{CredentialID: fmt.Sprintf("r%d", i-2)})
		}
	}
	// Everything is sent before a single reply is read.
	for _, m := range batch {
		sendText(t, host, m)
	}
	for i, w := range want {
		got := readMsg(t, host)
		if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", w) {
			t.Fatalf("reply %d: got %#v, want %#v", i, got, w)
		}
	}
}

func TestControlRepliesBackpressure(t *testing.T) {
	// A host that never reads its replies stops being read; nothing is lost.
	e := newEnv(t, func(c *Config) { c.MaxPendingReplies = 2 })
	e.pipeN = 2
	host := e.host(0)
	const n = 20
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		ctx, cancel := context.WithTimeout(context.Background(), step)
		defer cancel()
		for i := 0; i < n; i++ {
			m, _ := wire.Marshal(wire.Revoke{CredentialID: fmt.Sprintf("x%d", i)})
			if err := host.Write(ctx, Text, m); err != nil {
				t.Errorf("write %d: %v", i, err)
				return
			}
		}
	}()
	waitFor(t, "the host reader to pause", e.pausedHost)
	for i := 0; i < n; i++ {
		expectMsg(t, host, wire.Revoked{CredentialID: fmt.Sprintf("x%d", i)})
	}
	<-sent
}

// pausedHost reports whether some host reader is waiting for reply space.
func (e *env) pausedHost() bool {
	e.b.mu.Lock()
	defer e.b.mu.Unlock()
	for _, h := range e.b.hosts {
		if h.pause.Paused() {
			return true
		}
	}
	return false
}

func TestControlFramingViolationsEndTheRegistration(t *testing.T) {
	cases := map[string]string{
		"not JSON":       `publish`,
		"unknown type":   `{"type":"extensions","protocol_version":1,"extensions":["credit"]}`,
		"wrong key set":  `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"a","x":1}`,
		"missing key":    `{"type":"revoke","protocol_version":1,"credential_kind":"route"}`,
		"duplicate key":  `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"a","credential_id":"b"}`,
		"oversize":       `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"a"` + strings.Repeat(" ", 4100) + `}`,
		"array":          `[1]`,
		"trailing data":  `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"a"} x`,
		"bad key + vers": `{"type":"revoke","protocol_version":2,"credential_kind":"route","credential_id":"a","x":1}`,
	}
	for name, msg := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil)
			host := e.host(0)
			tok := wire.NewToken()
			e.publishRoute(host, "r1", tok)
			c, _ := e.client(host, 0, wire.KindRoute, tok)
			// A valid frame just before the violation still gets its reply first.
			sendText(t, host, `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"other"}`)
			sendText(t, host, msg)
			expectMsg(t, host, wire.Revoked{CredentialID: "other"})
			if code := expectError(t, host); code != wire.CodeUnauthorized {
				t.Fatalf("got %s", code)
			}
			if code, _ := expectClose(t, c); code != wire.CloseGoingAway {
				t.Fatalf("client of the ended host closed %d, want 1001", code)
			}
			waitFor(t, "host offline", func() bool { return e.b.Stats().HostsOnline == 0 })
		})
	}
}

func TestNewestHostRegistrationWins(t *testing.T) {
	e := newEnv(t, nil)
	old := e.host(0)
	tok := wire.NewToken()
	e.publishRoute(old, "r1", tok)
	c, _ := e.client(old, 0, wire.KindRoute, tok)

	newer := e.host(0) // answered `registered` inside
	if code, reason := expectClose(t, old); code != wire.CloseNormal || reason != wire.CloseReasonReplaced {
		t.Fatalf("old host closed %d %q", code, reason)
	}
	if code, _ := expectClose(t, c); code != wire.CloseGoingAway {
		t.Fatalf("old host's client closed %d", code)
	}
	// The credential is the host's, not the socket's: it works on the new one.
	c2, id := e.client(newer, 0, wire.KindRoute, tok)
	sendBinary(t, c2, []byte("hi"))
	if got := readBinary(t, newer); string(got) != string(dataFrame(id, []byte("hi"))) {
		t.Fatalf("host got %x", got)
	}
	if st := e.b.Stats(); st.HostsOnline != 1 || st.Counts["host:replaced"] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A replaced or revoked host gets its close reason even while the broker is
// in the middle of a write to it: the WebSocket transport cuts the whole
// socket when a write's context ends, and the connector picks its back-off
// (60 s for replaced, 10 min for revoked) from that reason.
func TestHostEndReasonSurvivesAWriteInFlight(t *testing.T) {
	cases := map[string]struct {
		end    func(e *env)
		errMsg wire.Code
		code   int
		reason string
	}{
		"replaced": {
			end:  func(e *env) { e.host(0) },
			code: wire.CloseNormal, reason: wire.CloseReasonReplaced,
		},
		"revoked": {
			end: func(e *env) {
				if err := store.RemoveHost(e.cfg.HostsFile, e.hosts[0].id.String()); err != nil {
					e.t.Fatal(err)
				}
				if err := e.b.ReloadHosts(); err != nil {
					e.t.Fatal(err)
				}
			},
			errMsg: wire.CodeRevoked, code: wire.ClosePolicy, reason: wire.CloseReasonRevoked,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.pipeN = 1
			old := e.host(0)
			old.Peer().SetCutOnCancel(true)
			tok := wire.NewToken()
			e.publishRoute(old, "r", tok)
			c, id := e.client(old, 0, wire.KindRoute, tok)
			sendBinary(t, c, []byte("first"))
			sendBinary(t, c, []byte("second"))
			// "first" fills the host's one-message buffer, so the write of
			// "second" waits until the host reads.
			waitFor(t, "a write to the host in flight", func() bool { return old.Peer().BlockedWrites() == 1 })
			tc.end(e)
			for _, want := range []string{"first", "second"} {
				if got := readBinary(t, old); !bytes.Equal(got, dataFrame(id, []byte(want))) {
					t.Fatalf("old host got %x", got)
				}
			}
			if tc.errMsg != "" {
				expectMsg(t, old, wire.ErrorMsg{Code: tc.errMsg})
			}
			if code, reason := expectClose(t, old); code != tc.code || reason != tc.reason {
				t.Fatalf("old host closed %d %q, want %d %q", code, reason, tc.code, tc.reason)
			}
			if code, _ := expectClose(t, c); code != wire.CloseGoingAway {
				t.Fatalf("its client closed %d", code)
			}
		})
	}
}

func TestRouteRepublishReplacesOldDigest(t *testing.T) {
	e := newEnv(t, nil)
	host := e.host(0)
	first, second := wire.NewToken(), wire.NewToken()
	e.publishRoute(host, "sess", first)
	live, id := e.client(host, 0, wire.KindRoute, first)
	e.publishRoute(host, "sess", second)
	if code := e.refused(0, wire.KindRoute, first, wire.NewID()); code != wire.CodeUnauthorized {
		t.Fatalf("replaced token: %s", code)
	}
	c, _ := e.client(host, 0, wire.KindRoute, second)
	c.Close(1000, "")
	readBinary(t, host)
	// A stream opened with the old token keeps running.
	sendBinary(t, live, []byte("x"))
	if got := readBinary(t, host); string(got) != string(dataFrame(id, []byte("x"))) {
		t.Fatalf("host got %x", got)
	}
	// Bootstrap entries are untouched by route operations.
	boot := wire.NewToken()
	e.publishBootstrap(host, "sess", boot)
	e.publishRoute(host, "sess", wire.NewToken())
	b, _ := e.client(host, 0, wire.KindBootstrap, boot)
	b.Close(1000, "")
}

func TestRevokeClosesLiveStreams(t *testing.T) {
	e := newEnv(t, nil)
	host := e.host(0)
	tok, keep := wire.NewToken(), wire.NewToken()
	e.publishRoute(host, "gone", tok)
	e.publishRoute(host, "kept", keep)
	c1, id1 := e.client(host, 0, wire.KindRoute, tok)
	c2, id2 := e.client(host, 0, wire.KindRoute, tok)
	k, kid := e.client(host, 0, wire.KindRoute, keep)

	sendText(t, host, `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"gone"}`)
	// Two CLOSE frames and the reply, in any order.
	closed := map[wire.ID]bool{}
	replied := false
	for i := 0; i < 3; i++ {
		typ, data, err := read(t, host)
		if err != nil {
			t.Fatal(err)
		}
		if typ == Binary {
			f, _ := wire.ParseFrame(data)
			if f.Flags != wire.FlagClose {
				t.Fatalf("host got %+v", f)
			}
			closed[f.StreamID] = true
			continue
		}
		if m, _ := wire.ParseBrokerMessage(data); m != (wire.Revoked{CredentialID: "gone"}) {
			t.Fatalf("host got %#v", m)
		}
		replied = true
	}
	if !replied {
		t.Fatal("no revoked reply")
	}
	if !closed[id1] || !closed[id2] || closed[kid] {
		t.Fatalf("CLOSE sent for %v", closed)
	}
	for _, c := range []*pipeConn{c1, c2} {
		if code, reason := expectClose(t, c); code != wire.ClosePolicy || reason != "revoked" {
			t.Fatalf("revoked client closed %d %q", code, reason)
		}
	}
	if code := e.refused(0, wire.KindRoute, tok, wire.NewID()); code != wire.CodeRevoked {
		t.Fatal(code)
	}
	sendBinary(t, k, []byte("still here"))
	if got := readBinary(t, host); string(got) != string(dataFrame(kid, []byte("still here"))) {
		t.Fatalf("host got %q", got)
	}
}

// One host publishing and revoking in a loop keeps only its share of the
// revoked table (table_entries/max_hosts): its own revokes go on working,
// and another host's revoke still answers revoked and its revoked token is
// refused as revoked. (The table had no per-host share: the loop filled
// it, and every other host's revoke got quota_exceeded, its credential
// left valid.)
func TestOneHostCannotFillTheRevokedTable(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TableEntries, c.MaxHosts = 64, 2 })
	attacker, victim := e.host(1), e.host(0)
	revoke := func(p *pipeConn, id string) {
		t.Helper()
		m, _ := wire.Marshal(wire.Revoke{CredentialID: id})
		sendText(t, p, string(m))
		expectMsg(t, p, wire.Revoked{CredentialID: id})
	}
	far := e.clock.Now().Add(90 * 24 * time.Hour).Unix()
	refused := 0
	for i := 0; i < 3*64; i++ {
		id := fmt.Sprintf("loop%d", i)
		e.publishRouteExp(attacker, id, wire.NewToken(), far)
		expectMsg(t, attacker, wire.Published{CredentialKind: wire.KindRoute, Label: id})
		m, _ := wire.Marshal(wire.Revoke{CredentialID: id})
		sendText(t, attacker, string(m))
		if _, ok := readMsg(t, attacker).(wire.Revoked); !ok {
			refused++
		}
	}
	if refused > 0 {
		t.Errorf("%d of the looping host's own revokes were refused", refused)
	}
	if n := e.b.state.RevokedBy(e.hosts[1].id); n != 32 {
		t.Errorf("the looping host holds %d revoked digests, want its share 32", n)
	}
	tok := wire.NewToken()
	e.publishRoute(victim, "phone", tok)
	c, id := e.client(victim, 0, wire.KindRoute, tok)
	m, _ := wire.Marshal(wire.Revoke{CredentialID: "phone"})
	sendText(t, victim, string(m))
	// The reply and the stream's CLOSE, in either order.
	for i := 0; i < 2; i++ {
		typ, data, err := read(t, victim)
		if err != nil {
			t.Fatal(err)
		}
		if typ == Binary {
			if f, _ := wire.ParseFrame(data); f.Flags != wire.FlagClose || f.StreamID != id {
				t.Fatalf("victim host got %+v", f)
			}
			continue
		}
		if m, _ := wire.ParseBrokerMessage(data); m != (wire.Revoked{CredentialID: "phone"}) {
			t.Fatalf("the other host's revoke answered %#v", m)
		}
	}
	if code, _ := expectClose(t, c); code != wire.ClosePolicy {
		t.Fatalf("revoked credential's stream closed with %d, want 1008", code)
	}
	if code := e.refused(0, wire.KindRoute, tok, wire.NewID()); code != wire.CodeRevoked {
		t.Fatalf("revoked credential: %s", code)
	}
	// The loop goes on; the victim's revoked digest stays.
	for i := 0; i < 64; i++ {
		id := fmt.Sprintf("more%d", i)
		e.publishRouteExp(attacker, id, wire.NewToken(), far)
		expectMsg(t, attacker, wire.Published{CredentialKind: wire.KindRoute, Label: id})
		revoke(attacker, id)
	}
	if code := e.refused(0, wire.KindRoute, tok, wire.NewID()); code != wire.CodeRevoked {
		t.Fatalf("revoked credential after more of the loop: %s", code)
	}
}

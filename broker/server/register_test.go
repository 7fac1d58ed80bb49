package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

func TestRegisterExactKeySet(t *testing.T) {
	e := newEnv(t, nil)
	cases := map[string]func(map[string]string){
		"extra key":              func(m map[string]string) { m["extra"] = `1` },
		"missing token":          func(m map[string]string) { delete(m, "token") },
		"missing type":           func(m map[string]string) { delete(m, "type") },
		"wrong type":             func(m map[string]string) { m["type"] = `"registered"` },
		"extra key, bad version": func(m map[string]string) { m["extra"] = `1`; m["protocol_version"] = `2` },
		"upper-case key":         func(m map[string]string) { m["Token"] = m["token"]; delete(m, "token") },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			p := e.dial()
			sendText(t, p, registerJSON(e, mutate))
			if code := expectError(t, p); code != wire.CodeUnauthorized {
				t.Fatalf("got %s, want unauthorized", code)
			}
		})
	}
	// The untouched message is accepted, so the cases above fail for their
	// one difference.
	p := e.dial()
	sendText(t, p, registerJSON(e, func(map[string]string) {}))
	expectMsg(t, p, wire.Registered{Extensions: []string{wire.ExtensionCredit}})
}

func TestRegisterUnsupportedVersion(t *testing.T) {
	e := newEnv(t, nil)
	for _, v := range []string{`true`, `1.0`, `2`, `"1"`, `1e0`, `0`} {
		t.Run(v, func(t *testing.T) {
			p := e.dial()
			sendText(t, p, registerJSON(e, func(m map[string]string) { m["protocol_version"] = v }))
			if code := expectError(t, p); code != wire.CodeUnsupportedVersion {
				t.Fatalf("protocol_version %s: got %s", v, code)
			}
		})
	}
}

func TestRegisterBadFields(t *testing.T) {
	e := newEnv(t, nil)
	id := e.hosts[0].id.String()
	// A canonical id's last character carries unused bits; flipping them
	// gives the same bytes in a non-canonical spelling.
	nonCanonical := id[:21] + string(rune(id[21]+1))
	if _, err := wire.ParseID(nonCanonical); err == nil {
		nonCanonical = id[:21] + "B"
	}
	cases := map[string]func(map[string]string){
		"non-canonical host_id": func(m map[string]string) { m["host_id"] = `"` + nonCanonical + `"` },
		"padded connection_id":  func(m map[string]string) { m["connection_id"] = `"` + wire.NewID().String() + `=="` },
		"short token":           func(m map[string]string) { m["token"] = `"short"` },
		"host with route kind":  func(m map[string]string) { m["credential_kind"] = `"route"` },
		"client with host kind": func(m map[string]string) { m["role"] = `"client"` },
		"unknown role":          func(m map[string]string) { m["role"] = `"admin"` },
		"token not a string":    func(m map[string]string) { m["token"] = `12345678901234567890123456789012345` },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			p := e.dial()
			sendText(t, p, registerJSON(e, mutate))
			if code := expectError(t, p); code != wire.CodeUnauthorized {
				t.Fatalf("got %s, want unauthorized", code)
			}
		})
	}
}

func TestRegisterMustBeSmallText(t *testing.T) {
	e := newEnv(t, nil)
	t.Run("binary", func(t *testing.T) {
		p := e.dial()
		sendBinary(t, p, []byte(registerJSON(e, func(map[string]string) {})))
		if code := expectError(t, p); code != wire.CodeUnauthorized {
			t.Fatalf("got %s", code)
		}
	})
	t.Run("not JSON", func(t *testing.T) {
		p := e.dial()
		sendText(t, p, "hello")
		if code := expectError(t, p); code != wire.CodeUnauthorized {
			t.Fatalf("got %s", code)
		}
	})
	t.Run("4097 bytes", func(t *testing.T) {
		p := e.dial()
		msg := registerJSON(e, func(map[string]string) {})
		msg = msg[:len(msg)-1] + strings.Repeat(" ", wire.MaxControlBytes+1-len(msg)) + "}"
		if len(msg) != wire.MaxControlBytes+1 {
			t.Fatal(len(msg))
		}
		sendText(t, p, msg)
		if code := expectError(t, p); code != wire.CodeUnauthorized {
			t.Fatalf("got %s", code)
		}
	})
	t.Run("4096 bytes with padding is fine", func(t *testing.T) {
		p := e.dial()
		msg := registerJSON(e, func(map[string]string) {})
		msg = msg[:len(msg)-1] + strings.Repeat(" ", wire.MaxControlBytes-len(msg)) + "}"
		sendText(t, p, msg)
		expectMsg(t, p, wire.Registered{Extensions: []string{wire.ExtensionCredit}})
	})
	t.Run("far over the limit is 1009", func(t *testing.T) {
		p := e.dial()
		sendText(t, p, strings.Repeat("x", 10000))
		if code, _ := expectClose(t, p); code != wire.CloseTooBig {
			t.Fatalf("close %d", code)
		}
	})
}

func TestRegisterTimeout(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RegisterTimeout = 100 * time.Millisecond })
	p := e.dial()
	start := time.Now()
	if code := expectError(t, p); code != wire.CodeUnauthorized {
		t.Fatalf("got %s", code)
	}
	if time.Since(start) < 100*time.Millisecond {
		t.Fatal("refused before the registration timeout")
	}
}

func TestHostAuthDoesNotTellUnknownHostFromWrongToken(t *testing.T) {
	e := newEnv(t, nil)
	unknown := e.dial()
	e.register(unknown, wire.RoleHost, wire.NewID(), wire.KindHost, e.hosts[0].token, wire.NewID())
	wrong := e.dial()
	e.register(wrong, wire.RoleHost, e.hosts[0].id, wire.KindHost, wire.NewToken(), wire.NewID())
	other := e.dial() // host 1's token with host 0's id
	e.register(other, wire.RoleHost, e.hosts[0].id, wire.KindHost, e.hosts[1].token, wire.NewID())
	for _, p := range []*pipeConn{unknown, wrong, other} {
		if code := expectError(t, p); code != wire.CodeUnauthorized {
			t.Fatalf("got %s", code)
		}
	}
	if n := e.b.Stats().HostsOnline; n != 0 {
		t.Fatalf("%d hosts online", n)
	}
}

func TestDuplicateConnectionID(t *testing.T) {
	e := newEnv(t, nil)
	conn := wire.NewID()
	host := e.hostWith(0, conn)
	tok := wire.NewToken()
	e.publishRoute(host, "r1", tok)

	// The host's own connection id cannot be reused by anyone.
	if code := e.refused(0, wire.KindRoute, tok, conn); code != wire.CodeReplayed {
		t.Fatalf("client reusing the host's connection_id: %s", code)
	}
	again := e.dial()
	e.register(again, wire.RoleHost, e.hosts[0].id, wire.KindHost, e.hosts[0].token, conn)
	if code := expectError(t, again); code != wire.CodeReplayed {
		t.Fatalf("host re-registering with its connection_id: %s", code)
	}

	// A client's connection id is accepted once, even after its stream ended.
	cid := wire.NewID()
	c := e.dial()
	e.register(c, wire.RoleClient, e.hosts[0].id, wire.KindRoute, tok, cid)
	readMsg(t, host) // open
	readMsg(t, c)    // matched
	c.Close(1000, "")
	readBinary(t, host) // CLOSE
	if code := e.refused(0, wire.KindRoute, tok, cid); code != wire.CodeReplayed {
		t.Fatalf("reused client connection_id: %s", code)
	}
	// The first registration is still online.
	e.alive(host)
}

func TestMatchingErrors(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxStreamsPerRoute = 2 })
	host := e.host(0)
	route := wire.NewToken()
	e.publishRoute(host, "r1", route)

	t.Run("unknown digest", func(t *testing.T) {
		if code := e.refused(0, wire.KindRoute, wire.NewToken(), wire.NewID()); code != wire.CodeUnauthorized {
			t.Fatal(code)
		}
	})
	t.Run("wrong kind", func(t *testing.T) {
		if code := e.refused(0, wire.KindBootstrap, route, wire.NewID()); code != wire.CodeUnauthorized {
			t.Fatal(code)
		}
	})
	t.Run("other host", func(t *testing.T) {
		if code := e.refused(1, wire.KindRoute, route, wire.NewID()); code != wire.CodeUnauthorized {
			t.Fatal(code)
		}
	})
	t.Run("host_busy per route", func(t *testing.T) {
		c1, _ := e.client(host, 0, wire.KindRoute, route)
		c2, id2 := e.client(host, 0, wire.KindRoute, route)
		if code := e.refused(0, wire.KindRoute, route, wire.NewID()); code != wire.CodeHostBusy {
			t.Fatalf("third stream on a route limited to 2: %s", code)
		}
		// Another route of the same host is not affected.
		other := wire.NewToken()
		e.publishRoute(host, "r2", other)
		c3, _ := e.client(host, 0, wire.KindRoute, other)
		// Freeing one stream frees the slot.
		c2.Close(1000, "")
		if f, _ := wire.ParseFrame(readBinary(t, host)); f.Flags != wire.FlagClose || f.StreamID != id2 {
			t.Fatalf("host got %+v", f)
		}
		c4, _ := e.client(host, 0, wire.KindRoute, route)
		for _, c := range []*pipeConn{c1, c3, c4} {
			c.Close(1000, "")
			readBinary(t, host)
		}
	})
	t.Run("host_offline", func(t *testing.T) {
		h1 := e.host(1)
		tok := wire.NewToken()
		e.publishRoute(h1, "r1", tok)
		h1.Close(1000, "")
		waitFor(t, "host 1 offline", func() bool { return e.b.Stats().HostsOnline == 1 })
		if code := e.refused(1, wire.KindRoute, tok, wire.NewID()); code != wire.CodeHostOffline {
			t.Fatal(code)
		}
	})
	t.Run("expired", func(t *testing.T) {
		tok := wire.NewToken()
		e.publishRouteExp(host, "short", tok, e.clock.Now().Unix()+10)
		readMsg(t, host)
		e.clock.Advance(11 * time.Second)
		if code := e.refused(0, wire.KindRoute, tok, wire.NewID()); code != wire.CodeExpired {
			t.Fatal(code)
		}
	})
}

// TestMatchingOrder checks that each check wins over the ones after it.
func TestMatchingOrder(t *testing.T) {
	e := newEnv(t, nil)
	host := e.host(0)
	tok := wire.NewToken()
	e.publishRoute(host, "r1", tok)
	c, _ := e.client(host, 0, wire.KindRoute, tok)
	c.Close(1000, "")
	readBinary(t, host)

	// Revoke it: now it is revoked, and with a reused connection_id replayed.
	sendText(t, host, `{"type":"revoke","protocol_version":1,"credential_kind":"route","credential_id":"r1"}`)
	expectMsg(t, host, wire.Revoked{CredentialID: "r1"})
	cid := wire.NewID()
	c2 := e.dial()
	boot := wire.NewToken()
	e.publishBootstrap(host, "p1", boot)
	e.register(c2, wire.RoleClient, e.hosts[0].id, wire.KindBootstrap, boot, cid)
	readMsg(t, host)
	readMsg(t, c2)

	// replayed beats revoked
	if code := e.refused(0, wire.KindRoute, tok, cid); code != wire.CodeReplayed {
		t.Fatalf("reused connection_id with a revoked token: %s", code)
	}
	// revoked beats unauthorized (wrong host) and host_offline
	if code := e.refused(1, wire.KindRoute, tok, wire.NewID()); code != wire.CodeRevoked {
		t.Fatalf("revoked token at another host: %s", code)
	}
	// consumed (replayed) beats unauthorized (wrong kind)
	if code := e.refused(0, wire.KindRoute, boot, wire.NewID()); code != wire.CodeReplayed {
		t.Fatalf("consumed bootstrap presented as a route: %s", code)
	}
	// expired beats unauthorized (other host) and host_offline
	exp := wire.NewToken()
	e.publishRouteExp(host, "r2", exp, e.clock.Now().Unix()+5)
	readMsg(t, host)
	e.clock.Advance(6 * time.Second)
	if code := e.refused(1, wire.KindRoute, exp, wire.NewID()); code != wire.CodeExpired {
		t.Fatalf("expired token at another host: %s", code)
	}
	// unauthorized beats host_offline: host 1 is offline, the token is host 0's
	live := wire.NewToken()
	e.publishRoute(host, "r3", live)
	if code := e.refused(1, wire.KindRoute, live, wire.NewID()); code != wire.CodeUnauthorized {
		t.Fatalf("other host's token for an offline host: %s", code)
	}
}

func TestHostBusyAtMaxStreamsPerHost(t *testing.T) {
	e := newEnv(t, nil)
	host := e.host(0)
	var clients []*pipeConn
	for r := 0; r < wire.MaxStreamsPerHost/wire.MaxStreamsPerRoute; r++ {
		tok := wire.NewToken()
		e.publishRoute(host, "r"+string(rune('a'+r)), tok)
		for i := 0; i < wire.MaxStreamsPerRoute; i++ {
			c, _ := e.client(host, 0, wire.KindRoute, tok)
			clients = append(clients, c)
		}
	}
	if n := e.b.Stats().ActiveStreams; n != wire.MaxStreamsPerHost {
		t.Fatalf("%d streams", n)
	}
	tok := wire.NewToken()
	e.publishRoute(host, "extra", tok)
	if code := e.refused(0, wire.KindRoute, tok, wire.NewID()); code != wire.CodeHostBusy {
		t.Fatalf("17th stream: %s", code)
	}
	clients[0].Close(1000, "")
	readBinary(t, host)
	c, _ := e.client(host, 0, wire.KindRoute, tok)
	c.Close(1000, "")
}

func TestBootstrapIsConsumedAtMatch(t *testing.T) {
	e := newEnv(t, nil)
	host := e.host(0)
	boot := wire.NewToken()
	e.publishBootstrap(host, "pair-1", boot)
	c, _ := e.client(host, 0, wire.KindBootstrap, boot)
	// While the first stream is live and after it ended: replayed.
	if code := e.refused(0, wire.KindBootstrap, boot, wire.NewID()); code != wire.CodeReplayed {
		t.Fatal(code)
	}
	c.Close(1000, "")
	readBinary(t, host)
	if code := e.refused(0, wire.KindBootstrap, boot, wire.NewID()); code != wire.CodeReplayed {
		t.Fatal(code)
	}
	// Publishing the consumed digest again does not revive it.
	msg, _ := wire.Marshal(wire.PublishBootstrap{PairingID: "pair-2", TokenSHA256: wire.TokenDigest(string(boot)), ExpiresAt: e.clock.Now().Unix() + 60})
	sendText(t, host, string(msg))
	expectMsg(t, host, wire.ErrorMsg{Code: wire.CodeUnauthorized})
}

// One credential's connect–match–close loop fills only its own share of
// the client replay cache: it gets quota_exceeded, while another credential
// of the same host, another host and host re-registrations keep working,
// and its entries expire after 24 h + 5 min (not the credential's 30 days).
func TestReplayQuotaIsPerCredentialAndPerHost(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.ReplayPerCredential = 20
		c.ReplayPerHost = 30
		c.MaxStreamsPerRoute = 16
	})
	h0, h1 := e.host(0), e.host(1)
	exp := e.clock.Now().Add(30 * 24 * time.Hour).Unix()
	a, b, other := wire.NewToken(), wire.NewToken(), wire.NewToken()
	for _, p := range []struct {
		host *pipeConn
		id   string
		tok  wire.Secret
	}{{h0, "a", a}, {h0, "b", b}, {h1, "other", other}} {
		e.publishRouteExp(p.host, p.id, p.tok, exp)
		readMsg(t, p.host)
	}
	loop := func(host *pipeConn, i int, tok wire.Secret, n int) {
		t.Helper()
		for j := 0; j < n; j++ {
			c, _ := e.client(host, i, wire.KindRoute, tok)
			c.Close(1000, "")
			readBinary(t, host)
		}
	}
	loop(h0, 0, a, 20)
	if code := e.refused(0, wire.KindRoute, a, wire.NewID()); code != wire.CodeQuotaExceeded {
		t.Fatalf("credential past its share: %s", code)
	}
	// The same host's other credential, another host, and host
	// re-registrations are unaffected.
	loop(h0, 0, b, 10)
	loop(h1, 1, other, 15)
	h1 = e.host(1)
	h0 = e.host(0)
	// Now the host's credentials together hold 30: its share is full.
	if code := e.refused(0, wire.KindRoute, b, wire.NewID()); code != wire.CodeQuotaExceeded {
		t.Fatalf("host past its share: %s", code)
	}
	loop(h1, 1, other, 1)
	if got := e.b.Stats().Counts["refused:quota_exceeded"]; got != 2 {
		t.Fatalf("counted %d quota refusals", got)
	}

	// Entries are kept 24 h + 5 min, then forgotten.
	e.clock.Advance(24*time.Hour + 5*time.Minute - time.Second)
	if code := e.refused(0, wire.KindRoute, a, wire.NewID()); code != wire.CodeQuotaExceeded {
		t.Fatalf("a second before the entries expire: %s", code)
	}
	e.clock.Advance(time.Second)
	loop(h0, 0, a, 1)
	loop(h0, 0, b, 1)
}

// At the default shares, one credential in a reconnect loop reaches its
// own limit well before its host's: another credential of the same host
// still matches. (The per-credential default was above the per-host one,
// so the loop spent the household's whole day.)
func TestDefaultReplayShareOfOneCredentialLeavesItsHostRoom(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxStreamsPerRoute = 16 })
	if e.cfg.ReplayPerCredential >= e.cfg.ReplayPerHost {
		t.Errorf("default replay_per_credential %d is not below replay_per_host %d", e.cfg.ReplayPerCredential, e.cfg.ReplayPerHost)
	}
	host := e.host(0)
	a, b := wire.NewToken(), wire.NewToken()
	e.publishRoute(host, "a", a)
	e.publishRoute(host, "b", b)
	matched := 0
	for matched <= e.cfg.ReplayPerHost {
		c := e.dial()
		e.register(c, wire.RoleClient, e.hosts[0].id, wire.KindRoute, a, wire.NewID())
		if m, ok := readMsg(t, c).(wire.ErrorMsg); ok {
			if m.Code != wire.CodeQuotaExceeded {
				t.Fatalf("after %d matches: %s", matched, m.Code)
			}
			break
		}
		if _, ok := readMsg(t, host).(wire.Open); !ok {
			t.Fatal("host did not get open")
		}
		c.Close(1000, "")
		readBinary(t, host)
		matched++
	}
	if matched != e.cfg.ReplayPerCredential {
		t.Errorf("one credential matched %d times, want its share %d", matched, e.cfg.ReplayPerCredential)
	}
	c, _ := e.client(host, 0, wire.KindRoute, b)
	c.Close(1000, "")
}

// Host registrations have their own table, bounded too, and a host in a
// registration loop can lock no host out: past its share (the table over
// max_hosts, at least 16) it forgets its own oldest connection_ids, and a
// full table forgets the oldest of all. Its recent connection_ids stay
// replay-protected, and clients still match.
func TestHostReplayTableIsSeparateAndNeverLocksHostsOut(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TableEntries, c.MaxHosts = 32, 2 })
	host := e.host(0)
	tok := wire.NewToken()
	e.publishRoute(host, "r1", tok)
	var recent []wire.ID
	for i := 0; i < 40; i++ {
		conn := wire.NewID()
		e.hostWith(1, conn)
		recent = append(recent, conn)
	}
	if n, _ := e.b.hostReplay.Counts(e.hosts[1].id, wire.Digest{}); n != 16 {
		t.Errorf("host 1 holds %d host replay entries, want its share 16", n)
	}
	for _, conn := range recent[len(recent)-16:] {
		p := e.dial()
		e.register(p, wire.RoleHost, e.hosts[1].id, wire.KindHost, e.hosts[1].token, conn)
		if code := expectError(t, p); code != wire.CodeReplayed {
			t.Fatalf("replayed recent host connection_id: %s", code)
		}
	}
	host = e.host(0)
	e.publishRoute(host, "r2", tok)
	for i := 0; i < 3; i++ {
		c, _ := e.client(host, 0, wire.KindRoute, tok)
		c.Close(1000, "")
		readBinary(t, host)
	}
}

// With more hosts holding entries than the table has shares for, a full
// table forgets its oldest entry: the next host still registers.
func TestFullHostReplayTableForgetsItsOldest(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.TableEntries = 16 })
	e.host(0)
	for i := 1; i < 16; i++ {
		e.host(1)
	}
	e.host(1)
	e.host(0)
	if n := e.b.hostReplay.Len(); n != 16 {
		t.Fatalf("host table holds %d entries, want 16", n)
	}
	if got := e.b.Stats().Counts["host:replay_evicted"]; got != 2 {
		t.Fatalf("counted %d evictions, want 2", got)
	}
}

func TestStreamIDsAreFreshAndOpenedOnce(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxStreamsPerRoute = 16 })
	host := e.host(0)
	tok := wire.NewToken()
	e.publishRoute(host, "r1", tok)
	seen := map[wire.ID]bool{}
	for i := 0; i < 40; i++ {
		c, id := e.client(host, 0, wire.KindRoute, tok)
		if seen[id] {
			t.Fatalf("stream id %v reused", id)
		}
		seen[id] = true
		c.Close(1000, "")
		if f, err := wire.ParseFrame(readBinary(t, host)); err != nil || f.Flags != wire.FlagClose || f.StreamID != id {
			t.Fatalf("expected only CLOSE for %v after its open, got %+v %v", id, f, err)
		}
	}
}

func TestOpenCarriesTheHostConnectionID(t *testing.T) {
	e := newEnv(t, nil)
	conn := wire.NewID()
	host := e.hostWith(0, conn)
	tok := wire.NewToken()
	e.publishRoute(host, "r", tok)
	c := e.dial()
	e.register(c, wire.RoleClient, e.hosts[0].id, wire.KindRoute, tok, wire.NewID())
	open, ok := readMsg(t, host).(wire.Open)
	if !ok || open.HostConnectionID != conn {
		t.Fatalf("open %#v, want host_connection_id %v", open, conn)
	}
	if m, ok := readMsg(t, c).(wire.Matched); !ok || m.StreamID != open.StreamID {
		t.Fatalf("matched %#v", m)
	}
}

// Tokens never reach a log line, whatever fails: refused registrations of
// either role, a replayed bootstrap, refused and malformed control frames
// that carry token-like text. The broker logs at debug level here.
func TestNoTokenInLogs(t *testing.T) {
	e := newEnv(t, nil)
	wrong, unknown, boot := wire.NewToken(), wire.NewToken(), wire.NewToken()
	// A host with a wrong token, and an unknown host.
	for _, hid := range []wire.ID{e.hosts[0].id, wire.NewID()} {
		c := e.dial()
		e.register(c, wire.RoleHost, hid, wire.KindHost, wrong, wire.NewID())
		if code := expectError(t, c); code != wire.CodeUnauthorized {
			t.Fatalf("bad host registration: %s", code)
		}
	}
	h := e.host(0)
	e.publishBootstrap(h, "p1", boot)
	c, _ := e.client(h, 0, wire.KindBootstrap, boot)
	defer c.Close(1000, "")
	if code := e.refused(0, wire.KindBootstrap, boot, wire.NewID()); code != wire.CodeReplayed {
		t.Fatalf("replayed bootstrap: %s", code)
	}
	if code := e.refused(0, wire.KindRoute, unknown, wire.NewID()); code != wire.CodeUnauthorized {
		t.Fatalf("unknown route: %s", code)
	}
	// A refused control frame, then a framing violation carrying a token.
	sendText(t, h, fmt.Sprintf(`{"type":"publish_route","protocol_version":1,"credential_id":"bad id","token_sha256":"%s","expires_at":%d,"device_id_hash":"%s"}`,
		unknown, time.Now().Add(time.Hour).Unix(), wrong))
	if code := readMsg(t, h).(wire.ErrorMsg).Code; code != wire.CodeUnauthorized {
		t.Fatalf("bad publish: %s", code)
	}
	sendText(t, h, fmt.Sprintf(`{"type":"register","token":"%s"}`, unknown))
	if code := expectError(t, h); code != wire.CodeUnauthorized {
		t.Fatalf("violation: %s", code)
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "registration refused") || !strings.Contains(logs, "broke the protocol") {
		t.Fatalf("the refusals were not logged at all:\n%s", logs)
	}
	for name, tok := range map[string]wire.Secret{"host": e.hosts[0].token, "wrong": wrong, "unknown": unknown, "bootstrap": boot} {
		if strings.Contains(logs, string(tok)) {
			t.Errorf("the log contains the %s token", name)
		}
	}
}

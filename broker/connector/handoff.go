package connector

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// Handoff is the route-credential hook for the /relay/ws bridge: it
// satisfies relay.Handoff (relay.Options.Handoff) without this package
// importing relay, so the dependency points from the front down to Reach.
// The bridge calls it only for connections that arrived through a broker
// stream, only for their first auth.ok, and bounds it with its own
// deadline; the hook adds payload.route_credential (spec "Route credential
// handoff") or returns nil to leave the message unchanged.
type Handoff struct{ c *Connector }

// Handoff returns the connector's route-credential hook.
func (c *Connector) Handoff() *Handoff { return &Handoff{c} }

// AuthOK publishes (digest only) a route token for the Relay session and
// returns the auth.ok with the credential added. Any failure — not an
// auth.ok we can read, a credential already present, an expired session,
// no registration, a publish error or timeout — returns nil: the client still
// authenticates, it just gets no route credential.
func (h *Handoff) AuthOK(ctx context.Context, clientAuth, authOK []byte) []byte {
	c := h.c
	now := c.cfg.Now()
	info, err := parseAuthOK(authOK, now)
	if err != nil {
		if errors.Is(err, errHasRoute) {
			c.count("route_present")
		} else {
			c.count("route_unreadable")
			c.log.Debug().Str("why", err.Error()).Msg("reach: auth.ok passes without a route credential")
		}
		return nil
	}
	device := deviceIDOf(clientAuth)
	if device == "" {
		device = info.sessionToken
	}
	credID := wire.RouteCredentialID(info.sessionToken)
	e, err := c.routeFor(ctx, credID, info.expiresAt, wire.TokenDigest(device))
	if err != nil {
		c.count("route_publish_failed")
		c.log.Warn().Str("credential_id", credID).Str("why", err.Error()).
			Msg("reach: route credential not published; auth.ok goes out without it")
		return nil
	}
	return insertRoute(authOK, info, routeCredential{
		brokerURL: c.cfg.BrokerURL, hostID: c.hostID.String(), credentialID: credID,
		token: e.token, expiresAt: e.expiresAt,
	})
}

// routeCredential is the object a client receives in
// payload.route_credential.
type routeCredential struct {
	brokerURL, hostID, credentialID string
	token                           wire.Secret
	expiresAt                       int64
}

// appendJSON writes the credential with the spec's keys in the spec's
// order; expires_at is an integer because the Android client reads a float
// as absent.
func (r routeCredential) appendJSON(b []byte) []byte {
	str := func(s string) []byte { v, _ := json.Marshal(s); return v }
	b = append(b, `{"kind":"broker_route","broker_url":`...)
	b = append(b, str(r.brokerURL)...)
	b = append(b, `,"host_id":`...)
	b = append(b, str(r.hostID)...)
	b = append(b, `,"credential_id":`...)
	b = append(b, str(r.credentialID)...)
	b = append(b, `,"token":`...)
	b = append(b, str(string(r.token))...)
	b = append(b, `,"expires_at":`...)
	b = appendInt(b, r.expiresAt)
	return append(b, '}')
}

func appendInt(b []byte, v int64) []byte {
	out, _ := json.Marshal(v)
	return append(b, out...)
}

// authOKInfo is what the handoff reads from an auth.ok, and where the
// credential goes.
type authOKInfo struct {
	sessionToken string
	expiresAt    int64 // already clamped, in the future
	insertAt     int   // byte offset in the message, after the payload's last member
}

var (
	errNotAuthOK     = errors.New("not a system auth.ok object")
	errHasRoute      = errors.New("payload already carries route_credential")
	errNoSession     = errors.New("payload has no session_token string")
	errBadExpiry     = errors.New("payload expires_at is not a number or null")
	errPastExpiry    = errors.New("the session has expired")
	errDuplicateKeys = errors.New("duplicate keys")
)

// parseAuthOK reads only the two levels it needs (the message and its
// payload) and records where the credential can be inserted, so every other
// byte of the Relay's message passes unchanged: key order, number spellings
// like 1.5e9, string escapes and whitespace. Values are never re-encoded.
// Duplicate keys make the message ambiguous (parsers may disagree on which
// one counts), so such a message passes untouched.
func parseAuthOK(msg []byte, now time.Time) (authOKInfo, error) {
	var info authOKInfo
	top, _, err := scanObject(msg)
	if err != nil {
		return info, err
	}
	if jsonString(msg, top, "channel") != "system" || jsonString(msg, top, "type") != "auth.ok" {
		return info, errNotAuthOK
	}
	pm, ok := find(top, "payload")
	if !ok || msg[pm.start] != '{' {
		return info, errNotAuthOK
	}
	payload := msg[pm.start:pm.end]
	members, _, err := scanObject(payload)
	if err != nil {
		return info, err
	}
	if _, ok := find(members, "route_credential"); ok {
		return info, errHasRoute
	}
	info.sessionToken = jsonString(payload, members, "session_token")
	if info.sessionToken == "" {
		return info, errNoSession
	}
	n := now.Unix()
	limit := n + int64(wire.MaxRouteLifetime/time.Second)
	em, ok := find(members, "expires_at")
	if !ok || string(payload[em.start:em.end]) == "null" {
		// No expiry (or none stated): the spec's 30 days.
		info.expiresAt = n + int64(wire.DefaultRouteLifetime/time.Second)
	} else {
		v, err := wire.ParseExpiresAt(payload[em.start:em.end])
		if err != nil {
			return info, errBadExpiry
		}
		info.expiresAt = min(v, limit)
	}
	if info.expiresAt <= n {
		return info, errPastExpiry
	}
	// The payload has at least its session_token: the credential follows
	// its last member.
	info.insertAt = pm.start + members[len(members)-1].end
	return info, nil
}

// insertRoute returns msg with "route_credential":{...} added as the last
// member of the payload.
func insertRoute(msg []byte, info authOKInfo, rc routeCredential) []byte {
	out := make([]byte, 0, len(msg)+320)
	out = append(out, msg[:info.insertAt]...)
	out = append(out, `,"route_credential":`...)
	out = rc.appendJSON(out)
	return append(out, msg[info.insertAt:]...)
}

// member is one member of a scanned object: its decoded key and the byte
// span of its raw value.
type member struct {
	key        string
	start, end int
}

// scanObject reads data as exactly one JSON object and returns its members
// with the byte spans of their values, and the offset of the closing brace.
func scanObject(data []byte) ([]member, int, error) {
	if !json.Valid(data) {
		return nil, 0, errNotAuthOK
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, 0, errNotAuthOK
	}
	var ms []member
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		key, ok := t.(string)
		if err != nil || !ok {
			return nil, 0, errNotAuthOK
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, 0, errNotAuthOK
		}
		end := int(dec.InputOffset())
		start := end - len(raw)
		if start < 0 || !bytes.Equal(data[start:end], raw) {
			return nil, 0, errNotAuthOK
		}
		if seen[key] {
			return nil, 0, errDuplicateKeys
		}
		seen[key] = true
		ms = append(ms, member{key: key, start: start, end: end})
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, 0, errNotAuthOK
	}
	closeAt := int(dec.InputOffset()) - 1
	if _, err := dec.Token(); err != io.EOF {
		return nil, 0, errNotAuthOK
	}
	return ms, closeAt, nil
}

func find(ms []member, key string) (member, bool) {
	for _, m := range ms {
		if m.key == key {
			return m, true
		}
	}
	return member{}, false
}

// jsonString decodes a member's value as a JSON string, or "".
func jsonString(data []byte, ms []member, key string) string {
	m, ok := find(ms, key)
	if !ok || data[m.start] != '"' {
		return ""
	}
	var s string
	if json.Unmarshal(data[m.start:m.end], &s) != nil {
		return ""
	}
	return s
}

// deviceIDOf reads payload.device_id from the client's auth frame, or "".
// Keys match exactly (maps, not structs: encoding/json would match struct
// fields case-insensitively, unlike the Relay).
func deviceIDOf(clientAuth []byte) string {
	var top map[string]json.RawMessage
	if json.Unmarshal(clientAuth, &top) != nil {
		return ""
	}
	var payload map[string]json.RawMessage
	if json.Unmarshal(top["payload"], &payload) != nil {
		return ""
	}
	raw := payload["device_id"]
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// ---------------------------------------------------------------------------
// Route credential cache

// routeCache remembers published route tokens (memory only, bounded) so a
// client that reconnects with the same Relay session gets the same
// credential while more than wire.RouteRenewBefore of it remains.
type routeCache struct {
	mu  sync.Mutex
	m   map[string]*routeEntry
	max int
}

type routeEntry struct {
	token      wire.Secret
	expiresAt  int64
	deviceHash wire.Digest
	ready      chan struct{} // closed once the publish finished
	ok         bool          // published (set before ready is closed)
}

func newRouteCache(max int) *routeCache {
	return &routeCache{m: map[string]*routeEntry{}, max: max}
}

func (r *routeCache) forget(credID string) {
	r.mu.Lock()
	delete(r.m, credID)
	r.mu.Unlock()
}

// putLocked stores e, evicting an expired entry, else the finished one that
// expires first, when the cache is full. Entries still publishing are never
// evicted; there are at most MaxPendingControl of them.
func (r *routeCache) putLocked(credID string, e *routeEntry, now int64) {
	if _, ok := r.m[credID]; !ok && len(r.m) >= r.max {
		victim, vexp := "", int64(0)
		for id, o := range r.m {
			if !isClosed(o.ready) {
				continue
			}
			if o.expiresAt <= now {
				victim = id
				break
			}
			if victim == "" || o.expiresAt < vexp {
				victim, vexp = id, o.expiresAt
			}
		}
		if victim != "" {
			delete(r.m, victim)
		}
	}
	r.m[credID] = e
}

// routeFor returns a published route credential for credID: the cached one
// while it still has more than RouteRenewBefore, does not outlive the
// session and belongs to the same device; else a new token, published
// first. Concurrent handoffs of the same session share one publish; other
// sessions never wait for it.
func (c *Connector) routeFor(ctx context.Context, credID string, exp int64, device wire.Digest) (*routeEntry, error) {
	r := c.routes
	renew := int64(wire.RouteRenewBefore / time.Second)
	for {
		now := c.cfg.Now().Unix()
		r.mu.Lock()
		e := r.m[credID]
		if e != nil && !isClosed(e.ready) {
			r.mu.Unlock()
			select {
			case <-e.ready:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if e != nil && e.ok && e.deviceHash == device && e.expiresAt <= exp && e.expiresAt-now > renew {
			r.mu.Unlock()
			c.count("route_reused")
			return e, nil
		}
		ne := &routeEntry{token: wire.NewToken(), expiresAt: exp, deviceHash: device, ready: make(chan struct{})}
		r.putLocked(credID, ne, now)
		r.mu.Unlock()

		err := c.publishRoute(ctx, wire.PublishRoute{
			CredentialID: credID, TokenSHA256: wire.TokenDigest(string(ne.token)),
			ExpiresAt: exp, DeviceIDHash: device,
		})
		r.mu.Lock()
		if err == nil {
			ne.ok = true
		} else if r.m[credID] == ne {
			delete(r.m, credID)
		}
		close(ne.ready)
		r.mu.Unlock()
		if err != nil {
			return nil, err
		}
		c.count("route_published")
		return ne, nil
	}
}

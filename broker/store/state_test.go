package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/wire"
)

var t0 = time.Unix(1_800_000_000, 0)

func route(host wire.ID, id, token string, exp int64) Credential {
	return Credential{Kind: wire.KindRoute, HostID: host, ID: id, Digest: wire.TokenDigest(token), ExpiresAt: exp, DeviceIDHash: wire.TokenDigest("dev")}
}

func boot(host wire.ID, id, token string, exp int64) Credential {
	return Credential{Kind: wire.KindBootstrap, HostID: host, ID: id, Digest: wire.TokenDigest(token), ExpiresAt: exp}
}

func code(err error) wire.Code {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code
	}
	return ""
}

func TestPublishRules(t *testing.T) {
	a, b := wire.NewID(), wire.NewID()
	s := NewState(100, 3)
	now := t0.Unix()
	if _, err := s.Publish(route(a, "r1", "t1", now+60), t0); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		c    Credential
		want wire.Code
	}{
		{"past expiry", route(a, "r2", "t2", now), wire.CodeExpired},
		{"bootstrap beyond an hour", boot(a, "p", "t3", now+3601), wire.CodeUnauthorized},
		{"another host's digest", route(b, "r1", "t1", now+60), wire.CodeUnauthorized},
		{"a route digest as bootstrap", boot(a, "p", "t1", now+60), wire.CodeUnauthorized},
		{"bad label", route(a, "", "t4", now+60), wire.CodeUnauthorized},
		{"host kind", Credential{Kind: wire.KindHost, HostID: a, ID: "x", Digest: wire.TokenDigest("t5"), ExpiresAt: now + 60}, wire.CodeUnauthorized},
	}
	for _, c := range cases {
		if _, err := s.Publish(c.c, t0); code(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
	// A route beyond 90 days is clamped.
	s.Publish(route(a, "far", "t6", now+1000*86400), t0)
	if c, _ := s.Lookup(wire.TokenDigest("t6")); c.ExpiresAt != now+int64(wire.MaxRouteLifetime/time.Second) {
		t.Fatalf("expiry %d not clamped", c.ExpiresAt)
	}
	// Quota: 3 live credentials; a replacement is fine, a new one is not.
	if _, err := s.Publish(route(a, "r3", "t7", now+60), t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Publish(route(a, "r5", "t10", now+60), t0); code(err) != wire.CodeQuotaExceeded {
		t.Fatalf("4th credential: %v", err)
	}
	replaced, err := s.Publish(route(a, "r1", "t8", now+60), t0)
	if err != nil || len(replaced) != 1 || replaced[0] != wire.TokenDigest("t1") {
		t.Fatalf("replacement: %v %v", replaced, err)
	}
	if _, ok := s.Lookup(wire.TokenDigest("t1")); ok {
		t.Fatal("replaced digest still known")
	}
	// Expired credentials stop counting towards the quota but stay known.
	if _, err := s.Publish(route(a, "r4", "t9", now+3660), t0.Add(time.Hour)); err != nil {
		t.Fatalf("expired credentials still count: %v", err)
	}
	if c, ok := s.Lookup(wire.TokenDigest("t8")); !ok || c.ExpiresAt > t0.Add(time.Hour).Unix() {
		t.Fatal("expired credential forgotten before its grace")
	}
	if s.LiveCredentials(a, t0.Add(time.Hour)) != 2 {
		t.Fatalf("live %d", s.LiveCredentials(a, t0.Add(time.Hour)))
	}
}

func TestConsumeAndRevoke(t *testing.T) {
	a := wire.NewID()
	s := NewState(2, 10)
	now := t0.Unix()
	s.Publish(boot(a, "p1", "b1", now+600), t0)
	s.Publish(route(a, "r1", "r1", now+600), t0)
	if s.Consume(wire.TokenDigest("r1"), t0) {
		t.Fatal("consumed a route")
	}
	if !s.Consume(wire.TokenDigest("b1"), t0) || !s.IsConsumed(wire.TokenDigest("b1"), t0) {
		t.Fatal("bootstrap not consumed")
	}
	if _, ok := s.Lookup(wire.TokenDigest("b1")); ok {
		t.Fatal("consumed bootstrap still published")
	}
	if s.IsConsumed(wire.TokenDigest("b1"), t0.Add(601*time.Second)) {
		t.Fatal("consumed entry outlived its expiry")
	}
	if _, err := s.Publish(boot(a, "p2", "b1", now+60), t0); code(err) != wire.CodeUnauthorized {
		t.Fatalf("republished a consumed digest: %v", err)
	}
	ds, err := s.Revoke(a, "r1", t0)
	if err != nil || len(ds) != 1 || !s.IsRevoked(wire.TokenDigest("r1"), t0) {
		t.Fatalf("revoke: %v %v", ds, err)
	}
	if ds, err := s.Revoke(a, "r1", t0); err != nil || len(ds) != 0 {
		t.Fatal("revoke is not idempotent")
	}
	// The consumed table (2 entries) fills up: Consume refuses, nothing is forgotten.
	s.Publish(boot(a, "p3", "b3", now+600), t0)
	s.Publish(boot(a, "p4", "b4", now+600), t0)
	if !s.Consume(wire.TokenDigest("b3"), t0) {
		t.Fatal("second consume refused")
	}
	if s.CanConsume(t0) || s.Consume(wire.TokenDigest("b4"), t0) {
		t.Fatal("consumed beyond the table bound")
	}
	if _, ok := s.Lookup(wire.TokenDigest("b4")); !ok {
		t.Fatal("a refused consume removed the credential")
	}
}

func TestStateFileRoundTrip(t *testing.T) {
	a, gone := wire.NewID(), wire.NewID()
	s := NewState(100, 10)
	now := t0.Unix()
	s.Publish(route(a, "r1", "r1", now+600), t0)
	s.Publish(boot(a, "p1", "b1", now+600), t0)
	s.Publish(boot(a, "p2", "b2", now+600), t0)
	s.Publish(route(gone, "r9", "r9", now+600), t0)
	s.Consume(wire.TokenDigest("b2"), t0)
	s.Publish(route(a, "r2", "r2", now+600), t0)
	s.Revoke(a, "r2", t0)
	data := s.Snapshot(t0).Marshal()
	if string(data) != string(s.Snapshot(t0).Marshal()) {
		t.Fatal("encoding is not deterministic")
	}
	snap, err := ParseState(data)
	if err != nil {
		t.Fatal(err)
	}
	r, dropped := Restore(snap, Hosts{a: wire.Digest{}}, 100, 10, t0)
	if dropped != 0 {
		t.Fatalf("dropped %d", dropped)
	}
	if c, ok := r.Lookup(wire.TokenDigest("r1")); !ok || c.ID != "r1" || c.DeviceIDHash != wire.TokenDigest("dev") {
		t.Fatalf("route lost: %+v", c)
	}
	if c, ok := r.Lookup(wire.TokenDigest("b1")); !ok || c.MaxUses != 1 {
		t.Fatal("bootstrap lost")
	}
	if _, ok := r.Lookup(wire.TokenDigest("r9")); ok {
		t.Fatal("a credential of a host no longer in the hosts file survived")
	}
	if !r.IsConsumed(wire.TokenDigest("b2"), t0) || !r.IsRevoked(wire.TokenDigest("r2"), t0) {
		t.Fatal("consumed or revoked digest lost")
	}
	// Later, everything has expired past its grace.
	later, _ := Restore(snap, Hosts{a: wire.Digest{}}, 100, 10, t0.Add(ExpiredGrace+time.Hour))
	if c, cons, rev := later.Len(); c+cons+rev != 0 {
		t.Fatalf("expired entries restored: %d %d %d", c, cons, rev)
	}
}

func TestParseStateRefusesDamage(t *testing.T) {
	a := wire.NewID()
	s := NewState(10, 10)
	s.Publish(route(a, "r1", "r1", t0.Unix()+60), t0)
	good := string(s.Snapshot(t0).Marshal())
	bad := map[string]string{
		"version 3":      strings.Replace(good, `"version":2`, `"version":3`, 1),
		"v1 with seq":    strings.Replace(good, `"version":2`, `"version":1`, 1),
		"v2 without seq": strings.Replace(good, `"journal_seq":0,`, ``, 1),
		"negative seq":   strings.Replace(good, `"journal_seq":0`, `"journal_seq":-1`, 1),
		"unknown key":    strings.Replace(good, `"version":2`, `"version":2,"x":1`, 1),
		"bad kind":       strings.Replace(good, `"kind":"route"`, `"kind":"host"`, 1),
		"route max_uses": strings.Replace(good, `"max_uses":0`, `"max_uses":1`, 1),
		"bad digest":     strings.Replace(good, `"token_sha256":"`, `"token_sha256":"x`, 1),
		"duplicate key":  strings.Replace(good, `"version":2`, `"version":2,"version":2`, 1),
		"float expiry":   strings.Replace(good, `"expires_at":`, `"expires_at":1.5e`, 1),
		"not json":       "{",
	}
	for name, data := range bad {
		if data == good {
			t.Fatalf("%s: replacement did not apply", name)
		}
		if _, err := ParseState([]byte(data)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestPersisterCoalescesAndWritesOutsideTheLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	var takes atomic.Int32
	release := make(chan struct{})
	h := wire.NewID()
	p := NewPersister(path, 0, func(compact bool) Batch {
		n := takes.Add(1)
		if n == 1 {
			<-release // the first write is slow
		}
		return Batch{Ops: []Op{opFor(boot(h, "p", string(rune('0'+n)), t0.Unix()+60))}}
	}, nil, zerolog.Nop())
	p.compact = false
	if err := os.WriteFile(JournalPath(path), journalMagic, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	g1 := p.Mark()
	time.Sleep(20 * time.Millisecond)
	var last uint64
	for i := 0; i < 50; i++ {
		last = p.Mark()
	}
	close(release)
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	if err := p.Wait(wctx, g1); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(wctx, last); err != nil {
		t.Fatal(err)
	}
	if n := takes.Load(); n != 2 {
		t.Fatalf("%d writes for 51 marks", n)
	}
	data, _ := os.ReadFile(JournalPath(path))
	j, err := ParseJournal(data)
	if err != nil || len(j.Ops) != 2 || j.Seqs[1] != 2 || j.Ops[1].Cred.Digest != wire.TokenDigest("2") {
		t.Fatalf("journal %+v %v", j, err)
	}
	cancel()
	<-done
}

func TestPersisterReportsWriteErrors(t *testing.T) {
	p := NewPersister(filepath.Join(t.TempDir(), "missing", "state.json"), 0, func(bool) Batch { return Batch{Snap: &Snapshot{}} }, nil, zerolog.Nop())
	g := p.Mark()
	if err := p.Flush(); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
	if err := p.Wait(context.Background(), g); err == nil {
		t.Fatal("Wait hid the write error")
	}
}

// Record's undo restores exactly what a publish, a revoke or a consume
// changed, newest first, as the broker does after a failed state write.
func TestRecordUndoRestoresTheState(t *testing.T) {
	h := wire.NewID()
	s := NewState(10, 10)
	route := func(tok string) Credential {
		return Credential{Kind: wire.KindRoute, HostID: h, ID: "r", Digest: wire.TokenDigest(tok), ExpiresAt: t0.Unix() + 60, DeviceIDHash: wire.TokenDigest("d")}
	}
	s.Publish(route("old"), t0)
	s.Publish(Credential{Kind: wire.KindBootstrap, HostID: h, ID: "p", Digest: wire.TokenDigest("b"), ExpiresAt: t0.Unix() + 60}, t0)
	before := s.Snapshot(t0).Marshal()
	var undos []func()
	for _, change := range []func() error{
		func() error { _, err := s.Publish(route("new"), t0); return err }, // replaces "old"
		func() error { _, err := s.Revoke(h, "r", t0); return err },
		func() error { s.Consume(wire.TokenDigest("b"), t0); return nil },
	} {
		undo, err := s.Record(change)
		if err != nil {
			t.Fatal(err)
		}
		undos = append(undos, undo)
	}
	if bytes.Equal(s.Snapshot(t0).Marshal(), before) {
		t.Fatal("the changes changed nothing")
	}
	for i := len(undos) - 1; i >= 0; i-- {
		undos[i]()
	}
	if got := s.Snapshot(t0).Marshal(); !bytes.Equal(got, before) {
		t.Fatalf("after undo:\n%s\nwant:\n%s", got, before)
	}
	if _, ok := s.Lookup(wire.TokenDigest("old")); !ok || s.IsRevoked(wire.TokenDigest("new"), t0) || s.IsConsumed(wire.TokenDigest("b"), t0) {
		t.Fatal("undo left a change behind")
	}
}

func TestReplayCacheCountsPerCredentialAndHost(t *testing.T) {
	h1, h2 := wire.NewID(), wire.NewID()
	c1, c2, c3 := wire.TokenDigest("1"), wire.TokenDigest("2"), wire.TokenDigest("3")
	r := NewReplayCache(100, 3, 2)
	add := func(h wire.ID, c wire.Digest, exp int64) bool { return r.Add(wire.NewID(), h, c, exp, 0) }
	if !add(h1, c1, 10) || !add(h1, c1, 20) || add(h1, c1, 20) {
		t.Fatal("per-credential cap of 2")
	}
	if !add(h1, c2, 20) || add(h1, c2, 20) {
		t.Fatal("per-host cap of 3")
	}
	if !add(h2, c3, 20) {
		t.Fatal("another host is unaffected")
	}
	id := wire.NewID()
	if !r.Add(id, h2, c3, 20, 0) || r.Add(id, h2, c3, 20, 0) || !r.Seen(id, 19) || r.Seen(id, 20) {
		t.Fatal("an id is accepted once, until it expires")
	}
	// The first entry expires at 10: room again, counted down.
	if !r.Add(wire.NewID(), h1, c1, 30, 10) {
		t.Fatal("an expired entry still counts")
	}
	if hn, cn := r.Counts(h1, c1); hn != 3 || cn != 2 {
		t.Fatalf("counts %d %d", hn, cn)
	}
}

// A host revoking in a loop keeps only its share of the revoked table: it
// forgets its own oldest (first-expiring) revoked digests, another host's
// stay and its revokes work; a revoke that is undone (its write failed)
// brings the evicted entries back; and a table full of entries of unknown
// hosts (a state file does not name them) forgets its oldest rather than
// refusing the revoke.
func TestRevokedTableSharesPerHost(t *testing.T) {
	a, b := wire.NewID(), wire.NewID()
	s := NewState(40, 10)
	s.SetRevokedShare(8)
	now := t0.Unix()
	loop := func(host wire.ID, prefix string, n int) []wire.Digest {
		t.Helper()
		var ds []wire.Digest
		for i := 0; i < n; i++ {
			id := prefix + string(rune('a'+i%26)) + string(rune('a'+i/26))
			if _, err := s.Publish(route(host, id, prefix+id, now+1000+int64(i)), t0); err != nil {
				t.Fatal(err)
			}
			got, err := s.Revoke(host, id, t0)
			if err != nil || len(got) != 1 {
				t.Fatalf("revoke %d of host: %v %v", i, got, err)
			}
			ds = append(ds, got[0])
		}
		return ds
	}
	bs := loop(b, "b", 3)
	as := loop(a, "a", 100)
	if s.RevokedBy(a) != 8 || s.RevokedBy(b) != 3 {
		t.Fatalf("shares a=%d b=%d", s.RevokedBy(a), s.RevokedBy(b))
	}
	for i, d := range as {
		if want := i >= len(as)-8; s.IsRevoked(d, t0) != want {
			t.Fatalf("a's revoked %d: %v", i, !want)
		}
	}
	for _, d := range bs {
		if !s.IsRevoked(d, t0) {
			t.Fatal("a's loop pushed out b's revoked digest")
		}
	}
	// Undo of a revoke that evicted: everything as before.
	s.Publish(route(a, "x", "ax", now+5000), t0)
	before := s.Snapshot(t0).Marshal()
	undo, err := s.Record(func() error { _, err := s.Revoke(a, "x", t0); return err })
	if err != nil || s.IsRevoked(as[len(as)-8], t0) {
		t.Fatalf("revoke past the share: %v", err)
	}
	undo()
	if got := s.Snapshot(t0).Marshal(); !bytes.Equal(got, before) || s.RevokedBy(a) != 8 {
		t.Fatalf("undo did not restore the evicted entry (share %d)", s.RevokedBy(a))
	}

	// After a restart no entry has a known host; fill the table with them.
	snap := s.Snapshot(t0)
	for i := len(snap.Revoked); i < 40; i++ {
		snap.Revoked = append(snap.Revoked, DigestExpiry{wire.TokenDigest(string(rune(i))), now + 100 + int64(i)})
	}
	hosts := Hosts{a: {}, b: {}}
	r, dropped := Restore(snap, hosts, 40, 10, t0)
	r.SetRevokedShare(8)
	if dropped != 0 || r.RevokedBy(b) != 0 {
		t.Fatalf("restore dropped %d, b=%d", dropped, r.RevokedBy(b))
	}
	if _, err := r.Publish(route(b, "late", "blate", now+9000), t0); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Revoke(b, "late", t0); err != nil || len(got) != 1 || !r.IsRevoked(got[0], t0) {
		t.Fatalf("revoke on a full table of unknown hosts: %v %v", got, err)
	}
	if _, c, rv := r.Len(); rv != 40 || c != 0 {
		t.Fatalf("revoked table holds %d", rv)
	}
}

// Another instance's revoke of a digest this one already holds as revoked
// keeps the entry's host: the host's share must stay counted once, and go
// when the entry goes.
func TestMirroredRevokeKeepsTheHostsShare(t *testing.T) {
	a := wire.NewID()
	s := NewState(40, 10)
	s.SetRevokedShare(8)
	now := t0.Unix()
	if _, err := s.Publish(route(a, "x", "ax", now+1000), t0); err != nil {
		t.Fatal(err)
	}
	got, err := s.Revoke(a, "x", t0)
	if err != nil || len(got) != 1 {
		t.Fatalf("revoke: %v %v", got, err)
	}
	if !s.ApplyOp(Op{Kind: OpRevoked, Digest: got[0], ExpiresAt: now + 2000}, t0) {
		t.Fatal("mirrored revoke refused")
	}
	if n := s.RevokedBy(a); n != 1 {
		t.Fatalf("host's share after the mirrored revoke: %d, want 1", n)
	}
	s.revoked.Remove(got[0])
	if n := s.RevokedBy(a); n != 0 {
		t.Fatalf("host's share after its entry left: %d, want 0", n)
	}
}

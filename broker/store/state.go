package store

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/strictjson"
)

// MaxStateFileBytes bounds the state file. Its largest legal content is
// max_hosts × 2048 credentials plus two full digest tables, a few hundred
// MiB at the default bounds; anything larger is not ours.
const MaxStateFileBytes = 1 << 30

// ExpiredGrace is how long a credential is kept after it expired, so a
// client presenting it is told `expired` (as the matching order requires)
// rather than `unauthorized`. Expired credentials do not count towards the
// per-host quota; each host keeps at most as many as its quota.
const ExpiredGrace = 24 * time.Hour

// Credential is one published bootstrap or route credential. Only the
// digest of its token is known.
type Credential struct {
	Kind   wire.Kind // KindBootstrap or KindRoute
	HostID wire.ID   // the host that published it, the only one it routes to
	// ID is the pairing_id of a bootstrap or the credential_id of a route.
	ID        string
	Digest    wire.Digest
	ExpiresAt int64 // Unix seconds
	// MaxUses is 1 for a bootstrap (consumed at its first match) and 0,
	// meaning unlimited, for a route.
	MaxUses      int
	DeviceIDHash wire.Digest // route only
}

// State is the broker's credential table: published credentials plus the
// consumed and revoked digests, which outlive the credentials they came
// from. It is not safe for concurrent use; the broker holds its lock around
// every call and persists a Snapshot outside that lock.
type State struct {
	creds      map[wire.Digest]*Credential
	byHost     map[wire.ID]map[wire.Digest]struct{}
	consumed   *Table[wire.Digest, struct{}]
	maxPerHost int
	// revoked holds each revoked digest with the host that revoked it (zero
	// when unknown: read from the state file, which does not name it, or
	// mirrored from another instance); revokedBy is its index per host,
	// each host holding at most revokedShare entries (Revoke).
	revoked      *Table[wire.Digest, wire.ID]
	revokedBy    *hostShares[wire.Digest]
	revokedShare int
	// undo, while Record runs, collects the inverse of every change.
	undo      []func()
	recording bool
	// pending, once EnableJournal was called, collects every change as a
	// journal record until TakePending; muted suppresses that while an
	// undo runs (an undone change was never written).
	pending    []Op
	journaling bool
	muted      bool
}

// EnableJournal makes the state collect its changes for TakePending.
func (s *State) EnableJournal() { s.journaling = true }

// TakePending returns the changes made since the last call, in order.
func (s *State) TakePending() []Op {
	ops := s.pending
	s.pending = nil
	return ops
}

// DiscardPending forgets the changes not taken yet: they are being undone,
// or a compaction writes them as part of a snapshot.
func (s *State) DiscardPending() { s.pending = nil }

// emit records op for the journal.
func (s *State) emit(op Op) {
	if s.journaling && !s.muted {
		s.pending = append(s.pending, op)
	}
}

// Record runs change (one of Publish, Revoke or Consume, or several) and
// returns a function that reverts everything change did to the credentials
// and the consumed and revoked tables. The broker keeps it until the change
// is on disk and calls it when the state file cannot be written, so memory
// never keeps a change that was not acknowledged. Undo functions of several
// changes must be called newest first.
func (s *State) Record(change func() error) (undo func(), err error) {
	s.undo, s.recording = nil, true
	err = change()
	ops := s.undo
	s.undo, s.recording = nil, false
	revert := func() {
		s.muted = true
		for i := len(ops) - 1; i >= 0; i-- {
			ops[i]()
		}
		s.muted = false
	}
	if err != nil {
		revert()
		return nil, err
	}
	return revert, nil
}

// note records the inverse of a change while Record runs.
func (s *State) note(inverse func()) {
	if s.recording {
		s.undo = append(s.undo, inverse)
	}
}

// tableAdd is t.Add that notes how to restore k's previous entry.
func (s *State) tableAdd(t *Table[wire.Digest, struct{}], k wire.Digest, exp, now int64) bool {
	old, had := t.m[k]
	if !t.Add(k, struct{}{}, exp, now) {
		return false
	}
	if exp > now {
		s.emit(Op{Kind: OpConsumed, Digest: k, ExpiresAt: exp})
	}
	s.note(func() {
		t.Remove(k)
		if had {
			t.m[k] = old
			t.push(k, old.exp)
		}
	})
	return true
}

// addRevoked remembers d as revoked by host until exp (Revoke has made
// room) and notes how to restore d's previous entry.
func (s *State) addRevoked(d wire.Digest, host wire.ID, exp, now int64) {
	if exp <= now {
		return // already expired: nothing to remember
	}
	old, had, ok := s.putRevoked(d, host, exp, now)
	if !ok {
		return
	}
	s.emit(Op{Kind: OpRevoked, Digest: d, ExpiresAt: exp})
	s.note(func() {
		s.revoked.Remove(d)
		if had {
			s.restoreRevoked(d, old)
		}
	})
}

// putRevoked stores d as revoked by host until exp and keeps each host's
// count in revokedBy right, for a revoke of this instance and one mirrored
// from another alike; it returns the entry it replaced, and false when the
// table had no room.
func (s *State) putRevoked(d wire.Digest, host wire.ID, exp, now int64) (old tableEntry[wire.ID], had, ok bool) {
	old, had = s.revoked.m[d]
	if !s.revoked.Add(d, host, exp, now) {
		return old, had, false
	}
	cur := s.revoked.m[d]
	switch {
	case had && old.v == cur.v:
		if cur.exp != old.exp && !cur.v.IsZero() {
			s.revokedBy.added(cur.v, d, cur.exp, true)
		}
	default:
		if had && !old.v.IsZero() {
			s.revokedBy.removed(old.v)
		}
		if !cur.v.IsZero() {
			s.revokedBy.added(cur.v, d, cur.exp, false)
		}
	}
	return old, had, true
}

// evictRevoked forgets the revoked digest d before its expiry (Revoke says
// why that is safe) and notes how to restore it. Nothing is journaled: an
// entry that comes back at the next start only refuses more.
func (s *State) evictRevoked(d wire.Digest) {
	e := s.revoked.m[d]
	s.revoked.Remove(d)
	s.note(func() { s.restoreRevoked(d, e) })
}

func (s *State) restoreRevoked(d wire.Digest, e tableEntry[wire.ID]) {
	s.revoked.m[d] = e
	s.revoked.push(d, e.exp)
	if !e.v.IsZero() {
		s.revokedBy.added(e.v, d, e.exp, false)
	}
}

// SetRevokedShare bounds the revoked digests one host holds (at least 1);
// NewState leaves the share at the whole table.
func (s *State) SetRevokedShare(n int) { s.revokedShare = max(1, n) }

// RevokedBy counts the revoked digests attributed to host.
func (s *State) RevokedBy(host wire.ID) int { return s.revokedBy.count(host) }

// NewState returns an empty state whose consumed and revoked tables hold
// at most tableEntries digests each and whose hosts may hold at most
// maxPerHost live credentials each.
func NewState(tableEntries, maxPerHost int) *State {
	if maxPerHost < 1 {
		maxPerHost = 1
	}
	s := &State{
		creds:        map[wire.Digest]*Credential{},
		byHost:       map[wire.ID]map[wire.Digest]struct{}{},
		consumed:     NewTable[wire.Digest, struct{}](tableEntries),
		revoked:      NewTable[wire.Digest, wire.ID](tableEntries),
		revokedShare: max(1, tableEntries),
		maxPerHost:   maxPerHost,
	}
	s.revokedBy = newHostShares(func(host wire.ID, d wire.Digest, exp int64) bool {
		e, ok := s.revoked.m[d]
		return ok && e.exp == exp && e.v == host
	})
	s.revoked.onEvict = func(_ wire.Digest, host wire.ID) {
		if !host.IsZero() {
			s.revokedBy.removed(host)
		}
	}
	return s
}

// Lookup returns the credential with digest d, expired or not.
func (s *State) Lookup(d wire.Digest) (Credential, bool) {
	c, ok := s.creds[d]
	if !ok || !c.Digest.Equal(d) {
		return Credential{}, false
	}
	return *c, true
}

// IsConsumed reports whether d is a bootstrap digest already used.
func (s *State) IsConsumed(d wire.Digest, now time.Time) bool {
	return s.consumed.Contains(d, now.Unix())
}

// IsRevoked reports whether d was revoked and has not expired since.
func (s *State) IsRevoked(d wire.Digest, now time.Time) bool {
	return s.revoked.Contains(d, now.Unix())
}

// CanConsume reports whether the consumed table has room for one more
// digest; when it has none, bootstrap matches are refused with
// quota_exceeded rather than forgetting a consumed digest early.
func (s *State) CanConsume(now time.Time) bool { return s.consumed.Room(now.Unix()) > 0 }

// Consume uses up the bootstrap credential d: it is removed and its digest
// remembered as consumed until its expiry. It returns false, changing
// nothing, when d is not a bootstrap or the consumed table is full.
func (s *State) Consume(d wire.Digest, now time.Time) bool {
	c, ok := s.creds[d]
	if !ok || c.Kind != wire.KindBootstrap {
		return false
	}
	if !s.tableAdd(s.consumed, d, c.ExpiresAt, now.Unix()) {
		return false
	}
	s.remove(d)
	return true
}

// Publish stores a credential published by c.HostID, after the checks of
// the host control channel: c.ExpiresAt is the raw published value and is
// checked (and, for a route, clamped) with wire.CheckExpiry; a digest
// that is consumed, revoked, owned by another host or of the other kind is
// unauthorized; a route replaces any earlier route with the same
// credential_id of the same host; a host already holding maxPerHost live
// credentials gets quota_exceeded. On error nothing changes. It returns the
// digests that a route replacement removed.
func (s *State) Publish(c Credential, now time.Time) (replaced []wire.Digest, err error) {
	exp, err := wire.CheckExpiry(c.Kind, c.ExpiresAt, now)
	if err != nil {
		return nil, err
	}
	c.ExpiresAt = exp
	switch c.Kind {
	case wire.KindBootstrap:
		c.MaxUses, c.DeviceIDHash = 1, wire.Digest{}
	case wire.KindRoute:
		c.MaxUses = 0
	default:
		return nil, &wire.Error{Code: wire.CodeUnauthorized, Detail: "credential kind cannot be published"}
	}
	if !wire.ValidLabel(c.ID) {
		return nil, &wire.Error{Code: wire.CodeUnauthorized, Detail: "bad credential label"}
	}
	n := now.Unix()
	if s.consumed.Contains(c.Digest, n) || s.revoked.Contains(c.Digest, n) {
		return nil, &wire.Error{Code: wire.CodeUnauthorized, Detail: "digest was consumed or revoked"}
	}
	existing, exists := s.creds[c.Digest]
	if exists && (existing.HostID != c.HostID || existing.Kind != c.Kind) {
		return nil, &wire.Error{Code: wire.CodeUnauthorized, Detail: "digest belongs to another host or kind"}
	}
	live := 0
	var expired []*Credential
	for d := range s.byHost[c.HostID] {
		o := s.creds[d]
		if c.Kind == wire.KindRoute && o.Kind == wire.KindRoute && o.ID == c.ID && d != c.Digest {
			replaced = append(replaced, d)
			continue
		}
		if d == c.Digest {
			continue
		}
		if o.ExpiresAt > n {
			live++
		} else {
			expired = append(expired, o)
		}
	}
	if live >= s.maxPerHost {
		return nil, &wire.Error{Code: wire.CodeQuotaExceeded, Detail: "host holds the maximum number of live credentials"}
	}
	for _, d := range replaced {
		s.remove(d)
	}
	// Expired credentials kept for their grace period are bounded per host
	// too: drop the oldest ones beyond the quota.
	if extra := len(expired) - s.maxPerHost; extra > 0 {
		sort.Slice(expired, func(i, j int) bool { return expired[i].ExpiresAt < expired[j].ExpiresAt })
		for _, o := range expired[:extra] {
			s.remove(o.Digest)
		}
	}
	s.put(&c)
	return replaced, nil
}

// Revoke deletes the route credential credentialID of host and remembers
// each deleted digest as revoked until its expiry. It returns the deleted
// digests (none when the credential is unknown, which is not an error: a
// revoke is idempotent).
//
// Each host holds at most its share of the revoked table: past it, the
// host's own oldest revoked digests (the first to expire) are forgotten,
// and while the table is full (more hosts hold entries than it has shares
// for, or entries of unknown hosts fill it), the oldest of all. So one host
// revoking in a loop can neither make another host's revoke fail nor push
// out its entries. Forgetting a revoked digest early re-enables nothing:
// the revoke deleted its credential, so a client presenting it is refused
// (unauthorized instead of revoked), and it routes again only if a holder
// of the host token publishes that very digest again — who can publish a
// token of their own anyway; the connector never re-publishes a revoked
// token (it forgets it and mints a new one).
func (s *State) Revoke(host wire.ID, credentialID string, now time.Time) ([]wire.Digest, error) {
	n := now.Unix()
	var victims []wire.Digest
	for d := range s.byHost[host] {
		if c := s.creds[d]; c.Kind == wire.KindRoute && c.ID == credentialID {
			victims = append(victims, d)
		}
	}
	if need := 0; len(victims) > 0 {
		for _, d := range victims {
			if s.creds[d].ExpiresAt > n && !s.revoked.Contains(d, n) {
				need++
			}
		}
		for need > 0 && s.revokedBy.count(host)+need > s.revokedShare {
			d, ok := s.revokedBy.oldest(host)
			if !ok {
				break
			}
			s.evictRevoked(d)
		}
		for need > 0 && s.revoked.Room(n) < need {
			d, ok := s.revoked.oldest(n)
			if !ok {
				break
			}
			s.evictRevoked(d)
		}
		if s.revoked.Room(n) < need || need > s.revokedShare {
			// Not reached: a credential_id has one live digest.
			return nil, &wire.Error{Code: wire.CodeQuotaExceeded, Detail: "revoked table is full"}
		}
	}
	for _, d := range victims {
		s.addRevoked(d, host, s.creds[d].ExpiresAt, n)
		s.remove(d)
	}
	return victims, nil
}

// DropHost removes every credential of host (it left the hosts file).
func (s *State) DropHost(host wire.ID) int {
	ds := s.byHost[host]
	n := len(ds)
	for d := range ds {
		s.remove(d)
	}
	return n
}

// RetainHosts drops the credentials of every host not in keep.
func (s *State) RetainHosts(keep Hosts) int {
	n := 0
	for h := range s.byHost {
		if _, ok := keep[h]; !ok {
			n += s.DropHost(h)
		}
	}
	return n
}

// Sweep forgets credentials past their grace period and expired table
// entries, and reports whether anything changed.
func (s *State) Sweep(now time.Time) bool {
	n := now.Unix()
	cut := n - int64(ExpiredGrace/time.Second)
	changed := false
	for d, c := range s.creds {
		if c.ExpiresAt <= cut {
			s.remove(d)
			changed = true
		}
	}
	if s.consumed.Sweep(n) > 0 {
		changed = true
	}
	if s.revoked.Sweep(n) > 0 {
		changed = true
	}
	return changed
}

// Len reports the number of credentials, consumed and revoked digests.
func (s *State) Len() (creds, consumed, revoked int) {
	return len(s.creds), s.consumed.Len(), s.revoked.Len()
}

// LiveCredentials counts host's credentials that have not expired.
func (s *State) LiveCredentials(host wire.ID, now time.Time) int {
	n := 0
	for d := range s.byHost[host] {
		if s.creds[d].ExpiresAt > now.Unix() {
			n++
		}
	}
	return n
}

func (s *State) put(c *Credential) {
	if old, had := s.creds[c.Digest]; had {
		if old.HostID != c.HostID {
			s.remove(c.Digest)
		}
		s.note(func() { s.put(old) })
	} else {
		s.note(func() { s.remove(c.Digest) })
	}
	s.creds[c.Digest] = c
	s.emit(opFor(*c))
	m := s.byHost[c.HostID]
	if m == nil {
		m = map[wire.Digest]struct{}{}
		s.byHost[c.HostID] = m
	}
	m[c.Digest] = struct{}{}
}

func (s *State) remove(d wire.Digest) {
	c, ok := s.creds[d]
	if !ok {
		return
	}
	s.note(func() { s.put(c) })
	delete(s.creds, d)
	s.emit(Op{Kind: OpDelete, Digest: d})
	if m := s.byHost[c.HostID]; m != nil {
		delete(m, d)
		if len(m) == 0 {
			delete(s.byHost, c.HostID)
		}
	}
}

// ---------------------------------------------------------------------------
// State file

// stateVersion is the "version" of the state file format: 2 is a snapshot
// followed by a journal (journal.go) and names the last journal record it
// holds; 1 is the single-file format of earlier releases, still read.
const stateVersion = 2

// Snapshot is a copy of the state taken under the broker's lock and encoded
// outside it, so a slow disk never holds up other peers.
type Snapshot struct {
	Credentials []Credential
	Consumed    []DigestExpiry
	Revoked     []DigestExpiry
	// Seq is the last journal record the snapshot holds.
	Seq uint64
	// version is the format it was read from (0 when not read).
	version int
}

// DigestExpiry is one entry of the consumed or revoked table.
type DigestExpiry struct {
	Digest    wire.Digest
	ExpiresAt int64
}

// Snapshot copies everything worth persisting.
func (s *State) Snapshot(now time.Time) Snapshot {
	n := now.Unix()
	snap := Snapshot{Credentials: make([]Credential, 0, len(s.creds))}
	for _, c := range s.creds {
		snap.Credentials = append(snap.Credentials, *c)
	}
	s.consumed.Each(n, func(d wire.Digest, _ struct{}, exp int64) {
		snap.Consumed = append(snap.Consumed, DigestExpiry{d, exp})
	})
	s.revoked.Each(n, func(d wire.Digest, _ wire.ID, exp int64) {
		snap.Revoked = append(snap.Revoked, DigestExpiry{d, exp})
	})
	return snap
}

// The JSON form of the state file. Keys are exact; see ParseState.
type stateJSON struct {
	Version     int              `json:"version"`
	JournalSeq  *uint64          `json:"journal_seq,omitempty"`
	Credentials []credentialJSON `json:"credentials"`
	Consumed    []digestJSON     `json:"consumed"`
	Revoked     []digestJSON     `json:"revoked"`
}

type credentialJSON struct {
	Kind         wire.Kind `json:"kind"`
	HostID       string    `json:"host_id"`
	ID           string    `json:"id"`
	TokenSHA256  string    `json:"token_sha256"`
	ExpiresAt    int64     `json:"expires_at"`
	MaxUses      int       `json:"max_uses"`
	DeviceIDHash string    `json:"device_id_hash,omitempty"`
}

type digestJSON struct {
	TokenSHA256 string `json:"token_sha256"`
	ExpiresAt   int64  `json:"expires_at"`
}

// Marshal encodes the snapshot deterministically (sorted), so two snapshots
// of the same state are byte-identical.
func (snap Snapshot) Marshal() []byte {
	seq := snap.Seq
	out := stateJSON{
		Version:     stateVersion,
		JournalSeq:  &seq,
		Credentials: make([]credentialJSON, 0, len(snap.Credentials)),
		Consumed:    make([]digestJSON, 0, len(snap.Consumed)),
		Revoked:     make([]digestJSON, 0, len(snap.Revoked)),
	}
	for _, c := range snap.Credentials {
		j := credentialJSON{
			Kind: c.Kind, HostID: c.HostID.String(), ID: c.ID, TokenSHA256: c.Digest.String(),
			ExpiresAt: c.ExpiresAt, MaxUses: c.MaxUses,
		}
		if c.Kind == wire.KindRoute {
			j.DeviceIDHash = c.DeviceIDHash.String()
		}
		out.Credentials = append(out.Credentials, j)
	}
	sort.Slice(out.Credentials, func(i, j int) bool {
		return out.Credentials[i].TokenSHA256 < out.Credentials[j].TokenSHA256
	})
	conv := func(in []DigestExpiry) []digestJSON {
		o := make([]digestJSON, 0, len(in))
		for _, e := range in {
			o = append(o, digestJSON{e.Digest.String(), e.ExpiresAt})
		}
		sort.Slice(o, func(i, j int) bool { return o[i].TokenSHA256 < o[j].TokenSHA256 })
		return o
	}
	out.Consumed = conv(snap.Consumed)
	out.Revoked = conv(snap.Revoked)
	b, _ := json.Marshal(out) // only strings and integers: cannot fail
	return append(b, '\n')
}

// ParseState decodes a state file into a Snapshot. The format is strict
// (exact keys, no duplicates, canonical ids and digests, known kinds, a
// device_id_hash exactly on routes, max_uses 1 on bootstraps and 0 on
// routes): a damaged state file stops the broker rather than silently
// re-enabling a consumed or revoked token. Entries that have expired are
// kept here; Restore decides what to drop.
func ParseState(data []byte) (Snapshot, error) {
	if len(data) > MaxStateFileBytes {
		return Snapshot{}, fmt.Errorf("larger than %d bytes", MaxStateFileBytes)
	}
	var f stateJSON
	if err := strictjson.Decode(data, 0, &f); err != nil {
		return Snapshot{}, fmt.Errorf("not a state file: %v", err)
	}
	switch {
	case f.Version == 1 && f.JournalSeq == nil:
	case f.Version == stateVersion && f.JournalSeq != nil:
	case f.Version == 1 || f.Version == stateVersion:
		return Snapshot{}, fmt.Errorf("journal_seq is required in version %d and only there", stateVersion)
	default:
		return Snapshot{}, fmt.Errorf("unsupported state file version %d", f.Version)
	}
	snap := Snapshot{version: f.Version}
	if f.JournalSeq != nil {
		snap.Seq = *f.JournalSeq
	}
	for i, j := range f.Credentials {
		bad := func(what string) (Snapshot, error) {
			return Snapshot{}, fmt.Errorf("credential %d: %s", i+1, what)
		}
		c := Credential{Kind: j.Kind, ID: j.ID, ExpiresAt: j.ExpiresAt, MaxUses: j.MaxUses}
		var err error
		if c.HostID, err = wire.ParseID(j.HostID); err != nil {
			return bad("host_id is not canonical")
		}
		if c.Digest, err = wire.ParseDigest(j.TokenSHA256); err != nil {
			return bad("token_sha256 is not canonical")
		}
		if !wire.ValidLabel(j.ID) {
			return bad("id is not a valid label")
		}
		switch j.Kind {
		case wire.KindBootstrap:
			if j.MaxUses != 1 || j.DeviceIDHash != "" {
				return bad("a bootstrap has max_uses 1 and no device_id_hash")
			}
		case wire.KindRoute:
			if j.MaxUses != 0 {
				return bad("a route has max_uses 0")
			}
			if c.DeviceIDHash, err = wire.ParseDigest(j.DeviceIDHash); err != nil {
				return bad("device_id_hash is not canonical")
			}
		default:
			return bad("kind is neither bootstrap nor route")
		}
		snap.Credentials = append(snap.Credentials, c)
	}
	conv := func(name string, in []digestJSON) ([]DigestExpiry, error) {
		out := make([]DigestExpiry, 0, len(in))
		for i, j := range in {
			d, err := wire.ParseDigest(j.TokenSHA256)
			if err != nil {
				return nil, fmt.Errorf("%s entry %d: token_sha256 is not canonical", name, i+1)
			}
			out = append(out, DigestExpiry{d, j.ExpiresAt})
		}
		return out, nil
	}
	var err error
	if snap.Consumed, err = conv("consumed", f.Consumed); err != nil {
		return Snapshot{}, err
	}
	if snap.Revoked, err = conv("revoked", f.Revoked); err != nil {
		return Snapshot{}, err
	}
	return snap, nil
}

// Restore rebuilds a State from a snapshot: credentials of hosts no longer
// in hosts, past their grace period, or duplicated are dropped, expired
// table entries are skipped, and each host keeps at most maxPerHost live
// credentials (the latest-expiring ones). It reports how many entries it
// dropped because a bound was reached, which the caller logs.
func Restore(snap Snapshot, hosts Hosts, tableEntries, maxPerHost int, now time.Time) (*State, int) {
	s := NewState(tableEntries, maxPerHost)
	n := now.Unix()
	cut := n - int64(ExpiredGrace/time.Second)
	dropped := 0
	creds := append([]Credential(nil), snap.Credentials...)
	sort.SliceStable(creds, func(i, j int) bool { return creds[i].ExpiresAt > creds[j].ExpiresAt })
	kept := map[wire.ID][2]int{} // live, expired
	for _, c := range creds {
		if _, ok := hosts[c.HostID]; !ok || c.ExpiresAt <= cut {
			continue
		}
		if _, dup := s.creds[c.Digest]; dup {
			dropped++
			continue
		}
		k := kept[c.HostID]
		i := 1
		if c.ExpiresAt > n {
			i = 0
		}
		if k[i] >= maxPerHost {
			dropped++
			continue
		}
		k[i]++
		kept[c.HostID] = k
		c := c
		s.put(&c)
	}
	for _, e := range snap.Consumed {
		if !s.consumed.Add(e.Digest, struct{}{}, e.ExpiresAt, n) {
			dropped++
		}
	}
	for _, e := range snap.Revoked {
		if !s.revoked.Add(e.Digest, wire.ID{}, e.ExpiresAt, n) {
			dropped++
		}
	}
	return s, dropped
}

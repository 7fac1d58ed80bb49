package store

import (
	"encoding/binary"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// ReplayCache remembers the connection_ids of accepted registrations until
// they expire (spec/reach.md "Registration"). Entries are counted per
// credential and per host, so one credential — or one host's credentials
// together — filling its share gets quota_exceeded while every other
// credential and host keeps working; the table as a whole is bounded by
// maxTotal. Expiries are Unix seconds. Not safe for concurrent use.
type ReplayCache struct {
	t       *Table[wire.ID, replayOwner]
	perCred map[uint64]int
	perHost map[wire.ID]int
	maxCred int
	maxHost int
	// own, in a host table (NewHostReplayCache), finds each host's oldest
	// entry: there a full share or table forgets an old entry instead of
	// refusing the registration.
	own *hostShares[wire.ID]
	// Evicted counts entries forgotten before their expiry.
	Evicted int
}

// replayOwner is what an entry is counted against. The credential is
// known by the first 8 bytes of its digest (uniform, being a SHA-256), which
// keeps an entry small; 0 means not counted per credential.
type replayOwner struct {
	host wire.ID
	cred uint64
}

func credKey(d wire.Digest) uint64 { return binary.LittleEndian.Uint64(d[:8]) }

// NewReplayCache holds at most maxTotal entries, maxHost per host and
// maxCred per credential digest (a zero digest is not counted per
// credential: host registrations use it).
func NewReplayCache(maxTotal, maxHost, maxCred int) *ReplayCache {
	r := &ReplayCache{
		t:       NewTable[wire.ID, replayOwner](maxTotal),
		perCred: map[uint64]int{},
		perHost: map[wire.ID]int{},
		maxCred: maxCred,
		maxHost: maxHost,
	}
	r.t.onEvict = r.forget
	return r
}

// NewHostReplayCache is the replay cache of host registrations: at most
// maxTotal entries and maxHost per host, where a registration is never
// refused for room. Past its share a host forgets its own oldest
// connection_id, and a full table (more hosts than maxTotal/maxHost hold
// entries) the oldest of all: a host's connection_id guards nothing its
// registration does not already carry, the host token, so forgetting one
// early lets a replayer do only what the token lets anyone holding it do.
// Refusing instead would let a few hosts that register in a loop lock
// every host out for a day.
func NewHostReplayCache(maxTotal, maxHost int) *ReplayCache {
	r := NewReplayCache(maxTotal, maxHost, 0)
	r.own = newHostShares(func(host wire.ID, id wire.ID, exp int64) bool {
		e, ok := r.t.m[id]
		return ok && e.exp == exp && e.v.host == host
	})
	return r
}

func (r *ReplayCache) forget(_ wire.ID, o replayOwner) {
	if r.own != nil {
		r.own.removed(o.host)
	}
	if r.perHost[o.host]--; r.perHost[o.host] <= 0 {
		delete(r.perHost, o.host)
	}
	if o.cred != 0 {
		if r.perCred[o.cred]--; r.perCred[o.cred] <= 0 {
			delete(r.perCred, o.cred)
		}
	}
}

// Seen reports whether id has a live entry.
func (r *ReplayCache) Seen(id wire.ID, now int64) bool { return r.t.Contains(id, now) }

// Room reports whether one more entry of host and cred fits. It sweeps
// expired entries first.
func (r *ReplayCache) Room(host wire.ID, cred wire.Digest, now int64) bool {
	r.t.Sweep(now)
	if r.t.Len() >= r.t.Cap() || r.perHost[host] >= r.maxHost {
		return false
	}
	k := credKey(cred)
	return k == 0 || r.perCred[k] < r.maxCred
}

// Add remembers id for host and cred until exp; it returns false, storing
// nothing, when Room would have said no or id is already live.
func (r *ReplayCache) Add(id wire.ID, host wire.ID, cred wire.Digest, exp, now int64) bool {
	if exp <= now || r.Seen(id, now) {
		return false
	}
	if r.own != nil {
		r.makeRoom(host, now)
	}
	if !r.Room(host, cred, now) {
		return false
	}
	k := credKey(cred)
	r.t.Add(id, replayOwner{host: host, cred: k}, exp, now)
	if r.own != nil {
		r.own.added(host, id, exp, false)
	}
	r.perHost[host]++
	if k != 0 {
		r.perCred[k]++
	}
	return true
}

// makeRoom (host table) forgets host's oldest entries past its share, then
// the oldest of all while the table is full.
func (r *ReplayCache) makeRoom(host wire.ID, now int64) {
	r.t.Sweep(now)
	for r.perHost[host] >= r.maxHost {
		id, ok := r.own.oldest(host)
		if !ok {
			break
		}
		r.t.Remove(id)
		r.Evicted++
	}
	for r.t.Len() >= r.t.Cap() {
		id, ok := r.t.oldest(now)
		if !ok {
			break
		}
		r.t.Remove(id)
		r.Evicted++
	}
}

// Sweep forgets expired entries.
func (r *ReplayCache) Sweep(now int64) int { return r.t.Sweep(now) }

// Len counts stored entries.
func (r *ReplayCache) Len() int { return r.t.Len() }

// Counts reports the live-or-unswept entries of host and of cred.
func (r *ReplayCache) Counts(host wire.ID, cred wire.Digest) (hostN, credN int) {
	return r.perHost[host], r.perCred[credKey(cred)]
}

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

func (r *ReplayCache) forget(_ wire.ID, o replayOwner) {
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
	if exp <= now || r.Seen(id, now) || !r.Room(host, cred, now) {
		return false
	}
	k := credKey(cred)
	r.t.Add(id, replayOwner{host: host, cred: k}, exp, now)
	r.perHost[host]++
	if k != 0 {
		r.perCred[k]++
	}
	return true
}

// Sweep forgets expired entries.
func (r *ReplayCache) Sweep(now int64) int { return r.t.Sweep(now) }

// Len counts stored entries.
func (r *ReplayCache) Len() int { return r.t.Len() }

// Counts reports the live-or-unswept entries of host and of cred.
func (r *ReplayCache) Counts(host wire.ID, cred wire.Digest) (hostN, credN int) {
	return r.perHost[host], r.perCred[credKey(cred)]
}

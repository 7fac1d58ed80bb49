package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// The replay shares (spec/reach.md: a host's and a credential's accepted
// client connection_ids, each bounded) are counters in the replay bucket,
// changed by compare-and-set:
//
//	<prefix>-replay  h.<host_id>  accepted client registrations of a host
//	                 k.<digest>   ... of one client credential
//
// A counter cannot forget single entries as they expire, so it counts them
// per hour of expiry: an entry leaves the count at the end of its hour, up
// to an hour after its replay entry expired, which only ever lets fewer
// clients in. 25 slots of a few bytes each, whatever the count.
const (
	preShareHost = "h."
	preShareCred = "k."
	shareSlot    = int64(time.Hour / time.Second)
	// shareRetries bounds the compare-and-set rounds of one change that
	// lose to a write the engine applied; past them (another instance won
	// every time) the match answers `unavailable`.
	shareRetries = 8
)

// shareTurns makes one instance's changes of a counter take turns: a
// change waits (for at most its ctx) until the one before it on the same
// key has its answer. A host's clients are all admitted on its owner, so
// without turns its simultaneous clients raced each other's
// compare-and-set on h.<host_id> through the engine, and past
// shareRetries lost rounds the ninth was answered `unavailable`; in turn,
// each writes at the revision the last one left in the cache, at once.
// Changes of other keys do not wait, and other instances' changes still
// race through the engine. A key has an entry only while a change of it
// holds or waits for its turn.
type shareTurns struct {
	mu sync.Mutex
	m  map[string]*shareTurn
}

type shareTurn struct {
	held  chan struct{} // a value in it: the turn is taken
	users int           // changes holding or waiting for the turn
}

// take waits for key's turn; release gives it up.
func (t *shareTurns) take(ctx context.Context, key string) (release func(), err error) {
	t.mu.Lock()
	if t.m == nil {
		t.m = map[string]*shareTurn{}
	}
	turn := t.m[key]
	if turn == nil {
		turn = &shareTurn{held: make(chan struct{}, 1)}
		t.m[key] = turn
	}
	turn.users++
	t.mu.Unlock()
	leave := func() {
		t.mu.Lock()
		if turn.users--; turn.users == 0 {
			delete(t.m, key)
		}
		t.mu.Unlock()
	}
	select {
	case turn.held <- struct{}{}:
		return func() { <-turn.held; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
}

// writeInProcess reports whether the engine refused a compare-and-set
// because another write of the key is still being replicated (it takes
// one conditional write per key at a time). Reading at once would return
// the value before that write, so the next round waits for it first.
func writeInProcess(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// shareCount is a counter's value: [end of the hour (Unix s), entries
// expiring in it], ascending.
type shareCount struct {
	Slots [][2]int64 `json:"s"`
}

// live drops the slots ended by now and sums the others.
func (c *shareCount) live(now int64) int64 {
	i := sort.Search(len(c.Slots), func(i int) bool { return c.Slots[i][0] > now })
	c.Slots = c.Slots[i:]
	var n int64
	for _, s := range c.Slots {
		n += s[1]
	}
	return n
}

// add counts delta entries expiring at exp (delta -1 takes back one added
// with the same exp; a slot at zero is dropped).
func (c *shareCount) add(exp, delta int64) {
	end := (exp + shareSlot - 1) / shareSlot * shareSlot
	i := sort.Search(len(c.Slots), func(i int) bool { return c.Slots[i][0] >= end })
	if i < len(c.Slots) && c.Slots[i][0] == end {
		if c.Slots[i][1] += delta; c.Slots[i][1] <= 0 {
			c.Slots = append(c.Slots[:i], c.Slots[i+1:]...)
		}
		return
	}
	if delta > 0 {
		c.Slots = append(c.Slots, [2]int64{})
		copy(c.Slots[i+1:], c.Slots[i:])
		c.Slots[i] = [2]int64{end, delta}
	}
}

var errShareContended = errors.New("cluster: replay share changed by other instances at every try")

// CountReplay adds one accepted client registration, remembered until exp,
// to host's share (at most perHost) and to credential d's (perCred) across
// the cluster. false: a share was full, and neither is counted. The host's
// count is given back (best effort) when the credential's is refused or
// fails; a give-back that fails leaves the host counted once too often,
// which only lets fewer clients in. Each engine operation (a share's read,
// its write, again after a conflict) has the engine_timeout; ctx bounds
// them all.
func (s *State) CountReplay(ctx context.Context, host wire.ID, d wire.Digest, exp time.Time, perHost, perCred int) (bool, error) {
	hk, ck := preShareHost+host.String(), preShareCred+d.String()
	ok, err := s.addShare(ctx, hk, exp.Unix(), perHost, 1)
	if err != nil || !ok {
		return false, err
	}
	if ok, err = s.addShare(ctx, ck, exp.Unix(), perCred, 1); err != nil || !ok {
		// The give-back has a time of its own: ctx may be the one that
		// just ran out.
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opt.Timeout)
		s.addShare(gctx, hk, exp.Unix(), 0, -1)
		cancel()
		return false, err
	}
	return true, nil
}

// shareCache remembers the value and revision this instance last wrote to
// each counter, so the next change of it (the host's next client, here on
// its owner) writes at that revision without reading first; another
// instance's change in between fails the write, which then reads. It is a
// guess, never a decision: a refusal on a cached count reads again too.
type shareCache struct {
	mu sync.Mutex
	m  map[string]cachedShare
}

type cachedShare struct {
	c   shareCount
	rev uint64
}

// maxCachedShares bounds shareCache (a full cache starts over).
const maxCachedShares = 4096

func (sc *shareCache) get(key string) (cachedShare, bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	v, ok := sc.m[key]
	v.c.Slots = slices.Clone(v.c.Slots)
	return v, ok
}

func (sc *shareCache) put(key string, c shareCount, rev uint64) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.m == nil || len(sc.m) >= maxCachedShares {
		sc.m = map[string]cachedShare{}
	}
	sc.m[key] = cachedShare{c: shareCount{Slots: slices.Clone(c.Slots)}, rev: rev}
}

func (sc *shareCache) drop(key string) {
	sc.mu.Lock()
	delete(sc.m, key)
	sc.mu.Unlock()
}

// op bounds one engine operation by the engine_timeout, within ctx.
func (s *State) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opt.Timeout)
}

// addShare adds delta to the counter key, unless delta is positive and the
// live count is at limit already (then false). The key lives until its
// last slot ends.
func (s *State) addShare(ctx context.Context, key string, exp int64, limit int, delta int64) (bool, error) {
	release, err := s.turns.take(ctx, key)
	if err != nil {
		return false, err
	}
	defer release()
	cached, guess := s.shares.get(key)
	// wait is how long a round waits for a write in process (doubling up
	// to the engine's timeout for one operation).
	wait := time.Millisecond
	for lost := 0; lost < shareRetries; {
		var c shareCount
		var rev uint64
		if guess {
			c, rev = cached.c, cached.rev
		} else {
			octx, cancel := s.op(ctx)
			e, err := s.replay.Get(octx, key)
			cancel()
			switch {
			case err == nil:
				if err := json.Unmarshal(e.Value(), &c); err != nil {
					return false, fmt.Errorf("cluster: replay share %s: %w", key, err)
				}
				rev = e.Revision()
			case !errors.Is(err, jetstream.ErrKeyNotFound):
				return false, err
			}
		}
		wasGuess := guess
		guess = false
		if n := c.live(time.Now().Unix()); delta > 0 && n >= int64(limit) {
			if wasGuess {
				continue // read what the engine holds before refusing
			}
			return false, nil
		}
		c.add(exp, delta)
		// The key lives until its last slot ends; exp stays the entry's
		// own expiry for the next round's add.
		var until int64
		if len(c.Slots) == 0 {
			if rev == 0 {
				return true, nil
			}
			until = time.Now().Unix() // nothing left to count: let it expire
		} else {
			until = c.Slots[len(c.Slots)-1][0]
		}
		b, _ := json.Marshal(c)
		var nrev uint64
		var err error
		octx, cancel := s.op(ctx)
		if rev == 0 {
			nrev, err = s.replay.Create(octx, key, b, jetstream.KeyTTL(ttlUntil(until)))
		} else {
			nrev, err = s.publishTTL(octx, s.replay, key, b, ttlUntil(until), jetstream.WithExpectLastSequencePerSubject(rev))
		}
		cancel()
		switch {
		case writeInProcess(err):
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return false, ctx.Err()
			}
			wait = min(2*wait, s.opt.Timeout)
			continue
		case errors.Is(err, jetstream.ErrKeyExists) || revisionChanged(err):
			lost++
			continue
		case err != nil:
			s.shares.drop(key)
			return false, err
		}
		s.shares.put(key, c, nrev)
		return true, nil
	}
	s.shares.drop(key)
	return false, errShareContended
}

// ReleaseConnectionID deletes x.<id> again: its registration was refused
// after the claim (a replay share was full), so the id was never accepted.
func (s *State) ReleaseConnectionID(ctx context.Context, id wire.ID) error {
	return s.replay.Purge(ctx, preReplay+id.String(), jetstream.PurgeTTL(time.Minute))
}

package server

import (
	"context"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// Durable changes (spec/reach.md "Broker state"): a publish, a revoke and
// the consumption of a bootstrap are acknowledged only once the state file
// holding them is on disk. Each is applied in memory under b.mu together
// with its undo, and waits (without any lock) for the write that covers it.
// When that write fails, every change not yet on disk is undone, newest
// first, before the next snapshot can be taken, and each waiter answers
// `unavailable`: memory never keeps a change the peer was not told about,
// and the broker keeps serving what it already had. The state file is a
// snapshot plus a journal of records (store.Persister): a change costs
// its own records and a (group-committed) fsync, not a rewrite of the state.

// change is one applied but not yet durable state change.
type change struct {
	undo func()
	res  chan error // capacity 1: nil once durable, else the write's error
}

// errUnavailable answers a change whose state write failed.
var errUnavailable = &wire.Error{Code: wire.CodeUnavailable, Detail: "the state file cannot be written"}

// commitLocked records an applied change (b.mu held) and asks for a write.
func (b *Broker) commitLocked(undo func()) *change {
	ch := &change{undo: undo, res: make(chan error, 1)}
	b.queued = append(b.queued, ch)
	b.persist.Mark()
	return ch
}

// take hands the persister the records of the changes made since its last
// write, and for a compaction a copy of the whole state; the persister
// writes them outside the lock. The changes they hold are now in flight.
func (b *Broker) take(compact bool) store.Batch {
	b.mu.Lock()
	defer b.mu.Unlock()
	batch := store.Batch{Ops: b.state.TakePending()}
	if compact {
		snap := b.state.Snapshot(b.cfg.now())
		batch.Snap = &snap
	}
	b.inflight = append(b.inflight, b.queued...)
	b.queued = nil
	return batch
}

// written is the persister's report on the write of the last snapshot.
func (b *Broker) written(err error) {
	b.mu.Lock()
	if err == nil {
		done := b.inflight
		b.inflight = nil
		b.mu.Unlock()
		for _, ch := range done {
			ch.res <- nil
		}
		return
	}
	// Undo newest first: the changes made after the batch was taken,
	// then the ones it held; their records not taken yet go too (the
	// persister's next write is a compaction, which writes the state as
	// it is after the undo). Undoing may bring back a credential of a
	// host that left the hosts file meanwhile; RetainHosts drops it again.
	failed := append(b.inflight, b.queued...)
	b.inflight, b.queued = nil, nil
	b.state.DiscardPending()
	for i := len(failed) - 1; i >= 0; i-- {
		failed[i].undo()
	}
	b.state.RetainHosts(b.hostKeys)
	b.mu.Unlock()
	b.count("state:write_failed")
	if len(failed) > 0 {
		b.log.Warn().Int("changes", len(failed)).Msg("state file write failed; unacknowledged changes were undone and answered `unavailable`")
	}
	for _, ch := range failed {
		ch.res <- err
	}
}

// await waits for ch to become durable. It returns errUnavailable when the
// write failed, and ctx's error when the peer or the broker went away first
// (the change may still become durable; nobody is told either way).
func (b *Broker) await(ctx context.Context, p *msgconn.Pause, ch *change) error {
	if p != nil {
		p.Enter()
		defer p.Leave()
	}
	select {
	case err := <-ch.res:
		if err != nil {
			return errUnavailable
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

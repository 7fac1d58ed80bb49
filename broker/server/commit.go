package server

import (
	"context"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// Durable changes (spec/reach.md "Broker state"): a publish, a revoke and
// the consumption of a bootstrap are acknowledged only once the state file
// holding them is on disk. Each is applied in memory under b.mu together
// with its undo, and waits (without any lock) for the write that covers it.
// When that write fails, every change not yet on disk is undone, newest
// first, before the next snapshot can be taken, and each waiter answers
// `unavailable`: memory never keeps a change the peer was not told about,
// and the broker keeps serving what it already had.

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
	b.journal = append(b.journal, ch)
	b.persist.Mark()
	return ch
}

// snapshot copies the state under the lock; the persister encodes and
// writes it outside. The changes it contains are now in flight.
func (b *Broker) snapshot() []byte {
	b.mu.Lock()
	snap := b.state.Snapshot(b.cfg.now())
	b.inflight = append(b.inflight, b.journal...)
	b.journal = nil
	b.mu.Unlock()
	return snap.Marshal()
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
	// Undo newest first: the changes made after the snapshot, then the
	// ones it held. Undoing may bring back a credential of a host that
	// left the hosts file meanwhile; RetainHosts drops it again.
	failed := append(b.inflight, b.journal...)
	b.inflight, b.journal = nil, nil
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

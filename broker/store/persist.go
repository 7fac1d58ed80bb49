package store

import (
	"context"
	"sync"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// Persister writes the state file in the background. Callers change the
// state under their own lock and call Mark; a caller that must not answer
// before its change is durable learns the outcome from the written callback,
// which runs after every write attempt and before the next snapshot is
// taken (so a failed change can be undone before any later write sees it).
// The write itself (encode, fsync, rename) never runs under a caller's lock:
// the snapshot function takes that lock only to copy the state. Marks that
// arrive while a write is running are coalesced into the next write, so a
// burst of publishes costs two writes, not one per publish.
type Persister struct {
	path    string
	snap    func() []byte
	written func(error)
	log     zerolog.Logger

	kick chan struct{}
	wmu  sync.Mutex // serializes writes, so an older snapshot never lands last

	mu      sync.Mutex
	want    uint64        // generation of the latest change
	done    uint64        // generation covered by the last write attempt
	doneCh  chan struct{} // closed and replaced after every write attempt
	lastErr error
}

// NewPersister writes snap() to path (mode 0600) whenever Run sees a Mark.
// snap must copy the state under the owner's lock and encode it outside.
// written, when not nil, is called with the outcome of every write (nil
// once the file, its rename and its directory are fsynced), before the next
// write starts.
func NewPersister(path string, snap func() []byte, written func(error), log zerolog.Logger) *Persister {
	return &Persister{
		path:    path,
		snap:    snap,
		written: written,
		log:     log,
		kick:    make(chan struct{}, 1),
		doneCh:  make(chan struct{}),
	}
}

// Mark records that the state changed and returns the generation a later
// write will cover.
func (p *Persister) Mark() uint64 {
	p.mu.Lock()
	p.want++
	g := p.want
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	return g
}

// Wait blocks until a write covering generation g was attempted, and
// returns that write's error. A failed write is retried on the next Mark;
// the broker keeps serving from memory meanwhile.
func (p *Persister) Wait(ctx context.Context, g uint64) error {
	for {
		p.mu.Lock()
		if p.done >= g {
			err := p.lastErr
			p.mu.Unlock()
			return err
		}
		ch := p.doneCh
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Run writes after every Mark until ctx ends, then writes once more if a
// change is still unwritten.
func (p *Persister) Run(ctx context.Context) {
	for {
		select {
		case <-p.kick:
			p.Flush()
		case <-ctx.Done():
			p.Flush()
			return
		}
	}
}

// Flush writes now if any change is unwritten.
func (p *Persister) Flush() error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.mu.Lock()
	g := p.want
	if p.done >= g {
		err := p.lastErr
		p.mu.Unlock()
		return err
	}
	p.mu.Unlock()

	// g was read before the snapshot is taken, so the snapshot contains
	// every change marked up to g.
	err := atomicfile.WriteFile(p.path, p.snap(), FileMode)
	if err != nil {
		p.log.Error().Err(err).Str("file", p.path).Msg("cannot write the broker state file; changes are refused with `unavailable` until a write succeeds")
	}
	if p.written != nil {
		p.written(err)
	}

	p.mu.Lock()
	if g > p.done {
		p.done = g
	}
	p.lastErr = err
	close(p.doneCh)
	p.doneCh = make(chan struct{})
	p.mu.Unlock()
	return err
}

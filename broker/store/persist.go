package store

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// Persister makes the broker's state changes durable: it appends them to
// the journal (journal.go), one fsync per batch, and now and then folds the
// journal into a fresh snapshot (the state file). Callers change the state
// under their own lock and call Mark; a caller that must not answer before
// its change is durable learns the outcome from the written callback, which
// runs after every write attempt and before the next batch is taken (so a
// failed change can be undone before any later write sees it). The write
// itself (encode, write, fsync, rename) never runs under a caller's lock:
// the take function holds that lock only to collect the pending records
// (and, for a compaction, to copy the state). Marks that arrive while a
// write is running are coalesced into the next write (group commit), so a
// burst of publishes costs two fsyncs, not one per publish.
//
// A write costs O(change): the records of the batch. A compaction costs
// O(state) and runs once the journal has grown past the snapshot's size
// (and at least minCompactBytes), so its cost per change stays constant
// however large the state is. After a failed write, the next write is a
// compaction: the journal is never appended to after a write that may have
// left part of a batch in it.
type Persister struct {
	path    string
	jpath   string
	take    func(compact bool) Batch
	written func(error)
	log     zerolog.Logger

	kick chan struct{}
	wmu  sync.Mutex // serializes writes, so an older batch never lands last
	// Guarded by wmu:
	seq      uint64 // the last record number handed out
	jsize    int64  // bytes in the journal, its header included
	snapSize int64  // bytes of the last snapshot written
	compact  bool   // the next write must be a compaction
	buf      []byte
	// minCompact is minCompactBytes (tests lower it).
	minCompact int64

	mu      sync.Mutex
	want    uint64        // generation of the latest change
	done    uint64        // generation covered by the last write attempt
	doneCh  chan struct{} // closed and replaced after every write attempt
	lastErr error
}

// Batch is what one write covers: the records of the changes made since the
// last write and, for a compaction, a copy of the whole state (which holds
// those changes too).
type Batch struct {
	Ops  []Op
	Snap *Snapshot
}

// minCompactBytes: a journal smaller than this is never compacted (it loads
// in milliseconds).
const minCompactBytes = 1 << 20

// NewPersister keeps the state file path and its journal (JournalPath) up
// to date, both mode 0600. seq is the last record number of the loaded
// state (Snapshot.Seq after LoadState). take is called under the owner's
// lock with the write's kind and returns the pending records (State's
// TakePending) and, when compact is set, a snapshot (State's Snapshot).
// written, when not nil, is called with the outcome of every write (nil
// once everything taken is fsynced), before the next write starts. The
// first write is a compaction: it rewrites a state file of an older format
// and drops a torn journal tail.
func NewPersister(path string, seq uint64, take func(compact bool) Batch, written func(error), log zerolog.Logger) *Persister {
	return &Persister{
		path:       path,
		jpath:      JournalPath(path),
		take:       take,
		written:    written,
		log:        log,
		seq:        seq,
		compact:    true,
		minCompact: minCompactBytes,
		kick:       make(chan struct{}, 1),
		doneCh:     make(chan struct{}),
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

	// g was read before the batch is taken, so the batch contains every
	// change marked up to g.
	compact := p.compact || p.jsize >= max(p.minCompact, p.snapSize)
	batch := p.take(compact)
	var err error
	switch {
	case batch.Snap != nil:
		err = p.writeSnapshot(*batch.Snap)
	case len(batch.Ops) > 0:
		err = p.appendOps(batch.Ops)
	}
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

// appendOps appends one batch of records to the journal and fsyncs it.
func (p *Persister) appendOps(ops []Op) error {
	buf := p.buf[:0]
	for _, op := range ops {
		p.seq++
		buf = appendRecord(buf, p.seq, op)
	}
	p.buf = buf
	if cap(p.buf) > 1<<20 {
		p.buf = nil // a rare huge batch does not pin its buffer
	}
	// The journal is created by a compaction (atomically, with its
	// directory fsynced); a missing one means something removed it. It is
	// opened per batch, not held open, so nothing keeps the file system
	// busy (an operator can remount it read-only).
	f, err := os.OpenFile(p.jpath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		p.compact = true
		return err
	}
	if _, err = f.Write(buf); err == nil {
		err = f.Sync()
	}
	if err != nil {
		// Cut a partial batch off now, so a crash before the next
		// compaction does not find these changes (they are undone and
		// answered `unavailable`). Should that fail too, the compaction
		// covers it: its snapshot names a seq past this batch.
		if f.Truncate(p.jsize) == nil {
			f.Sync()
		}
		f.Close()
		p.compact = true
		return err
	}
	if err := f.Close(); err != nil {
		p.compact = true
		return err
	}
	p.jsize += int64(len(buf))
	return nil
}

// writeSnapshot replaces the state file with snap (temp file, fsync,
// rename, directory fsync) and then starts an empty journal the same way.
func (p *Persister) writeSnapshot(snap Snapshot) error {
	snap.Seq = p.seq // everything handed out so far is in it, or undone
	data := snap.Marshal()
	if err := atomicfile.WriteFile(p.path, data, FileMode); err != nil {
		p.compact = true
		return err
	}
	p.snapSize = int64(len(data))
	// The snapshot holds every change of the batch: they are durable now.
	// An old journal left behind holds only records at or below its seq
	// (skipped on load) and perhaps a torn tail; it is not appended to
	// before a compaction succeeds in replacing it.
	if err := atomicfile.WriteFile(p.jpath, journalMagic, FileMode); err != nil {
		p.compact = true
		p.log.Warn().Err(err).Str("file", p.jpath).Msg("state snapshot written, but the journal could not be reset; the next write compacts again")
		return nil
	}
	p.jsize = int64(len(journalMagic))
	p.compact = false
	return nil
}

// CheckStateDir refuses a state directory that group or others may write:
// whoever can replace the state file or its journal can bring back a
// consumed or revoked token. (The files themselves are 0600; the systemd
// unit makes the directory 0700.)
func CheckStateDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s has mode %04o; the state file and its journal need a directory only their owner may write (chmod 700 %s)", dir, fi.Mode().Perm(), dir)
	}
	return nil
}

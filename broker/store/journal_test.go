package store

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// owner is the broker's side of the persister in miniature: a State under
// a lock, with the same take and the same undo on a failed write.
type owner struct {
	mu    sync.Mutex
	s     *State
	p     *Persister
	undos []func()
	errs  []error
}

func newOwner(t *testing.T, path string) *owner {
	t.Helper()
	o := &owner{}
	var seq uint64
	o.s, seq = loadRestored(t, path)
	o.s.EnableJournal()
	o.p = NewPersister(path, seq, func(compact bool) Batch {
		o.mu.Lock()
		defer o.mu.Unlock()
		b := Batch{Ops: o.s.TakePending()}
		if compact {
			s := o.s.Snapshot(t0)
			b.Snap = &s
		}
		return b
	}, func(err error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.errs = append(o.errs, err)
		if err != nil {
			o.s.DiscardPending()
			for i := len(o.undos) - 1; i >= 0; i-- {
				o.undos[i]()
			}
		}
		o.undos = nil
	}, zerolog.Nop())
	return o
}

// do applies one change and writes it.
func (o *owner) do(t *testing.T, change func(s *State) error) error {
	t.Helper()
	o.mu.Lock()
	undo, err := o.s.Record(func() error { return change(o.s) })
	if err != nil {
		o.mu.Unlock()
		t.Fatal(err)
	}
	o.undos = append(o.undos, undo)
	o.mu.Unlock()
	o.p.Mark()
	return o.p.Flush()
}

func (o *owner) encoded() []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.s.Snapshot(t0).Marshal()
}

// loadRestored is what a broker started from path would hold, and the
// last record number it loaded.
func loadRestored(t *testing.T, path string) (*State, uint64) {
	t.Helper()
	snap, _, err := LoadStateInfo(path)
	if err != nil {
		t.Fatal(err)
	}
	hosts := Hosts{}
	for _, c := range snap.Credentials {
		hosts[c.HostID] = wire.Digest{}
	}
	s, _ := Restore(snap, hosts, 1000, 1000, t0)
	return s, snap.Seq
}

func restored(t *testing.T, path string) []byte {
	s, _ := loadRestored(t, path)
	return s.Snapshot(t0).Marshal()
}

func TestJournalRecordsRoundTrip(t *testing.T) {
	h := wire.NewID()
	long := strings.Repeat("x", wire.MaxLabelLen)
	ops := []Op{
		opFor(route(h, long, "r", t0.Unix()+60)),
		opFor(boot(h, "p", "b", t0.Unix()+60)),
		{Kind: OpDelete, Digest: wire.TokenDigest("r")},
		{Kind: OpConsumed, Digest: wire.TokenDigest("b"), ExpiresAt: t0.Unix() + 60},
		{Kind: OpRevoked, Digest: wire.TokenDigest("r"), ExpiresAt: -5},
	}
	ops[1].Cred.MaxUses = 1
	ops[0].Cred.MaxUses = 0
	data := append([]byte(nil), journalMagic...)
	for i, op := range ops {
		data = appendRecord(data, uint64(10+i*3), op)
	}
	j, err := ParseJournal(data)
	if err != nil || j.Torn != 0 || j.Valid != len(data) {
		t.Fatalf("%v torn %d valid %d", err, j.Torn, j.Valid)
	}
	for i := range ops {
		if j.Ops[i] != ops[i] || j.Seqs[i] != uint64(10+i*3) {
			t.Fatalf("record %d: %+v, want %+v", i, j.Ops[i], ops[i])
		}
	}
}

// A change appends a few hundred bytes; the state file is written only at
// the first write (it migrates an old single-file state) and when the
// journal has outgrown it.
func TestPersisterAppendsAndCompacts(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	h := wire.NewID()
	// A state file of the earlier single-file format.
	legacy := NewState(10, 10)
	legacy.Publish(route(h, "old", "old", t0.Unix()+600), t0)
	v1 := strings.Replace(string(legacy.Snapshot(t0).Marshal()), `"version":2,"journal_seq":0`, `"version":1`, 1)
	if err := os.WriteFile(path, []byte(v1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, info, err := LoadStateInfo(path); err != nil || !info.Legacy {
		t.Fatalf("legacy state: %v %+v", err, info)
	}
	o := newOwner(t, path)
	o.p.minCompact = 4096
	if err := o.do(t, func(s *State) error { _, err := s.Publish(boot(h, "p0", "b0", t0.Unix()+600), t0); return err }); err != nil {
		t.Fatal(err)
	}
	snap1, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(snap1), `{"version":2,`) {
		t.Fatalf("the first write did not migrate the state file: %.40s", snap1)
	}
	for _, p := range []string{path, JournalPath(path)} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", p, err, fi)
		}
	}
	j0, _ := os.Stat(JournalPath(path))
	if err := o.do(t, func(s *State) error { _, err := s.Publish(boot(h, "p1", "b1", t0.Unix()+600), t0); return err }); err != nil {
		t.Fatal(err)
	}
	if snap, _ := os.ReadFile(path); !bytes.Equal(snap, snap1) {
		t.Fatal("a publish rewrote the state file")
	}
	if j1, _ := os.Stat(JournalPath(path)); j1.Size() <= j0.Size() || j1.Size()-j0.Size() > recordHeader+recordMaxPayload {
		t.Fatalf("journal %d -> %d bytes for one record", j0.Size(), j1.Size())
	}
	if got := restored(t, path); !bytes.Equal(got, o.encoded()) {
		t.Fatalf("reloaded:\n%s\nwant:\n%s", got, o.encoded())
	}
	// Churn until the journal outgrows its bound: it is folded into the
	// state file and starts again, and nothing is lost on the way.
	compactions := 0
	for i := 0; i < 200; i++ {
		d := "c" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if err := o.do(t, func(s *State) error {
			if _, err := s.Publish(boot(h, "p", d, t0.Unix()+600), t0); err != nil {
				return err
			}
			s.Consume(wire.TokenDigest(d), t0)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if fi, _ := os.Stat(JournalPath(path)); fi.Size() == int64(len(journalMagic)) {
			compactions++
		}
		if fi, _ := os.Stat(JournalPath(path)); fi.Size() > o.p.minCompact+2*(recordHeader+recordMaxPayload) && fi.Size() > o.p.snapSize+2*(recordHeader+recordMaxPayload) {
			t.Fatalf("journal of %d bytes was not compacted (snapshot %d)", fi.Size(), o.p.snapSize)
		}
	}
	if compactions == 0 {
		t.Fatal("the journal was never compacted")
	}
	if got := restored(t, path); !bytes.Equal(got, o.encoded()) {
		t.Fatal("state lost across compactions")
	}
}

// After a failed append nothing of it stays in memory or counts on disk,
// and the next write is a compaction that replaces the journal.
func TestFailedAppendIsUndoneAndCompacted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	h := wire.NewID()
	o := newOwner(t, path)
	o.do(t, func(s *State) error { _, err := s.Publish(route(h, "a", "a", t0.Unix()+600), t0); return err })
	before := o.encoded()
	// The journal vanishes: the append cannot open it.
	if err := os.Remove(JournalPath(path)); err != nil {
		t.Fatal(err)
	}
	if err := o.do(t, func(s *State) error { _, err := s.Revoke(h, "a", t0); return err }); err == nil {
		t.Fatal("an append to a missing journal succeeded")
	}
	if !bytes.Equal(o.encoded(), before) {
		t.Fatal("the failed revoke stayed in memory")
	}
	if err := o.do(t, func(s *State) error { _, err := s.Publish(route(h, "b", "b", t0.Unix()+600), t0); return err }); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(JournalPath(path))
	if !bytes.Equal(data, journalMagic) {
		t.Fatal("the write after a failure was not a compaction")
	}
	if got := restored(t, path); !bytes.Equal(got, o.encoded()) {
		t.Fatal("reloaded state differs")
	}
}

// journalOf builds a journal file from ops numbered from 1.
func journalOf(ops []Op) (data []byte, ends []int) {
	data = append(data, journalMagic...)
	for i, op := range ops {
		data = appendRecord(data, uint64(i+1), op)
		ends = append(ends, len(data))
	}
	return data, ends
}

func sampleOps(h wire.ID) []Op {
	b := boot(h, "p", "b", t0.Unix()+600)
	b.MaxUses = 1
	return []Op{
		opFor(route(h, "r", "r", t0.Unix()+600)),
		opFor(b),
		{Kind: OpConsumed, Digest: wire.TokenDigest("b"), ExpiresAt: t0.Unix() + 600},
		{Kind: OpDelete, Digest: wire.TokenDigest("b")},
		{Kind: OpRevoked, Digest: wire.TokenDigest("r"), ExpiresAt: t0.Unix() + 600},
		{Kind: OpDelete, Digest: wire.TokenDigest("r")},
	}
}

// A crash can tear the last write: a record cut short, a last record whose
// bytes never all arrived (bad checksum), a tail of zeros. Each loads the
// records before it and reports the rest as torn.
func TestJournalTornTailIsIgnored(t *testing.T) {
	ops := sampleOps(wire.NewID())
	data, ends := journalOf(ops)
	last := ends[len(ends)-2]
	for cut := last; cut < len(data); cut++ {
		j, err := ParseJournal(data[:cut])
		if err != nil || len(j.Ops) != len(ops)-1 || j.Torn != cut-last {
			t.Fatalf("cut at %d: %v, %d records, torn %d", cut, err, len(j.Ops), j.Torn)
		}
	}
	flipped := append([]byte(nil), data...)
	flipped[len(flipped)-1] ^= 1
	if j, err := ParseJournal(flipped); err != nil || len(j.Ops) != len(ops)-1 {
		t.Fatalf("bad checksum on the last record: %v %d", err, len(j.Ops))
	}
	zeros := append(append([]byte(nil), data...), make([]byte, 4096)...)
	if j, err := ParseJournal(zeros); err != nil || len(j.Ops) != len(ops) || j.Torn != 4096 {
		t.Fatalf("zero tail: %v %d", err, len(j.Ops))
	}
}

// Damage anywhere but at the end is a start error, naming the record.
func TestJournalCorruptRecordIsAnError(t *testing.T) {
	data, ends := journalOf(sampleOps(wire.NewID()))
	more := func(b []byte, recs ...[]byte) []byte {
		for _, r := range recs {
			b = append(b, r...)
		}
		return b
	}
	unknown := appendRecord(nil, 50, Op{Kind: OpDelete})
	unknown[recordHeader+8] = 9 // kind 9, checksum recomputed: a record we never write
	binary.LittleEndian.PutUint32(unknown[4:], crc32.Checksum(unknown[recordHeader:], castagnoli))
	cases := map[string]func([]byte) []byte{
		"flipped payload byte": func(b []byte) []byte { b[ends[0]+20] ^= 0x40; return b },
		"length too large":     func(b []byte) []byte { b[ends[0]+1] = 0x7f; return b },
		"zeroed record":        func(b []byte) []byte { copy(b[ends[0]:ends[1]], make([]byte, ends[1]-ends[0])); return b },
		"not a journal":        func(b []byte) []byte { b[0] = 'X'; return b },
		"sequence goes back": func(b []byte) []byte {
			return more(b, appendRecord(nil, 2, Op{Kind: OpDelete}), appendRecord(nil, 99, Op{Kind: OpDelete}))
		},
		"unknown kind": func(b []byte) []byte { return more(b, unknown, appendRecord(nil, 60, Op{Kind: OpDelete})) },
		"bad label": func(b []byte) []byte {
			c := boot(wire.NewID(), "bad label", "x", 1)
			return more(b, appendRecord(nil, 70, opFor(c)))
		},
	}
	for name, damage := range cases {
		b := damage(append([]byte(nil), data...))
		if _, err := ParseJournal(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A snapshot names the last record it holds; older records left in the
// journal (a crash between the snapshot's rename and the journal's reset)
// are skipped, even those that contradict it.
func TestSnapshotSkipsRecordsItHolds(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	h := wire.NewID()
	ops := sampleOps(h)
	data, _ := journalOf(ops)
	// The snapshot holds records 1..2 and then a change never journaled
	// (as after an undo): route r is absent.
	s := NewState(10, 10)
	s.Publish(boot(h, "p", "b", t0.Unix()+600), t0)
	snap := s.Snapshot(t0)
	snap.Seq = 2
	os.WriteFile(path, snap.Marshal(), 0o600)
	os.WriteFile(JournalPath(path), data, 0o600)
	got, info, err := LoadStateInfo(path)
	if err != nil || info.Records != len(ops) {
		t.Fatal(err, info)
	}
	if got.Seq != uint64(len(ops)) || len(got.Credentials) != 0 || len(got.Consumed) != 1 || len(got.Revoked) != 1 {
		t.Fatalf("loaded %+v", got)
	}
	// A journal without its state file is refused.
	os.Remove(path)
	if _, _, err := LoadStateInfo(path); err == nil {
		t.Fatal("a journal without its state file loaded")
	}
}

package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"sort"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// The state journal (docs/decisions.md "Broker state: snapshot + journal").
// The state file is a snapshot; every durable change after it is appended
// to the journal file next to it (JournalPath) as one record per primitive
// change, so a publish or a consumed bootstrap costs a few hundred bytes and
// one fsync instead of a rewrite of the whole state. The journal is folded
// into a fresh snapshot (compaction) once it outgrows the snapshot.
//
// File: the 8 bytes journalMagic, then records:
//
//	u32 LE  payload length n (recordMinPayload..recordMaxPayload)
//	u32 LE  CRC-32C (Castagnoli) of the payload
//	n bytes payload: u64 LE seq | u8 op | body
//
// Bodies (ids 16 bytes, digests 32 bytes, expiries i64 LE Unix seconds):
//
//	OpPutBootstrap, OpPutRoute  host_id | digest | expires_at | u8 len | label
//	                            | device_id_hash (routes only)
//	OpDelete                    digest
//	OpConsumed, OpRevoked       digest | expires_at
//
// seq grows by at least one per record, across compactions: the snapshot
// names the last seq it contains (journal_seq), and records at or below it
// are skipped on load. A batch of records is written with one write and one
// fsync, so a crash can only tear the end: a tail shorter than a header, a
// record of plausible length that ends past the end of the file, a last
// record whose checksum fails, or a tail of zero bytes is a torn write and
// is ignored (it was never acknowledged); any other bad record is a start
// error.

// journalMagic starts every journal file.
var journalMagic = []byte("SLJRNL1\n")

const (
	recordHeader     = 8
	recordMinPayload = 8 + 1 + 32 // seq, op, a digest
	recordMaxPayload = 8 + 1 + 16 + 32 + 8 + 1 + wire.MaxLabelLen + 32
)

// OpKind is the kind of one journal record.
type OpKind uint8

// The journal's record kinds.
const (
	OpPutBootstrap OpKind = 1 // store a bootstrap credential
	OpPutRoute     OpKind = 2 // store a route credential
	OpDelete       OpKind = 3 // forget a credential
	OpConsumed     OpKind = 4 // remember a consumed digest until ExpiresAt
	OpRevoked      OpKind = 5 // remember a revoked digest until ExpiresAt
)

// Op is one primitive change of the State, as the journal records it.
type Op struct {
	Kind OpKind
	// Cred is the stored credential (OpPutBootstrap, OpPutRoute).
	Cred Credential
	// Digest and ExpiresAt are the digest of OpDelete, OpConsumed and
	// OpRevoked, and the expiry of the last two.
	Digest    wire.Digest
	ExpiresAt int64
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// JournalPath is where the journal of the state file statePath lives.
func JournalPath(statePath string) string { return statePath + ".journal" }

// appendRecord encodes op as record seq onto buf.
func appendRecord(buf []byte, seq uint64, op Op) []byte {
	start := len(buf)
	buf = append(buf, make([]byte, recordHeader)...)
	buf = binary.LittleEndian.AppendUint64(buf, seq)
	buf = append(buf, byte(op.Kind))
	switch op.Kind {
	case OpPutBootstrap, OpPutRoute:
		c := op.Cred
		buf = append(buf, c.HostID[:]...)
		buf = append(buf, c.Digest[:]...)
		buf = binary.LittleEndian.AppendUint64(buf, uint64(c.ExpiresAt))
		buf = append(buf, byte(len(c.ID)))
		buf = append(buf, c.ID...)
		if op.Kind == OpPutRoute {
			buf = append(buf, c.DeviceIDHash[:]...)
		}
	case OpDelete:
		buf = append(buf, op.Digest[:]...)
	case OpConsumed, OpRevoked:
		buf = append(buf, op.Digest[:]...)
		buf = binary.LittleEndian.AppendUint64(buf, uint64(op.ExpiresAt))
	}
	payload := buf[start+recordHeader:]
	binary.LittleEndian.PutUint32(buf[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[start+4:], crc32.Checksum(payload, castagnoli))
	return buf
}

// opFor is the record kind that stores c.
func opFor(c Credential) Op {
	if c.Kind == wire.KindRoute {
		return Op{Kind: OpPutRoute, Cred: c}
	}
	return Op{Kind: OpPutBootstrap, Cred: c}
}

// decodePayload checks and decodes one record's payload (the checksum has
// been verified). Its rules are the state file's: a record that decodes is
// one the broker could have written.
func decodePayload(p []byte) (uint64, Op, error) {
	if len(p) < 9 {
		return 0, Op{}, errors.New("short record")
	}
	seq := binary.LittleEndian.Uint64(p)
	op := Op{Kind: OpKind(p[8])}
	b := p[9:]
	take := func(n int) []byte {
		if len(b) < n {
			return nil
		}
		v := b[:n]
		b = b[n:]
		return v
	}
	switch op.Kind {
	case OpPutBootstrap, OpPutRoute:
		host, dig, exp, l := take(16), take(32), take(8), take(1)
		if l == nil {
			return 0, Op{}, errors.New("short credential record")
		}
		label := take(int(l[0]))
		c := &op.Cred
		c.ID = string(label)
		if label == nil || !wire.ValidLabel(c.ID) {
			return 0, Op{}, errors.New("credential record: bad label")
		}
		copy(c.HostID[:], host)
		copy(c.Digest[:], dig)
		c.ExpiresAt = int64(binary.LittleEndian.Uint64(exp))
		if op.Kind == OpPutRoute {
			dev := take(32)
			if dev == nil {
				return 0, Op{}, errors.New("short route record")
			}
			c.Kind, c.MaxUses = wire.KindRoute, 0
			copy(c.DeviceIDHash[:], dev)
		} else {
			c.Kind, c.MaxUses = wire.KindBootstrap, 1
		}
	case OpDelete:
		d := take(32)
		if d == nil {
			return 0, Op{}, errors.New("short delete record")
		}
		copy(op.Digest[:], d)
	case OpConsumed, OpRevoked:
		d, exp := take(32), take(8)
		if exp == nil {
			return 0, Op{}, errors.New("short digest record")
		}
		copy(op.Digest[:], d)
		op.ExpiresAt = int64(binary.LittleEndian.Uint64(exp))
	default:
		return 0, Op{}, fmt.Errorf("unknown record kind %d", op.Kind)
	}
	if len(b) != 0 {
		return 0, Op{}, errors.New("record has trailing bytes")
	}
	return seq, op, nil
}

// Journal is a parsed journal file.
type Journal struct {
	// Ops are the records in order, with their sequence numbers in Seqs.
	Ops  []Op
	Seqs []uint64
	// Valid is the length of the well-formed part; Torn is how many bytes
	// after it were ignored as a write torn by a crash.
	Valid, Torn int
}

// ParseJournal decodes a journal file. A torn last write is reported in
// Torn and ignored; anything else malformed is an error, so a damaged
// journal stops the broker instead of silently forgetting a consumed or
// revoked digest.
func ParseJournal(data []byte) (Journal, error) {
	var j Journal
	if len(data) < len(journalMagic) {
		if bytes.HasPrefix(journalMagic, data) {
			j.Torn = len(data)
			return j, nil
		}
		return Journal{}, errors.New("not a state journal")
	}
	if !bytes.Equal(data[:len(journalMagic)], journalMagic) {
		return Journal{}, errors.New("not a state journal")
	}
	off := len(journalMagic)
	for off < len(data) {
		rem := data[off:]
		torn := func() (Journal, error) {
			j.Valid, j.Torn = off, len(rem)
			return j, nil
		}
		if len(rem) < recordHeader {
			return torn()
		}
		if allZero(rem) {
			return torn()
		}
		n := int(binary.LittleEndian.Uint32(rem))
		bad := func(what string) (Journal, error) {
			return Journal{}, fmt.Errorf("journal record %d at byte %d: %s", len(j.Ops)+1, off, what)
		}
		if n < recordMinPayload || n > recordMaxPayload {
			return bad("bad length")
		}
		if recordHeader+n > len(rem) {
			return torn()
		}
		payload := rem[recordHeader : recordHeader+n]
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(rem[4:]) {
			if recordHeader+n == len(rem) {
				return torn()
			}
			return bad("checksum mismatch")
		}
		seq, op, err := decodePayload(payload)
		if err != nil {
			return bad(err.Error())
		}
		if len(j.Seqs) > 0 && seq <= j.Seqs[len(j.Seqs)-1] {
			return bad("sequence number does not increase")
		}
		j.Ops = append(j.Ops, op)
		j.Seqs = append(j.Seqs, seq)
		off += recordHeader + n
	}
	j.Valid = off
	return j, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Apply replays the journal's records newer than snap.Seq onto snap and
// returns the result, whose Seq is the last record's. Every record sets or
// deletes one key, so replaying records the snapshot already holds changes
// nothing; the order of the result is canonical (by digest).
func (j Journal) Apply(snap Snapshot) Snapshot {
	creds := make(map[wire.Digest]Credential, len(snap.Credentials))
	for _, c := range snap.Credentials {
		creds[c.Digest] = c
	}
	tables := [2]map[wire.Digest]int64{{}, {}}
	for i, in := range [2][]DigestExpiry{snap.Consumed, snap.Revoked} {
		for _, e := range in {
			keepLater(tables[i], e.Digest, e.ExpiresAt)
		}
	}
	seq := snap.Seq
	for k, op := range j.Ops {
		if j.Seqs[k] <= snap.Seq {
			continue
		}
		seq = j.Seqs[k]
		switch op.Kind {
		case OpPutBootstrap, OpPutRoute:
			creds[op.Cred.Digest] = op.Cred
		case OpDelete:
			delete(creds, op.Digest)
		case OpConsumed, OpRevoked:
			t := tables[0]
			if op.Kind == OpRevoked {
				t = tables[1]
			}
			keepLater(t, op.Digest, op.ExpiresAt)
		}
	}
	out := Snapshot{Seq: seq, Credentials: make([]Credential, 0, len(creds))}
	for _, c := range creds {
		out.Credentials = append(out.Credentials, c)
	}
	sort.Slice(out.Credentials, func(a, b int) bool {
		return bytes.Compare(out.Credentials[a].Digest[:], out.Credentials[b].Digest[:]) < 0
	})
	conv := func(m map[wire.Digest]int64) []DigestExpiry {
		o := make([]DigestExpiry, 0, len(m))
		for d, exp := range m {
			o = append(o, DigestExpiry{d, exp})
		}
		sort.Slice(o, func(a, b int) bool { return bytes.Compare(o[a].Digest[:], o[b].Digest[:]) < 0 })
		return o
	}
	out.Consumed, out.Revoked = conv(tables[0]), conv(tables[1])
	return out
}

// keepLater records exp for d unless m holds a later expiry already: the
// consumed and revoked tables keep the later of two (Table.Add).
func keepLater(m map[wire.Digest]int64, d wire.Digest, exp int64) {
	if old, ok := m[d]; !ok || exp > old {
		m[d] = exp
	}
}

// LoadInfo describes what LoadState found.
type LoadInfo struct {
	// Records is how many journal records were read, TornBytes how many
	// bytes of a torn last write were ignored.
	Records, TornBytes int
	// Legacy is true when the state file has the single-file format of
	// version 1 (it is rewritten in the current format at the first write).
	Legacy bool
}

// LoadState is LoadStateInfo without the report.
func LoadState(path string) (Snapshot, error) {
	snap, _, err := LoadStateInfo(path)
	return snap, err
}

// LoadStateInfo reads the state file and replays its journal; no state
// file and no journal is an empty state (first start). A journal without
// its state file is refused: the snapshot it continues is missing.
func LoadStateInfo(path string) (Snapshot, LoadInfo, error) {
	var info LoadInfo
	data, err := readPrivate(path, MaxStateFileBytes)
	missing := errors.Is(err, os.ErrNotExist)
	if err != nil && !missing {
		return Snapshot{}, info, err
	}
	jpath := JournalPath(path)
	jdata, jerr := readPrivate(jpath, MaxStateFileBytes)
	jmissing := errors.Is(jerr, os.ErrNotExist)
	if jerr != nil && !jmissing {
		return Snapshot{}, info, jerr
	}
	if missing {
		if !jmissing {
			return Snapshot{}, info, fmt.Errorf("state journal %s exists but its state file %s does not; restore the state file or remove both", jpath, path)
		}
		return Snapshot{}, info, nil
	}
	snap, err := ParseState(data)
	if err != nil {
		return Snapshot{}, info, fmt.Errorf("state file %s: %w", path, err)
	}
	info.Legacy = snap.version == 1
	if jmissing {
		return snap, info, nil
	}
	j, err := ParseJournal(jdata)
	if err != nil {
		return Snapshot{}, info, fmt.Errorf("state journal %s: %w", jpath, err)
	}
	info.Records, info.TornBytes = len(j.Ops), j.Torn
	return j.Apply(snap), info, nil
}

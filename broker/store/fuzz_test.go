package store

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// FuzzParseHosts: whatever parses re-encodes to something that parses to
// the same hosts.
func FuzzParseHosts(f *testing.F) {
	id := wire.NewID().String()
	d := wire.TokenDigest("t").String()
	f.Add([]byte(`{"hosts": {"` + id + `": {"host_token_sha256": "` + d + `"}}}`))
	f.Add([]byte(`{"hosts": {}}`))
	f.Add([]byte(`{"hosts": {"` + id + `": {"host_token_sha256": "` + d + `"}, "` + id + `": {"host_token_sha256": "` + d + `"}}}`))
	f.Add([]byte(`{"hosts": {"` + id + `": null}}`))
	f.Add([]byte(`{"hosts": {"` + id + `": {"host_token_sha256": "` + d + `", "x": 1}}}`))
	f.Add([]byte(`{"hosts": [], "hosts": {}}`))
	f.Add([]byte(`[{"a":{}},{"a":{}}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ParseHosts(data)
		if err != nil {
			return
		}
		back, err := ParseHosts(h.Marshal())
		if err != nil || len(back) != len(h) {
			t.Fatalf("round trip: %v", err)
		}
		for k, v := range h {
			if back[k] != v {
				t.Fatal("round trip differs")
			}
		}
	})
}

// FuzzParseState: whatever parses restores within bounds and re-encodes to
// something that parses again.
func FuzzParseState(f *testing.F) {
	a := wire.NewID()
	s := NewState(10, 10)
	s.Publish(Credential{Kind: wire.KindRoute, HostID: a, ID: "r", Digest: wire.TokenDigest("r"), ExpiresAt: t0.Unix() + 60, DeviceIDHash: wire.TokenDigest("d")}, t0)
	s.Publish(Credential{Kind: wire.KindBootstrap, HostID: a, ID: "p", Digest: wire.TokenDigest("b"), ExpiresAt: t0.Unix() + 60}, t0)
	s.Publish(Credential{Kind: wire.KindBootstrap, HostID: a, ID: "p", Digest: wire.TokenDigest("c"), ExpiresAt: t0.Unix() + 60}, t0)
	s.Consume(wire.TokenDigest("c"), t0)
	f.Add(s.Snapshot(t0).Marshal())
	f.Add([]byte(`{"version":1,"credentials":[],"consumed":[],"revoked":[]}`))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"credentials":null}`))
	f.Add([]byte(`{"version":1,"consumed":[{"token_sha256":"x","expires_at":1}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := ParseState(data)
		if err != nil {
			return
		}
		hosts := Hosts{}
		for _, c := range snap.Credentials {
			hosts[c.HostID] = wire.Digest{}
		}
		r, _ := Restore(snap, hosts, 4, 2, t0)
		creds, consumed, revoked := r.Len()
		if consumed > 4 || revoked > 4 || creds > 4*len(hosts) {
			t.Fatalf("bounds exceeded: %d %d %d", creds, consumed, revoked)
		}
		enc := r.Snapshot(t0).Marshal()
		again, err := ParseState(enc)
		if err != nil {
			t.Fatalf("re-encoded state does not parse: %v\n%s", err, enc)
		}
		r2, _ := Restore(again, hosts, 4, 2, t0)
		if !bytes.Equal(r2.Snapshot(t0).Marshal(), enc) {
			t.Fatal("state changed across an encode/parse round trip")
		}
	})
}

// FuzzTable drives a small table with an operation stream and checks its
// invariants: never above its bound, never forgets a live entry it accepted.
func FuzzTable(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add(bytes.Repeat([]byte{0xff, 0, 3}, 20))
	f.Fuzz(func(t *testing.T, ops []byte) {
		tb := NewTable[byte, struct{}](4)
		shadow := map[byte]int64{}
		now := int64(0)
		for i := 0; i+1 < len(ops); i += 2 {
			k, v := ops[i]%8, int64(ops[i+1]%16)
			switch ops[i] >> 6 {
			case 0, 1:
				if tb.Add(k, struct{}{}, now+v, now) && v > 0 {
					if shadow[k] < now+v {
						shadow[k] = now + v
					}
				}
			case 2:
				tb.Remove(k)
				delete(shadow, k)
			case 3:
				now += v
			}
			if tb.Len() > 4 {
				t.Fatalf("table holds %d entries", tb.Len())
			}
			for sk, exp := range shadow {
				if exp > now && !tb.Contains(sk, now) {
					t.Fatalf("live key %d forgotten", sk)
				}
			}
		}
	})
}

// FuzzLoadStateFile drives the loader as the broker does, through a real
// file: any bytes either fail to load or load a state that survives a
// save (the persister's atomic write) and a second load unchanged.
func FuzzLoadStateFile(f *testing.F) {
	a := wire.NewID()
	s := NewState(10, 10)
	s.Publish(Credential{Kind: wire.KindRoute, HostID: a, ID: "r", Digest: wire.TokenDigest("r"), ExpiresAt: t0.Unix() + 60, DeviceIDHash: wire.TokenDigest("d")}, t0)
	s.Revoke(a, "r", t0)
	f.Add(s.Snapshot(t0).Marshal())
	f.Add([]byte(`{"version":1,"credentials":[],"consumed":[],"revoked":[]}`))
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "state.json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		snap, _, err := LoadStateInfo(path)
		if err != nil {
			return
		}
		hosts := Hosts{}
		for _, c := range snap.Credentials {
			hosts[c.HostID] = wire.Digest{}
		}
		r, _ := Restore(snap, hosts, 8, 4, t0)
		saved := r.Snapshot(t0).Marshal()
		p := NewPersister(path, snap.Seq, func(bool) Batch { s := r.Snapshot(t0); return Batch{Snap: &s} }, nil, zerolog.Nop())
		p.Mark()
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
		again, _, err := LoadStateInfo(path)
		if err != nil {
			t.Fatalf("a saved state does not load: %v", err)
		}
		r2, _ := Restore(again, hosts, 8, 4, t0)
		if !bytes.Equal(r2.Snapshot(t0).Marshal(), saved) {
			t.Fatal("state changed across save and load")
		}
	})
}

// FuzzParseJournal: any bytes either fail or parse to records that encode
// back to exactly the well-formed part, and the rest is reported as torn.
func FuzzParseJournal(f *testing.F) {
	data, _ := journalOf(sampleOps(wire.NewID()))
	f.Add(data)
	f.Add(data[:len(data)-3])
	f.Add(append(append([]byte(nil), data...), 0, 0, 0))
	f.Add(journalMagic[:3])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := ParseJournal(data)
		if err != nil {
			return
		}
		if j.Valid+j.Torn != len(data) {
			t.Fatalf("valid %d + torn %d != %d", j.Valid, j.Torn, len(data))
		}
		if len(j.Ops) == 0 && j.Valid == 0 {
			return
		}
		enc := append([]byte(nil), journalMagic...)
		for i, op := range j.Ops {
			enc = appendRecord(enc, j.Seqs[i], op)
		}
		if !bytes.Equal(enc, data[:j.Valid]) {
			t.Fatal("records do not re-encode to the bytes they came from")
		}
	})
}

// FuzzJournalCrashPrefix: a broker applies a stream of publishes, consumes
// and revokes and journals each as one batch; a crash keeps any prefix of
// the journal's bytes. Whatever the cut, the files load, to the state
// after some prefix of the records, and a cut at a batch boundary loads to
// exactly the state the broker held then.
func FuzzJournalCrashPrefix(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, uint16(100))
	f.Add([]byte{0, 0, 0, 0x41, 0x82, 0xc3, 1, 1}, uint16(0xffff))
	f.Add([]byte{0xc0, 0x40, 0x80}, uint16(37))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, script []byte, cut uint16) {
		if len(script) > 64 {
			script = script[:64]
		}
		hosts := Hosts{wire.ID{1}: {}, wire.ID{2}: {}}
		s := NewState(16, 4)
		s.EnableJournal()
		base := s.Snapshot(t0).Marshal() // the snapshot the journal follows: seq 0
		data := append([]byte(nil), journalMagic...)
		var seq uint64
		type boundary struct {
			end   int
			state []byte
		}
		bounds := []boundary{{len(data), restoreBytes(t, base, nil, hosts)}}
		var ends []int
		for _, b := range script {
			h := wire.ID{1 + b&1}
			tok := string(rune('a' + (b>>1)&7))
			switch b >> 6 {
			case 0:
				s.Publish(boot(h, "p", tok, t0.Unix()+int64(b)+1), t0)
			case 1:
				s.Publish(route(h, "r"+tok, tok, t0.Unix()+600), t0)
			case 2:
				s.Consume(wire.TokenDigest(tok), t0)
			case 3:
				s.Revoke(h, "r"+tok, t0)
			}
			for _, op := range s.TakePending() {
				seq++
				data = appendRecord(data, seq, op)
				ends = append(ends, len(data))
			}
			bounds = append(bounds, boundary{len(data), s.Snapshot(t0).Marshal()})
		}
		c := int(cut) % (len(data) + 1)
		path := filepath.Join(dir, "state.json")
		os.WriteFile(path, base, 0o600)
		os.WriteFile(JournalPath(path), data[:c], 0o600)
		snap, _, err := LoadStateInfo(path)
		if err != nil {
			t.Fatalf("a crash-cut journal (%d of %d bytes) does not load: %v", c, len(data), err)
		}
		k := 0
		for k < len(ends) && ends[k] <= c {
			k++
		}
		if snap.Seq != uint64(k) {
			t.Fatalf("loaded through record %d, want %d", snap.Seq, k)
		}
		for _, bd := range bounds {
			if bd.end == c {
				r, _ := Restore(snap, hosts, 16, 4, t0)
				if got := r.Snapshot(t0).Marshal(); !bytes.Equal(got, bd.state) {
					t.Fatalf("cut at a batch boundary loads\n%s\nwant\n%s", got, bd.state)
				}
			}
		}
	})
}

// restoreBytes is the encoded state a broker restores from a state file
// and journal given as bytes.
func restoreBytes(t *testing.T, state, journal []byte, hosts Hosts) []byte {
	t.Helper()
	snap, err := ParseState(state)
	if err != nil {
		t.Fatal(err)
	}
	if journal != nil {
		j, err := ParseJournal(journal)
		if err != nil {
			t.Fatal(err)
		}
		snap = j.Apply(snap)
	}
	r, _ := Restore(snap, hosts, 16, 4, t0)
	return r.Snapshot(t0).Marshal()
}

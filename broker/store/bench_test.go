package store

import (
	"fmt"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// BenchmarkDurableChange: one bootstrap publish + its consumption, made
// durable, with the state already holding n streams' worth of consumed
// digests. "journal" is the persister (append + fsync, compaction
// amortized); "rewrite" is what every change cost before the journal: the
// whole state encoded, sorted and written atomically. Figures, not
// assertions (README "Broker state at scale").
func BenchmarkDurableChange(b *testing.B) {
	for _, n := range []int{5_000, 20_000} {
		for _, mode := range []string{"journal", "rewrite"} {
			b.Run(fmt.Sprintf("%s/state=%d", mode, n), func(b *testing.B) {
				path := filepath.Join(b.TempDir(), "state.json")
				h := wire.NewID()
				s := NewState(4*n+4*b.N+16, 1<<20)
				for i := 0; i < n; i++ {
					tok := fmt.Sprint("pre", i)
					s.Publish(boot(h, "p", tok, t0.Unix()+3000), t0)
					s.Consume(wire.TokenDigest(tok), t0)
				}
				s.EnableJournal()
				p := NewPersister(path, 0, func(compact bool) Batch {
					bt := Batch{Ops: s.TakePending()}
					if compact {
						snap := s.Snapshot(t0)
						bt.Snap = &snap
					}
					return bt
				}, nil, zerolog.Nop())
				p.Mark()
				p.Flush()
				b.ResetTimer()
				cpu0 := cpuTime()
				defer func() { b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/1e3, "cpu-µs/op") }()
				for i := 0; i < b.N; i++ {
					tok := fmt.Sprint("b", i)
					s.Publish(boot(h, "p", tok, t0.Unix()+3000), t0)
					s.Consume(wire.TokenDigest(tok), t0)
					if mode == "journal" {
						p.Mark()
						if err := p.Flush(); err != nil {
							b.Fatal(err)
						}
					} else {
						s.DiscardPending()
						if err := atomicfile.WriteFile(path, s.Snapshot(t0).Marshal(), FileMode); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}

// cpuTime is the process's user + system CPU time in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

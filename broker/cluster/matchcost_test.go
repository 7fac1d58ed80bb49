package cluster

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// TestMatchCost measures a route match through the instance holding the
// host and through another one (forwarded), on the rig: wall time per
// match and the CPU of the whole test process per match (brokers, engine
// nodes and clients all run in it). It prints and asserts nothing about
// time; it runs only with CLUSTER_MATCH_BENCH=1 (CLUSTER_MATCH_N matches
// per case, 300 by default).
func TestMatchCost(t *testing.T) {
	if os.Getenv("CLUSTER_MATCH_BENCH") == "" {
		t.Skip("set CLUSTER_MATCH_BENCH=1 to measure matches")
	}
	n := 300
	if v, err := strconv.Atoi(os.Getenv("CLUSTER_MATCH_N")); err == nil && v > 0 {
		n = v
	}
	r := newRigWith(t, 10*time.Minute, ownFirst, func(c *server.Config) {
		c.MaxStreamsPerRoute = 16
	})
	hA := r.hostOn(0)
	route := wire.Secret("route-" + testenv.RandomSecret(""))
	r.publishRoute(hA, "dev1", route)
	r.mirrored(hA, 1, route)
	drainOpens(hA)
	for _, tc := range []struct {
		name string
		i    int
	}{{"local", 0}, {"forwarded", 1}} {
		cpu0, t0 := processCPU(), time.Now()
		for range n {
			c, id := r.matched(hA, tc.i, wire.KindRoute, route)
			c.c.CloseNow()
			for { // the stream's end frees its slot on the host
				rr := hA.read()
				if rr.err != nil {
					t.Fatal(rr.err)
				}
				if f, err := wire.ParseFrame(rr.data); err == nil && f.StreamID == id && f.Flags == wire.FlagClose {
					break
				}
			}
		}
		wall, cpu := time.Since(t0), processCPU()-cpu0
		t.Logf("match %-9s n=%d wall/match=%v cpu/match=%v", tc.name, n, (wall / time.Duration(n)).Round(time.Microsecond), (cpu / time.Duration(n)).Round(time.Microsecond))
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// TestReachPermanentRefusalInStatusAndMetrics: a front whose host token the
// broker refuses (`unauthorized`) waits 10 minutes before the next attempt,
// and says so in `securelink status` and in its metrics; it is live but not
// ready.
func TestReachPermanentRefusalInStatusAndMetrics(t *testing.T) {
	start := time.Now()
	rs := launchReachStack(t, "", "", string(wire.NewToken()))
	eventually(t, 30*time.Second, func() string { return "no permanent error: " + rs.d.stderr.String() }, func() bool {
		st, err := reachStatus(rs.admin)
		return err == nil && st.PermanentError == "unauthorized"
	})
	st, err := reachStatus(rs.admin)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready || !st.Live || st.RetryAt == nil || st.RetryAt.Before(start.Add(10*time.Minute)) {
		t.Fatalf("status after the refusal: %+v", st)
	}
	out, _, err := runCLI(t, "status", "--config", rs.cfgPath)
	if err != nil || !strings.Contains(out, "the broker refused with unauthorized") || !strings.Contains(out, st.RetryAt.UTC().Format(time.RFC3339)) {
		t.Fatalf("securelink status (%v):\n%s", err, out)
	}
	if m := scrapeText(t, rs.frontMetrics); !hasSample(m, "securelink_reach_permanent_error 1") {
		t.Fatalf("front metrics:\n%s", grepLines(m, "securelink_reach"))
	}
}

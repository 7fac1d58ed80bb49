package connector

import (
	"net"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/testfake"
)

func backoffWith(r float64) *backoff {
	cfg := Config{Rand: func() float64 { return r }}.WithDefaults()
	return &backoff{cfg: &cfg}
}

func TestBackoffSequence(t *testing.T) {
	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60, 60}
	for _, r := range []float64{0, 0.5, 0.999999} {
		b := backoffWith(r)
		for n, w := range want {
			base := w * time.Second
			got := b.next(outcome{code: codeDial})
			exp := base + time.Duration(float64(base/4)*r)
			if got != exp {
				t.Fatalf("rand %v attempt %d: waited %v, want %v", r, n, got, exp)
			}
			if got < base || got >= base+base/4+1 {
				t.Fatalf("attempt %d: %v outside [%v, %v + a quarter]", n, got, base, base)
			}
		}
	}
}

func TestBackoffResetsOnlyAfterSixtySecondsRegistered(t *testing.T) {
	b := backoffWith(0)
	for i := 0; i < 4; i++ {
		b.next(outcome{code: codeDial})
	}
	// A registration that lasted just under a minute does not reset.
	if got := b.next(outcome{code: codeClosed, registered: 59 * time.Second}); got != 16*time.Second {
		t.Fatalf("after 59 s registered: %v, want 16s", got)
	}
	if got := b.next(outcome{code: codeClosed, registered: 60 * time.Second}); got != time.Second {
		t.Fatalf("after 60 s registered: %v, want 1s", got)
	}
	if got := b.next(outcome{code: codeDial}); got != 2*time.Second {
		t.Fatalf("next: %v, want 2s", got)
	}
}

func TestBackoffAfterAuthFailureAndReplaced(t *testing.T) {
	b := backoffWith(0.9)
	for _, code := range []string{string(wire.CodeUnauthorized), string(wire.CodeRevoked)} {
		if got := b.next(outcome{code: code}); got != 10*time.Minute {
			t.Fatalf("%s: %v, want 10m", code, got)
		}
	}
	if got := b.next(outcome{code: codeReplaced, registered: time.Hour}); got != time.Minute {
		t.Fatalf("replaced: %v, want 1m", got)
	}
	// The special waits count as attempts: the next ordinary failure keeps
	// growing from there (the reset above left one attempt).
	if got := b.next(outcome{code: codeDial}); got != 2*time.Second+time.Duration(float64(500*time.Millisecond)*0.9) {
		t.Fatalf("after replaced: %v", got)
	}
}

// TestRunFollowsTheBackoff drives the real Run loop against a port where
// nothing listens and records its waits instead of sleeping.
func TestRunFollowsTheBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var sl sleeps
	log, _ := testenv.NewLog(t)
	c := newConnector(t, Config{
		BrokerURL: "wss://" + addr + wire.ConnectPath, HostID: wire.NewID().String(),
		Token: wire.NewToken(), Log: log,
		Rand: func() float64 { return 0.5 }, Sleep: sl.sleep,
	})
	stop := run(t, c)
	testenv.WaitFor(t, "five attempts", func() bool { return len(sl.list()) >= 5 })
	stop()
	got := sl.list()[:5]
	for i, w := range []time.Duration{1, 2, 4, 8, 16} {
		want := w*time.Second + w*time.Second/8
		if got[i] != want {
			t.Fatalf("wait %d = %v, want %v (all: %v)", i, got[i], want, got)
		}
	}
	st := c.Status()
	if st.LastError != codeDial || st.State != StateStopped || st.Attempts < 5 {
		t.Fatalf("status %+v", st)
	}
}

// TestRunResetsBackoffOnlyAfterALongRegistration drives Run against a fake
// broker that drops each registration after the test moved the clock.
func TestRunResetsBackoffOnlyAfterALongRegistration(t *testing.T) {
	clock := &fakeClock{t: handoffNow}
	var sl sleeps
	fb := testfake.NewBroker(t, nil)
	cfg := fakeConfig(t, fb)
	cfg.Now, cfg.Sleep, cfg.Rand = clock.now, sl.sleep, func() float64 { return 0 }
	c := newConnector(t, cfg)
	run(t, c)
	held := []time.Duration{61 * time.Second, 30 * time.Second, 59 * time.Second, 60 * time.Second}
	for i, d := range held {
		h := fb.Host()
		testenv.WaitFor(t, "registration", func() bool { return c.Status().State == StateConnected })
		clock.advance(d)
		h.Close()
		testenv.WaitFor(t, "the wait after the drop", func() bool { return len(sl.list()) == i+1 })
	}
	base := cfg.BackoffBase
	want := []time.Duration{base, 2 * base, 4 * base, base}
	got := sl.list()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits %v, want %v", got, want)
		}
	}
}

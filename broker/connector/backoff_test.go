package connector

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

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
	// A minute registered resets n and refills the two fast retries.
	for i, want := range []time.Duration{0, 0, time.Second, 2 * time.Second} {
		o := outcome{code: codeDial}
		if i == 0 {
			o = outcome{code: codeClosed, registered: 60 * time.Second}
		}
		if got := b.next(o); got != want {
			t.Fatalf("wait %d after 60 s registered: %v, want %v", i, got, want)
		}
	}
}

func TestBackoffFastRetriesOnlyAfterALongRegistration(t *testing.T) {
	b := backoffWith(0)
	// A connector that never registered gets no fast retry.
	if got := b.next(outcome{code: codeDial}); got != time.Second || b.why != retryBackoff {
		t.Fatalf("first failure: %v %s", got, b.why)
	}
	if got := b.next(outcome{code: codeClosed, registered: time.Hour}); got != 0 || b.why != retryFast {
		t.Fatalf("blip: %v %s", got, b.why)
	}
	// A permanent refusal spends the budget: no fast retry after it.
	if got := b.next(outcome{code: string(wire.CodeUnauthorized)}); got != 10*time.Minute || b.why != retryPermanent {
		t.Fatalf("unauthorized: %v %s", got, b.why)
	}
	if got := b.next(outcome{code: codeDial}); got == 0 {
		t.Fatal("fast retry after a permanent refusal")
	}
	none := backoffWith(0)
	none.cfg.FastRetries = -1
	if got := none.next(outcome{code: codeClosed, registered: time.Hour}); got != time.Second {
		t.Fatalf("FastRetries -1: %v", got)
	}
}

func TestBackoffHonoursTheBrokersAdvice(t *testing.T) {
	b := backoffWith(0.5)
	got := b.next(outcome{code: codeGoingAway, registered: time.Hour, advised: 30 * time.Second, hasAdvice: true})
	if want := 30*time.Second + 30*time.Second/8; got != want || b.why != retryAdvised {
		t.Fatalf("advised 30 s: %v %s, want %v", got, b.why, want)
	}
	if got := b.next(outcome{code: codeGoingAway, hasAdvice: true}); got != 0 {
		t.Fatalf("advised 0: %v", got)
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
	// 61 s: reset and two fast retries (one spent); 30 s: the second fast
	// retry; 59 s: the schedule from n = 0; 60 s: reset, fast again.
	base := cfg.BackoffBase
	want := []time.Duration{0, 0, base, 0}
	got := sl.list()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits %v, want %v", got, want)
		}
	}
}

// TestRunHonoursShutdownAdviceAndReportsPermanentErrors drives Run against
// the fake broker: a close 1001 "shutdown retry=7" makes it wait 7 s plus
// jitter; an `unauthorized` answer shows as permanent_error in Status while
// the connector stays live but not ready; both are counted.
func TestRunHonoursShutdownAdviceAndReportsPermanentErrors(t *testing.T) {
	var sl sleeps
	refuse := false
	var mu sync.Mutex
	registered, _ := wire.Marshal(wire.Registered{})
	refusal, _ := wire.Marshal(wire.ErrorMsg{Code: wire.CodeUnauthorized})
	fb := testfake.NewBroker(t, func(b *testfake.Broker) {
		b.Answer = func() []byte {
			mu.Lock()
			defer mu.Unlock()
			if refuse {
				return refusal
			}
			return registered
		}
	})
	cfg := fakeConfig(t, fb)
	// The first wait (the advised one) returns once the test looked at
	// the status; later ones last until the test ends.
	looked := make(chan struct{})
	cfg.Sleep = func(ctx context.Context, d time.Duration) error {
		first := len(sl.list()) == 0
		sl.sleep(ctx, d)
		if first {
			select {
			case <-looked:
			case <-ctx.Done():
			}
		} else {
			<-ctx.Done()
		}
		return ctx.Err()
	}
	cfg.Rand = func() float64 { return 0.5 }
	c := newConnector(t, cfg)
	run(t, c)
	h := fb.Host()
	waitConnected(t, c)
	if st := c.Status(); !st.Ready || !st.Live || st.PermanentError != "" {
		t.Fatalf("registered: %+v", st)
	}
	mu.Lock()
	refuse = true
	mu.Unlock()
	h.WS.Close(websocket.StatusGoingAway, wire.ShutdownReason(7*time.Second))
	testenv.WaitFor(t, "the advised wait", func() bool { return len(sl.list()) == 1 })
	if got, want := sl.list()[0], 7*time.Second+7*time.Second/8; got != want {
		t.Fatalf("waited %v, want %v", got, want)
	}
	if st := c.Status(); st.RetryReason != retryAdvised || st.Ready || !st.Live || st.State != StateBackoff {
		t.Fatalf("after the shutdown close: %+v", st)
	}
	close(looked)
	testenv.WaitFor(t, "the permanent wait", func() bool { return len(sl.list()) == 2 })
	if got := sl.list()[1]; got != 10*time.Minute {
		t.Fatalf("after unauthorized: %v", got)
	}
	testenv.WaitFor(t, "status", func() bool { return c.Status().PermanentError == "unauthorized" })
	st := c.Status()
	if st.RetryReason != retryPermanent || st.Ready || !st.Live || st.RetryAt == nil {
		t.Fatalf("after unauthorized: %+v", st)
	}
	n := c.Counts()
	if n["reconnect:advised"] != 1 || n["reconnect:permanent"] < 1 || n["registered"] != 1 {
		t.Fatalf("counts %v", n)
	}
}

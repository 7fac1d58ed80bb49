package connector

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/testfake"
)

// step bounds every single wait of a test, so a broken connector fails the
// test instead of hanging it. It is never an assertion about speed.
const step = testenv.Step

// sleeps records the connector's backoff waits. Each wait returns at once
// unless block is set, in which case it lasts until Run's context ends.
type sleeps struct {
	mu    sync.Mutex
	got   []time.Duration
	block bool
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.got = append(s.got, d)
	block := s.block
	s.mu.Unlock()
	if block {
		<-ctx.Done()
		return ctx.Err()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	time.Sleep(time.Millisecond) // let the test observe the backoff state
	return nil
}

func (s *sleeps) list() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.got...)
}

func (s *sleeps) setBlock(b bool) {
	s.mu.Lock()
	s.block = b
	s.mu.Unlock()
}

// run starts c.Run and stops it when the test ends.
func run(t *testing.T, c *Connector) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(2 * step):
				t.Error("Run did not return after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newConnector(t *testing.T, cfg Config) *Connector {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitConnected(t *testing.T, c *Connector) {
	t.Helper()
	testenv.WaitFor(t, "the connector to register", func() bool { return c.Status().State == StateConnected })
}

// mustID parses a canonical id or fails.
func mustID(t *testing.T, s string) wire.ID {
	t.Helper()
	id, err := wire.ParseID(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// fakeConfig is a connector configuration for the fake broker fb.
func fakeConfig(t *testing.T, fb *testfake.Broker) Config {
	log, _ := testenv.NewLog(t)
	return Config{
		BrokerURL: fb.URL(), HostID: wire.NewID().String(), Token: wire.NewToken(),
		RootCAs: fb.Pool, Log: log,
		BackoffBase: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	}
}

// accept returns the next stream the connector hands to the front.
func accept(t *testing.T, c *Connector) *stream {
	t.Helper()
	type res struct {
		st  *stream
		err error
	}
	ch := make(chan res, 1)
	go func() {
		conn, err := c.Listener().Accept()
		if err != nil {
			ch <- res{err: err}
			return
		}
		ch <- res{st: conn.(*stream)}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("accept: %v", r.err)
		}
		t.Cleanup(func() { r.st.Close() })
		return r.st
	case <-time.After(step):
		t.Fatal("no stream was accepted")
		return nil
	}
}

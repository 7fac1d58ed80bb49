package testfake

import (
	"sync"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// CreditSender is a test's sender of several streams under the credit
// extension: it sends each stream's bytes in 64 KiB DATA frames as fast as
// its credit allows and records the most credit each stream ever held.
// The test's reader of WINDOW frames calls Grant.
type CreditSender struct {
	mu      sync.Mutex
	credit  map[wire.ID]int
	peak    map[wire.ID]int
	granted chan struct{}
}

// NewCreditSender starts every stream in ids at the initial window.
func NewCreditSender(ids ...wire.ID) *CreditSender {
	c := &CreditSender{credit: map[wire.ID]int{}, peak: map[wire.ID]int{}, granted: make(chan struct{}, 1)}
	for _, id := range ids {
		c.credit[id] = wire.InitialWindow
	}
	return c
}

// Grant adds a WINDOW increment for id after delay: the sender sees it one
// link round trip after the receiver made it.
func (c *CreditSender) Grant(id wire.ID, inc uint32, delay time.Duration) {
	time.AfterFunc(delay, func() {
		c.mu.Lock()
		c.credit[id] += int(inc)
		c.mu.Unlock()
		select {
		case c.granted <- struct{}{}:
		default:
		}
	})
}

// Send sends total[id] bytes of each stream with send(id, n), taking turns,
// and waits for a grant whenever no stream has credit (at most Step).
func (c *CreditSender) Send(t *testing.T, total map[wire.ID]int, send func(id wire.ID, n int)) {
	t.Helper()
	sent := map[wire.ID]int{}
	for {
		moved, done := false, true
		for id, want := range total {
			c.mu.Lock()
			c.peak[id] = max(c.peak[id], c.credit[id])
			n := min(64<<10, c.credit[id], want-sent[id])
			c.credit[id] -= n
			c.mu.Unlock()
			if n > 0 {
				send(id, n)
				sent[id] += n
				moved = true
			}
			done = done && sent[id] == want
		}
		if done {
			return
		}
		if !moved {
			select {
			case <-c.granted:
			case <-time.After(Step):
				t.Fatalf("no grant within %v: sent %v of %v", Step, sent, total)
			}
		}
	}
}

// Peak is the most credit stream id held while Send ran.
func (c *CreditSender) Peak(id wire.ID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peak[id]
}

package relay

import (
	"fmt"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestLimiter(max int) (*authLimiter, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	l := newAuthLimiter(5, time.Minute, 5*time.Minute, max)
	l.now = clk.now
	return l, clk
}

func TestLimiterBlocksAtLimitWithinWindow(t *testing.T) {
	l, clk := newTestLimiter(100)
	for i := range 4 {
		if l.fail("a") {
			t.Fatalf("blocked after %d failures", i+1)
		}
		clk.advance(10 * time.Second)
	}
	if _, b := l.blocked("a"); b {
		t.Fatal("blocked after 4 failures")
	}
	if !l.fail("a") {
		t.Fatal("5th failure within 60 s did not block")
	}
	left, b := l.blocked("a")
	if !b || left != 5*time.Minute {
		t.Fatalf("blocked %v for %v", b, left)
	}
	if _, b := l.blocked("b"); b {
		t.Fatal("another source blocked")
	}
	clk.advance(5*time.Minute - time.Second)
	if _, b := l.blocked("a"); !b {
		t.Fatal("block ended early")
	}
	clk.advance(time.Second)
	if _, b := l.blocked("a"); b {
		t.Fatal("block did not end after 5 minutes")
	}
	// The count restarted with the block: one more failure does not re-block.
	if l.fail("a") {
		t.Fatal("re-blocked after one failure")
	}
}

func TestLimiterWindowSlides(t *testing.T) {
	l, clk := newTestLimiter(100)
	for range 4 {
		l.fail("a")
	}
	clk.advance(61 * time.Second)
	if l.fail("a") {
		t.Fatal("failures older than the window counted")
	}
	for range 3 {
		l.fail("a")
	}
	if !l.fail("a") {
		t.Fatal("5 failures within the window did not block")
	}
}

func TestLimiterTableIsBoundedAndKeepsBlocks(t *testing.T) {
	l, clk := newTestLimiter(3)
	for range 5 {
		l.fail("blocked")
	}
	l.fail("x")
	l.fail("y")
	for i := range 100 {
		clk.advance(time.Millisecond)
		l.fail(fmt.Sprintf("flood-%d", i))
		if n := l.len(); n > 3 {
			t.Fatalf("table grew to %d", n)
		}
	}
	if _, b := l.blocked("blocked"); !b {
		t.Fatal("flooding the table evicted an active block")
	}
	// A full table of blocks does not track new sources (and does not grow).
	l2, _ := newTestLimiter(2)
	for _, s := range []string{"p", "q"} {
		for range 5 {
			l2.fail(s)
		}
	}
	if l2.fail("r") || l2.len() != 2 || l2.untracked != 1 {
		t.Fatalf("len %d untracked %d", l2.len(), l2.untracked)
	}
	for _, s := range []string{"p", "q"} {
		if _, b := l2.blocked(s); !b {
			t.Fatalf("%s lost its block", s)
		}
	}
}

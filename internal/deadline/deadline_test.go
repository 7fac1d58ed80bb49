package deadline

import (
	"testing"
	"time"
)

// The first wait sets a deadline of bound plus the slack; the next wait
// keeps it while it still grants the bound.
func TestNextKeepsADeadlineThatGrantsTheBound(t *testing.T) {
	var l Lazy
	before := time.Now()
	d, ok := l.Next(time.Hour, time.Time{})
	after := time.Now()
	if !ok {
		t.Fatal("the first wait set no deadline")
	}
	if d.Before(before.Add(time.Hour)) || d.After(after.Add(time.Hour+Slack(time.Hour))) {
		t.Fatalf("deadline %v from now, want 1h to 1h+%v", time.Until(d), Slack(time.Hour))
	}
	if _, ok := l.Next(time.Hour, time.Time{}); ok {
		t.Fatal("the second wait re-armed a deadline that still grants the bound")
	}
	// A longer bound is not granted by the deadline set: it moves.
	if d2, ok := l.Next(2*time.Hour, time.Time{}); !ok || !d2.After(d) {
		t.Fatalf("a longer bound kept the deadline (%v, %v)", d2, ok)
	}
}

// A limit wins over the bound and the slack: the deadline is never past it.
func TestNextNeverPassesTheLimit(t *testing.T) {
	var l Lazy
	if _, ok := l.Next(time.Hour, time.Time{}); !ok {
		t.Fatal("no deadline set")
	}
	limit := time.Now().Add(time.Minute)
	d, ok := l.Next(time.Hour, limit)
	if !ok || !d.Equal(limit) {
		t.Fatalf("deadline %v (set %v), want the limit %v", d, ok, limit)
	}
	// Within the bound of the limit: the limit again, never later.
	limit = time.Now().Add(time.Hour + Slack(time.Hour)/2)
	if d, ok := l.Next(time.Hour, limit); !ok || d.After(limit) {
		t.Fatalf("deadline %v (set %v) past the limit %v", d, ok, limit)
	}
	past := time.Now().Add(-time.Second)
	if d, ok := l.Next(time.Hour, past); !ok || !d.Equal(past) {
		t.Fatalf("deadline %v (set %v), want the past limit", d, ok)
	}
}

// Forget makes the next wait set its own deadline.
func TestForget(t *testing.T) {
	var l Lazy
	l.Next(time.Hour, time.Time{})
	l.Forget()
	if _, ok := l.Next(time.Hour, time.Time{}); !ok {
		t.Fatal("a forgotten deadline was kept")
	}
}

func TestSlack(t *testing.T) {
	for _, c := range []struct{ bound, want time.Duration }{
		{8 * time.Millisecond, time.Millisecond},
		{4 * time.Second, 500 * time.Millisecond},
		{time.Minute, time.Second},
	} {
		if got := Slack(c.bound); got != c.want {
			t.Errorf("Slack(%v) = %v, want %v", c.bound, got, c.want)
		}
	}
}

package msgconn

import (
	"testing"
	"time"
)

type item struct {
	name string
	left int
	Turn
}

// drain serves one frame per turn and returns the order.
func drain(r *RoundRobin[*item], add map[int]*item) []string {
	var got []string
	for r.Len() > 0 {
		x := r.Current()
		x.left--
		got = append(got, x.name)
		if x.left == 0 {
			r.Remove()
		} else {
			r.Advance()
		}
		if y := add[len(got)]; y != nil {
			r.Add(y)
		}
	}
	return got
}

func TestRoundRobinServesInTurn(t *testing.T) {
	var r RoundRobin[*item]
	a, b := &item{name: "a", left: 2}, &item{name: "b", left: 1}
	r.Add(a)
	r.Add(b)
	r.Add(a) // already queued: no-op
	// After b's last frame (the queue's last position) c arrives: a has
	// waited longer and goes first.
	c := &item{name: "c", left: 1}
	got := drain(&r, map[int]*item{2: c})
	want := []string{"a", "b", "a", "c"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	r.Add(a) // removed items can be queued again
	if r.Len() != 1 || r.Current() != a {
		t.Fatal("a removed item was not queued again")
	}
	r.Clear()
	r.Add(a)
	if r.Len() != 1 {
		t.Fatal("Clear left the item marked as queued")
	}
}

func TestDeadline(t *testing.T) {
	d := NewDeadline()
	select {
	case <-d.Wait():
		t.Fatal("an unset deadline fired")
	default:
	}
	d.Set(time.Now().Add(-time.Second))
	if !isClosed(d.Wait()) || !d.IsSet() {
		t.Fatal("a past deadline did not fire at once")
	}
	d.Set(time.Now().Add(20 * time.Millisecond)) // re-arms
	if isClosed(d.Wait()) {
		t.Fatal("a future deadline fired early")
	}
	select {
	case <-d.Wait():
	case <-time.After(5 * time.Second):
		t.Fatal("the deadline did not fire")
	}
	d.Set(time.Time{})
	if isClosed(d.Wait()) || d.IsSet() {
		t.Fatal("clearing did not reset the deadline")
	}
}

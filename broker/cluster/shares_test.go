package cluster

import "testing"

// TestShareCountSlots: a replay share counts entries per hour of expiry;
// an entry leaves the count once its hour has ended, never before its
// expiry, and a give-back removes one from the right hour.
func TestShareCountSlots(t *testing.T) {
	const h = 3600
	var c shareCount
	c.add(10*h+1, 1) // hour ending 11h
	c.add(10*h+5, 1)
	c.add(12*h, 1) // ends exactly at 12h
	c.add(9*h+7, 1)
	if n := c.live(9 * h); n != 4 || len(c.Slots) != 3 {
		t.Fatalf("live = %d in %d slots, want 4 in 3", n, len(c.Slots))
	}
	if n := c.live(10*h + 7); n != 3 { // the 10h slot ended
		t.Fatalf("live after 10h = %d, want 3", n)
	}
	c.add(10*h+5, -1)
	if n := c.live(10*h + 7); n != 2 {
		t.Fatalf("after a give-back: %d, want 2", n)
	}
	c.add(10*h+5, -1) // the 11h slot empties and goes
	c.add(13*h, -1)   // nothing there: no slot made
	if n := c.live(10*h + 7); n != 1 || len(c.Slots) != 1 || c.Slots[0] != [2]int64{12 * h, 1} {
		t.Fatalf("slots %v (live %d), want [[12h 1]]", c.Slots, n)
	}
	if n := c.live(12 * h); n != 0 || len(c.Slots) != 0 {
		t.Fatalf("at 12h: %d in %v, want none", n, c.Slots)
	}
}

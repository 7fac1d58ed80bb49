package store

import "testing"

func TestTableEvictsByExpiryAndRefusesWhenFull(t *testing.T) {
	tb := NewTable[int, string](3)
	for i := 0; i < 3; i++ {
		if !tb.Add(i, "v", int64(10+i), 0) {
			t.Fatalf("add %d refused", i)
		}
	}
	if tb.Add(9, "v", 100, 5) {
		t.Fatal("a full table of unexpired entries grew")
	}
	if tb.Len() != 3 || !tb.Contains(0, 5) {
		t.Fatal("a live entry was forgotten")
	}
	// At 10 entry 0 has expired and makes room; the others stay.
	if !tb.Add(9, "v", 100, 10) {
		t.Fatal("an expired entry did not make room")
	}
	if tb.Contains(0, 10) || !tb.Contains(1, 10) || !tb.Contains(2, 10) || !tb.Contains(9, 10) {
		t.Fatal("wrong entry evicted")
	}
	if tb.Room(10) != 0 || tb.Room(12) != 2 {
		t.Fatalf("room %d/%d", tb.Room(10), tb.Room(12))
	}
}

func TestTableUpdateKeepsLaterExpiry(t *testing.T) {
	tb := NewTable[string, int](2)
	tb.Add("a", 1, 100, 0)
	tb.Add("a", 2, 50, 0)
	if exp, ok := tb.Expiry("a", 0); !ok || exp != 100 {
		t.Fatalf("expiry %d", exp)
	}
	if v, _ := tb.Get("a", 0); v != 2 {
		t.Fatal("value not updated")
	}
	if tb.Contains("a", 100) {
		t.Fatal("entry alive at its expiry")
	}
	// Adding an already expired entry stores nothing.
	tb.Add("old", 1, 5, 10)
	if tb.Len() != 1 {
		t.Fatal("stored an expired entry")
	}
}

func TestTableHeapStaysBounded(t *testing.T) {
	tb := NewTable[int, struct{}](4)
	for i := 0; i < 10000; i++ {
		tb.Add(i%4, struct{}{}, int64(1000+i), 0)
		if i%7 == 0 {
			tb.Remove(i % 4)
		}
	}
	if len(tb.h) > 2*tb.Len()+64+1 {
		t.Fatalf("heap holds %d items for %d entries", len(tb.h), tb.Len())
	}
	tb.Sweep(1 << 40)
	if tb.Len() != 0 {
		t.Fatalf("%d entries after sweeping everything", tb.Len())
	}
}

package msgconn

// Turn is embedded in the items a RoundRobin schedules; it records whether
// the item is queued, so scheduling an item twice is a no-op without a
// lookup.
type Turn struct{ queued bool }

func (t *Turn) turn() *Turn { return t }

// Schedulable is an item type for RoundRobin: a pointer to a struct that
// embeds Turn.
type Schedulable interface {
	comparable
	turn() *Turn
}

// RoundRobin is the write scheduler of a socket that carries several
// streams: the streams that have something to send wait in turn, and each
// gets one frame per turn, so a bulk stream cannot starve another stream's
// small messages. A stream that is scheduled while others wait goes to the
// back of the queue: it never jumps ahead of a stream that waited longer.
// The zero value is empty; the owner's lock guards it.
type RoundRobin[T Schedulable] struct {
	queue []T
	next  int // index of the item whose turn it is
}

// Add queues x at the back unless it is queued already.
func (r *RoundRobin[T]) Add(x T) {
	if t := x.turn(); !t.queued {
		t.queued = true
		r.queue = append(r.queue, x)
	}
}

// Len is the number of queued items.
func (r *RoundRobin[T]) Len() int { return len(r.queue) }

// Current is the item whose turn it is; Len must be above 0. The caller
// then either sends one frame of it and calls Advance (it has more) or
// calls Remove (it is done for now).
func (r *RoundRobin[T]) Current() T { return r.queue[r.index()] }

func (r *RoundRobin[T]) index() int {
	if r.next >= len(r.queue) {
		r.next = 0
	}
	return r.next
}

// Advance keeps the current item queued and gives the turn to the next.
func (r *RoundRobin[T]) Advance() {
	r.next = r.index() + 1
	if r.next == len(r.queue) {
		r.next = 0
	}
}

// Remove takes the current item out of the queue; the turn passes to the
// item after it. When the removed item was the last, the turn wraps to the
// front now: an item added next is appended at that position and must wait
// for the items already waiting.
func (r *RoundRobin[T]) Remove() {
	i := r.index()
	r.queue[i].turn().queued = false
	copy(r.queue[i:], r.queue[i+1:])
	var zero T
	r.queue[len(r.queue)-1] = zero
	r.queue = r.queue[:len(r.queue)-1]
	if r.next == len(r.queue) {
		r.next = 0
	}
}

// Items are the queued items in queue order (for a final sweep).
func (r *RoundRobin[T]) Items() []T { return r.queue }

// Clear empties the queue; the items count as not queued.
func (r *RoundRobin[T]) Clear() {
	for _, x := range r.queue {
		x.turn().queued = false
	}
	r.queue, r.next = nil, 0
}

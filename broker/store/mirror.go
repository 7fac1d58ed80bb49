package store

import "time"

// ApplyOp applies a change that another broker instance of a cluster made
// and the shared engine delivered (docs/cluster.md): it is not a change of
// this instance, so it is neither journaled nor undone. Applying an op twice
// is harmless. It reports false when a consumed or revoked table had no room
// for the digest (the caller counts it; the engine still holds the entry and
// every write there is conditional).
func (s *State) ApplyOp(op Op, now time.Time) bool {
	s.muted = true
	defer func() { s.muted = false }()
	switch op.Kind {
	case OpPutBootstrap, OpPutRoute:
		c := op.Cred
		s.put(&c)
	case OpDelete:
		s.remove(op.Digest)
	case OpConsumed:
		return s.consumed.Add(op.Digest, struct{}{}, op.ExpiresAt, now.Unix())
	case OpRevoked:
		// A digest already held as revoked keeps its host (zero: none),
		// so that host's share stays counted once.
		_, _, ok := s.putRevoked(op.Digest, s.revoked.m[op.Digest].v, op.ExpiresAt, now.Unix())
		return ok
	}
	return true
}

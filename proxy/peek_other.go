//go:build !unix

package proxy

// peekAlive cannot look without blocking here, so it cannot tell a silent
// connection from one holding bytes the upstream sent past its response:
// pooled connections are never reused (see upstreamPool.get).
func peekAlive(uintptr) bool { return false }

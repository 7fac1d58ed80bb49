//go:build !unix

package proxy

import "errors"

// peekAlive cannot look without blocking here, so it cannot tell a silent
// connection from one holding bytes the upstream sent past its response:
// pooled connections are never reused (see upstreamPool.get).
func peekAlive(uintptr) bool { return false }

// canWriteRaw: upConn.send uses the connection's own Write here.
const canWriteRaw = false

func writeRaw(uintptr, []byte) (int, error) { return 0, errors.ErrUnsupported }

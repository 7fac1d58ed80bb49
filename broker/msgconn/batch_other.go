//go:build !unix

package msgconn

import "syscall"

const canReadNow = false

func readNow(syscall.RawConn, []byte) (int, error, bool) { return 0, nil, false }

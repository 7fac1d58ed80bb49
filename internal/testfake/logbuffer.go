package testfake

import (
	"bytes"
	"sync"
)

// maxLogBuffer bounds what a LogBuffer keeps; later writes are dropped
// (and still reported as written, so a logger never sees an error).
const maxLogBuffer = 64 << 20

// LogBuffer is the log sink of the tests: safe for the concurrent writes of
// a server's goroutines or a subprocess's output, and readable at any time
// for assertions (what was logged, and that no secret was).
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < maxLogBuffer {
		l.b.Write(p)
	}
	return len(p), nil
}

// String is everything kept so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

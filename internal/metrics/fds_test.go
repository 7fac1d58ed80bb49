package metrics

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/testfake"

	"github.com/rs/zerolog"
)

type syncBuf = testfake.LogBuffer

// The descriptor count follows real opens, and crossing 80 % of the soft
// limit is logged before the limit is reached.
func TestFDUsageAndWarning(t *testing.T) {
	open0, limit0, err := FDUsage()
	if err != nil || open0 < 3 || limit0 < open0 {
		t.Fatalf("FDUsage: %d of %d, %v", open0, limit0, err)
	}
	var files []*os.File
	for i := 0; i < 10; i++ {
		f, err := os.Create(filepath.Join(t.TempDir(), "f"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if open, _, _ := FDUsage(); open < open0+10 {
		t.Fatalf("%d open after 10 more, was %d", open, open0)
	}

	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	open, _, _ := FDUsage()
	low := orig
	low.Cur = uint64(open + open/10 + 2) // open is past 80 % of it
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig)
	var logs syncBuf
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { WatchFDs(ctx, zerolog.New(&logs), 10*time.Millisecond); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), `"event":"fds_low"`) {
		if time.Now().After(deadline) {
			t.Fatal("no warning at 80 % of the descriptor limit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if n := strings.Count(logs.String(), "fds_low"); n != 1 {
		t.Fatalf("warned %d times for one crossing", n)
	}
}

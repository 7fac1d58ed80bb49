package sdnotify

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// The watchdog is fed only while the self-check passes (operations.md: "feeds
// the watchdog when one is configured, only while its own listeners
// answer"). The test hands out each check's result itself, so the order of
// checks and datagrams is fixed.
func TestWatchdogFedOnlyWhileCheckPasses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", "2000") // 2 ms: checks follow each other quickly

	results := make(chan error)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		New(zerolog.New(zerolog.NewTestWriter(t))).Watchdog(ctx, func(cctx context.Context) error {
			select {
			case err := <-results:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	defer func() { cancel(); <-done }()

	down := errors.New("listener does not answer")
	for _, r := range []error{nil, down, down, down, nil} {
		results <- r
	}
	// A sixth check has begun once it takes a result, so the datagrams of
	// the first five are all in the socket's buffer by now.
	results <- down

	var got []string
	buf := make([]byte, 512)
	conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	for {
		n, err := conn.Read(buf)
		if err != nil {
			break
		}
		got = append(got, string(buf[:n]))
	}
	if len(got) != 2 || got[0] != "WATCHDOG=1" || got[1] != "WATCHDOG=1" {
		t.Fatalf("after checks pass, fail x3, pass: datagrams %q, want exactly two WATCHDOG=1", got)
	}
}

// Without WATCHDOG_USEC there is nothing to feed: Watchdog returns at once
// and never runs the check.
func TestWatchdogOffWithoutInterval(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "")
	ran := false
	New(zerolog.Nop()).Watchdog(context.Background(), func(context.Context) error { ran = true; return nil })
	if ran {
		t.Fatal("check ran without a configured watchdog")
	}
}

package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// notifyListener is a fake systemd notification socket.
type notifyListener struct {
	conn *net.UnixConn
	msgs chan string
}

func listenNotify(t *testing.T) (*notifyListener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifyListener{conn: conn, msgs: make(chan string, 256)}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				close(n.msgs)
				return
			}
			n.msgs <- string(buf[:k])
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return n, path
}

// waitFor returns once a datagram containing want arrives, failing after 20 s.
func (n *notifyListener) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case m, ok := <-n.msgs:
			if !ok {
				t.Fatalf("notify socket closed before %q", want)
			}
			for _, line := range strings.Split(m, "\n") {
				if line == want {
					return
				}
			}
		case <-deadline:
			t.Fatalf("no %q from the daemon", want)
		}
	}
}

func TestSystemdNotifyLifecycle(t *testing.T) {
	n, sock := listenNotify(t)
	dir := t.TempDir()
	cfgPath := writeConfig(t, dir, echoRelay(t))
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "400000") // 0.4 s: pings every 0.2 s
	d := startDaemon(t, cfgPath)
	os.Unsetenv("NOTIFY_SOCKET")

	n.waitFor(t, "READY=1")
	n.waitFor(t, "WATCHDOG=1")
	n.waitFor(t, "WATCHDOG=1")
	d.cmd.Process.Signal(syscall.SIGHUP)
	n.waitFor(t, "RELOADING=1")
	n.waitFor(t, "READY=1")
	d.cmd.Process.Signal(syscall.SIGTERM)
	n.waitFor(t, "STOPPING=1")
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, d.stderr.String())
	}
}

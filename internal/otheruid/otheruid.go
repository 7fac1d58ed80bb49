// Package otheruid lets a test run its own binary again as another user,
// for the rules about who may open, serve or own a file that hold only
// between two uids (the admin socket's peer checks, output files in a
// shared directory). go test's build directory is 0700, so the binary is
// copied where every uid may run it. Tests only.
package otheruid

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// Nobody is the uid (and gid) a root test runs its other processes as.
const Nobody = 65534

// Dir is a directory every uid may enter, removed when the test ends,
// holding a copy of the running test binary every uid may run.
type Dir struct {
	Path string
	exe  string
}

// New makes the directory and copies the test binary into it.
func New(t testing.TB) Dir {
	t.Helper()
	dir, err := os.MkdirTemp("", "otheruid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, filepath.Base(self))
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return Dir{Path: dir, exe: exe}
}

// Command runs the copy with args and env added to the caller's, as uid
// (with gid uid) unless uid is the caller's own.
func (d Dir) Command(uid int, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(d.exe, args...)
	cmd.Env = append(os.Environ(), env...)
	if uid != os.Getuid() {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	return cmd
}

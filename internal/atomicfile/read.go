package atomicfile

import (
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// ModeError refuses a private file whose permissions let the wrong people
// read or change it. Callers that only warn (a secret written by another
// program) read with deny 0 and check the mode themselves.
type ModeError struct {
	Path string
	Mode os.FileMode // the file's permission bits
	Deny os.FileMode // the bits the caller refused
}

func (e *ModeError) Error() string {
	who, fix := "other users", "chmod o-rwx "+e.Path
	if e.Deny&0o070 != 0 {
		who, fix = "group or others", "chmod 600 "+e.Path
	}
	what := "can read or change it"
	if e.Deny&0o044 == 0 {
		what = "can change it"
	}
	return fmt.Sprintf("%s has mode %04o: %s %s (%s)", e.Path, e.Mode, who, what, fix)
}

// ReadPrivate reads the regular file path, at most max bytes, refusing it
// with a *ModeError when its permission bits intersect deny. The checks run
// on the opened file, so a rename between check and read cannot slip another
// file in; O_NONBLOCK keeps a FIFO planted at path from hanging the open.
// The FileInfo is returned for callers that warn about looser modes or need
// the modification time.
func ReadPrivate(path string, max int64, deny os.FileMode) ([]byte, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s is not a regular file", path)
	}
	if p := fi.Mode().Perm(); p&deny != 0 {
		return nil, nil, &ModeError{Path: path, Mode: p, Deny: deny}
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > max {
		return nil, nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return data, fi, nil
}

// ReadSecret reads a small secret file (at most 4 KiB, surrounding space
// trimmed), refusing one other users can access or one that is empty. The
// file's permission bits are returned for GroupWarning.
func ReadSecret(path string) (string, os.FileMode, error) {
	b, fi, err := ReadPrivate(path, 4096, 0o007)
	if err != nil {
		return "", 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", 0, fmt.Errorf("%s is empty", path)
	}
	return s, fi.Mode().Perm(), nil
}

// GroupWarning is the warning for a private file, read with others denied,
// whose group may read it: a dedicated group (ssl-cert) is a common setup
// for files several services share, so it is not refused. key names the
// setting, what the secret. "" when the group may not read it.
func GroupWarning(key, path string, mode os.FileMode, what string) string {
	if mode.Perm()&0o070 == 0 {
		return ""
	}
	return fmt.Sprintf("%s %s has mode %04o: members of its group can read %s; fine for a dedicated group such as ssl-cert, otherwise chmod 600 %s",
		key, path, mode.Perm(), what, path)
}

// Package atomicfile writes files that hold keys, tokens and state so that a
// crash or a concurrent reader never sees a half-written file, and so that a
// command run under sudo never leaves root-owned files the service user
// cannot read.
//
// Every write goes to a temporary file in the destination directory, is
// fsynced, given its final mode and owner, renamed over the destination and
// followed by an fsync of the directory, so the rename itself is durable.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Owner is a numeric uid/gid pair.
type Owner struct{ UID, GID int }

// OwnerOf reports who owns path.
func OwnerOf(path string) (Owner, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Owner{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return Owner{}, fmt.Errorf("%s: no owner information on this platform", path)
	}
	return Owner{UID: int(st.Uid), GID: int(st.Gid)}, nil
}

// targetOwner is the owner a new file at path must end up with: the owner of
// the file it replaces, else the owner of its directory.
func targetOwner(path string) (Owner, error) {
	if o, err := OwnerOf(path); err == nil {
		return o, nil
	}
	return OwnerOf(filepath.Dir(path))
}

// CheckWriter refuses, with an operator-readable error, a caller that is
// neither root nor the owner of dir: such a caller would either fail halfway
// or leave files the service cannot read.
func CheckWriter(dir string) error {
	o, err := OwnerOf(dir)
	if err != nil {
		return err
	}
	uid := os.Geteuid()
	if uid == 0 || uid == o.UID {
		return nil
	}
	return fmt.Errorf("%s belongs to uid %d; run this command as that user or as root", dir, o.UID)
}

// WriteFile atomically replaces path with data at mode perm. When running as
// root, the file is given the owner of the file it replaces (or of its
// directory) before the rename, so it is never visible with the wrong owner.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	if err := CheckWriter(filepath.Dir(path)); err != nil {
		return err
	}
	owner, err := targetOwner(path)
	if err != nil {
		return err
	}
	return write(path, data, perm, &owner)
}

// WriteOutput is WriteFile for a file the caller named on the command line
// (`pair --png FILE`): written the same way, but in any directory the caller
// may write, such as /tmp. CheckWriter's rule is for the state directory and
// the files the configuration names, where a file the service cannot read
// breaks the service; an output file is the caller's own. Run as root, it
// goes to the directory's owner only when nobody else may create files
// there, and never to the owner of a file already at the path: in a shared
// directory anyone could have put that file there to be handed the secret.
func WriteOutput(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	var owner *Owner
	if fi.Mode().Perm()&0o022 == 0 {
		o, err := OwnerOf(dir)
		if err != nil {
			return err
		}
		owner = &o
	}
	return write(path, data, perm, owner)
}

// write replaces path atomically; run as root, the file is given owner
// (nil: it stays root's) before the rename.
func write(path string, data []byte, perm os.FileMode, owner *Owner) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmpName := tmp.Name()
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmpName)
		}
	}()
	if err := tmp.Chmod(perm); err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if os.Geteuid() == 0 && owner != nil {
		if err := tmp.Chown(owner.UID, owner.GID); err != nil {
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmpName, path); err != nil {
		return err
	}
	ok = true
	return SyncDir(dir)
}

// SyncDir fsyncs a directory so that renames and creations inside it survive
// a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	return nil
}

// MkdirPrivate creates dir (and missing parents) with mode 0700. A directory
// created as root takes the owner of its parent, so `sudo securelink ...`
// run against a service user's state directory stays readable by that user.
// An existing directory is left as it is, except that group or other access
// is an error: private material must not live in a shared directory.
func MkdirPrivate(dir string) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s exists and is not a directory", dir)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return fmt.Errorf("%s has mode %04o; it holds private keys and must be 0700 (chmod 700 %s)", dir, fi.Mode().Perm(), dir)
		}
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		if o, err := OwnerOf(parent); err == nil {
			if err := os.Chown(dir, o.UID, o.GID); err != nil {
				return err
			}
		}
	}
	return SyncDir(parent)
}

// LockDir takes an exclusive flock on dir and returns its release. Writers
// of files in dir serialize on the directory, not the file: every write
// replaces the file by rename, so a lock on the file itself would not hold.
func LockDir(dir string) (func(), error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

package pinning

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// BackupDir is where rotations keep the replaced identities.
func BackupDir(stateDir string) string { return filepath.Join(stateDir, BackupDirName) }

// writeBackup stores a replaced identity under a name that sorts by time.
// When the clock has not moved past the newest backup (two rotations in one
// tick, or a clock set back), the name moves just past that backup instead,
// so pruning by name always removes the oldest.
func writeBackup(stateDir string, data []byte, now time.Time) error {
	dir := BackupDir(stateDir)
	if err := atomicfile.MkdirPrivate(dir); err != nil {
		return err
	}
	existing, err := Backups(stateDir)
	if err != nil {
		return err
	}
	t := now.UTC()
	if n := len(existing); n > 0 {
		base := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(existing[n-1]), "identity-"), ".pem")
		if last, err := time.Parse(backupTimeLayout, base); err == nil && !t.After(last) {
			t = last.Add(time.Nanosecond)
		}
	}
	path := filepath.Join(dir, "identity-"+t.Format(backupTimeLayout)+".pem")
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("backup %s already exists", path)
	}
	return atomicfile.WriteFile(path, data, 0o600)
}

func pruneBackups(dir string, keep int) error {
	names, err := backupNames(dir)
	if err != nil || len(names) <= keep {
		return err
	}
	for _, n := range names[:len(names)-keep] {
		if err := os.Remove(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	return atomicfile.SyncDir(dir)
}

// Backups lists the kept identity backups, oldest first.
func Backups(stateDir string) ([]string, error) {
	dir := BackupDir(stateDir)
	names, err := backupNames(dir)
	for i, n := range names {
		names[i] = filepath.Join(dir, n)
	}
	return names, err
}

// backupNames lists the backup file names in dir, oldest first; none when
// dir does not exist.
func backupNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && backupName.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

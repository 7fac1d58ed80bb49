// Package store holds what the Reach broker keeps on disk and the bounded
// tables it keeps in memory: the hosts file (which host_ids exist and the
// digest of each host's registration token), the state file (published
// bootstrap and route credentials, consumed and revoked digests), and the
// expiring tables that remember replayed connection ids and closed streams.
//
// Only digests are ever stored. Files are written with
// internal/atomicfile, so a crash or a concurrent reader never sees half a
// file and a command run under sudo leaves the file owned by the service
// user. Nothing here touches the network; the broker package decides when to
// read, change and persist, and serializes access with its own lock.
package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/internal/strictjson"
)

// FileMode is the mode of every file this package writes.
const FileMode os.FileMode = 0o600

// MaxHostsFileBytes bounds the hosts file. One entry is about 100 bytes, so
// this holds MaxHostsEntries with room to spare.
const MaxHostsFileBytes = 16 << 20

// MaxHostsEntries bounds the entries AddHost will write and ParseHosts will
// accept: the largest max_hosts (65,536, 6.5× the default of 10,000); the
// runtime limit on online hosts is the broker's max_hosts.
const MaxHostsEntries = 1 << 16

// Hosts maps each known host_id to the digest of its registration token.
type Hosts map[wire.ID]wire.Digest

type hostsFile struct {
	Hosts map[string]hostEntry `json:"hosts"`
}

type hostEntry struct {
	HostTokenSHA256 string `json:"host_token_sha256"`
}

// ParseHosts decodes a hosts file: exactly {"hosts": {"<host_id>":
// {"host_token_sha256": "<43>"}}}. Unknown keys, non-canonical ids or
// digests and duplicate host_ids are errors, because a silently ignored
// typo here would lock a host out (or keep a removed one in).
func ParseHosts(data []byte) (Hosts, error) {
	if len(data) > MaxHostsFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxHostsFileBytes)
	}
	var f hostsFile
	if err := strictjson.Decode(data, 0, &f); err != nil {
		return nil, fmt.Errorf("not a hosts file: %v", err)
	}
	if f.Hosts == nil {
		return nil, errors.New(`missing the "hosts" object`)
	}
	if len(f.Hosts) > MaxHostsEntries {
		return nil, fmt.Errorf("more than %d hosts", MaxHostsEntries)
	}
	out := make(Hosts, len(f.Hosts))
	for k, e := range f.Hosts {
		id, err := wire.ParseID(k)
		if err != nil {
			return nil, fmt.Errorf("host id %q is not a canonical 22-character id", k)
		}
		d, err := wire.ParseDigest(e.HostTokenSHA256)
		if err != nil {
			return nil, fmt.Errorf("host %s: host_token_sha256 is not a canonical 43-character digest", k)
		}
		out[id] = d
	}
	return out, nil
}

// Marshal encodes hosts deterministically (sorted by host_id).
func (h Hosts) Marshal() []byte {
	ids := make([]string, 0, len(h))
	for id := range h {
		ids = append(ids, id.String())
	}
	sort.Strings(ids)
	var b bytes.Buffer
	b.WriteString("{\"hosts\": {")
	for i, s := range ids {
		id, _ := wire.ParseID(s)
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "\n  %q: {\"host_token_sha256\": %q}", s, h[id].String())
	}
	if len(ids) > 0 {
		b.WriteString("\n")
	}
	b.WriteString("}}\n")
	return b.Bytes()
}

// LoadHosts reads and parses the hosts file. A file that group or others
// may write is refused: whoever can write it can add a host.
func LoadHosts(path string) (Hosts, error) {
	data, err := readPrivate(path, MaxHostsFileBytes)
	if err != nil {
		return nil, err
	}
	h, err := ParseHosts(data)
	if err != nil {
		return nil, fmt.Errorf("hosts file %s: %w", path, err)
	}
	return h, nil
}

// AddHost creates a host_id and a registration token, stores only the
// token's digest in hostsFile (creating the file when it does not exist) and
// returns both so the operator can see them once. Concurrent add-host and
// remove-host runs are serialized with a lock on the file's directory, so
// neither loses the other's change.
func AddHost(hostsFile string) (hostID string, token wire.Secret, err error) {
	err = editHosts(hostsFile, true, func(h Hosts) error {
		if len(h) >= MaxHostsEntries {
			return fmt.Errorf("hosts file already lists %d hosts", len(h))
		}
		id := wire.NewID()
		for h[id] != (wire.Digest{}) {
			id = wire.NewID()
		}
		token = wire.NewToken()
		h[id] = wire.TokenDigest(string(token))
		hostID = id.String()
		return nil
	})
	if err != nil {
		return "", "", err
	}
	return hostID, token, nil
}

// RemoveHost deletes hostID from hostsFile. A running broker notices on its
// next reload (SIGHUP) and closes that host's registration with `revoked`.
func RemoveHost(hostsFile, hostID string) error {
	id, err := wire.ParseID(hostID)
	if err != nil {
		return fmt.Errorf("%q is not a host id (22 characters, as printed by add-host)", hostID)
	}
	return editHosts(hostsFile, false, func(h Hosts) error {
		if _, ok := h[id]; !ok {
			return fmt.Errorf("host %s is not in %s", hostID, hostsFile)
		}
		delete(h, id)
		return nil
	})
}

func editHosts(path string, create bool, edit func(Hosts) error) error {
	if path == "" {
		return errors.New("no hosts_file configured")
	}
	dir := filepath.Dir(path)
	if err := atomicfile.CheckWriter(dir); err != nil {
		return err
	}
	unlock, err := atomicfile.LockDir(dir)
	if err != nil {
		return err
	}
	defer unlock()
	h, err := LoadHosts(path)
	if errors.Is(err, os.ErrNotExist) && create {
		h, err = Hosts{}, nil
	}
	if err != nil {
		return err
	}
	if err := edit(h); err != nil {
		return err
	}
	return atomicfile.WriteFile(path, h.Marshal(), FileMode)
}

// readPrivate reads at most max bytes of path, refusing a file that group
// or others may write: whoever can write it can add a host or a route.
func readPrivate(path string, max int64) ([]byte, error) {
	data, _, err := atomicfile.ReadPrivate(path, max, 0o022)
	return data, err
}

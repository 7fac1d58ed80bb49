package doctor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/internal/metrics"
)

// FDFailRatio is the share of the soft descriptor limit at which the check
// fails: the next burst of connections meets EMFILE. Past
// metrics.FDWarnRatio (the broker's own log warning) it warns.
const FDFailRatio = 0.95

// RunBroker is doctor for `securelink broker doctor`: the broker's
// configuration, the running broker process (the one listening on
// cfg.Listen) and its descriptors. cfg may be nil when the configuration
// failed to load; cfgErr then says why.
func RunBroker(cfg *server.Config, cfgErr error, path string) []Result {
	var rs []Result
	add := func(r Result) { rs = append(rs, r) }
	if cfgErr != nil {
		add(Result{"config", Fail, cfgErr.Error(), "correct the key named at file:line (the broker keys: README, section Reach)"})
		return rs
	}
	add(Result{"config", OK, path, ""})
	pid, err := listenerPID(cfg.Listen)
	if err != nil {
		add(Result{"broker process", Warn, err.Error(),
			"start the broker (systemctl start securelink-broker) and run doctor again, as root or the broker's user"})
		return rs
	}
	add(Result{"broker process", OK, fmt.Sprintf("pid %d listens on %s", pid, cfg.Listen), ""})
	add(CheckFDs(pid, metrics.BrokerFDsNeeded(cfg.MaxHosts, cfg.MaxStreamsPerHost),
		fmt.Sprintf("max_hosts %d × (1 host socket + max_streams_per_host %d) + %d", cfg.MaxHosts, cfg.MaxStreamsPerHost, metrics.FDReserve)))
	return rs
}

// CheckFDs judges process pid's open descriptors against its soft
// RLIMIT_NOFILE: warn past metrics.FDWarnRatio, fail past FDFailRatio, and
// warn when the limit is below need (why says where need comes from).
func CheckFDs(pid, need int, why string) Result {
	open, soft, err := ProcFDs(pid)
	if err != nil {
		return Result{"broker fds", Warn, fmt.Sprintf("cannot read pid %d's descriptors (%v)", pid, err),
			"run doctor as root or as the broker's user"}
	}
	use := float64(open) / float64(soft)
	detail := fmt.Sprintf("%d of %d descriptors open (%.0f %% of the soft limit)", open, soft, 100*use)
	fix := "raise LimitNOFILE in the broker's unit (systemctl edit securelink-broker) or lower max_hosts, then restart it"
	switch {
	case use >= FDFailRatio:
		return Result{"broker fds", Fail, detail + "; new connections fail with EMFILE at the limit", fix}
	case use >= metrics.FDWarnRatio:
		return Result{"broker fds", Warn, detail, fix}
	case soft < need:
		return Result{"broker fds", Warn, fmt.Sprintf("%s; the soft limit is below the %d a full broker needs (%s)", detail, need, why), fix}
	}
	return Result{"broker fds", OK, detail, ""}
}

// ProcFDs counts process pid's open descriptors (/proc/PID/fd) and reads
// its soft RLIMIT_NOFILE (/proc/PID/limits), as the process itself sees
// them: under systemd that is the unit's LimitNOFILE, not this shell's.
func ProcFDs(pid int) (open, soft int, err error) {
	if open, err = metrics.OpenFDs(pid); err != nil {
		return 0, 0, err
	}
	b, err := readSmall(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, 0, err
	}
	soft, err = parseNOFILE(b)
	return open, soft, err
}

// parseNOFILE reads the soft limit of "Max open files" from the text of
// /proc/PID/limits; "unlimited" reads as the largest int32.
func parseNOFILE(b []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Max open files")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			break
		}
		if f[0] == "unlimited" {
			return 1<<31 - 1, nil
		}
		v, err := strconv.Atoi(f[0])
		if err != nil || v <= 0 {
			break
		}
		return v, nil
	}
	return 0, errors.New(`no "Max open files" soft limit in /proc/PID/limits`)
}

// listenerPID finds the process holding the TCP listener on addr (the
// broker's listen): the socket's inode from /proc/net/tcp{,6}, then the
// /proc/PID/fd entry that is that socket. An unspecified host (":9444")
// matches a listener on any address of that port.
func listenerPID(addr string) (int, error) {
	host, portS, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	port, err := strconv.ParseUint(portS, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("listen %q: bad port", addr)
	}
	var ip net.IP
	if host != "" {
		if ip = net.ParseIP(host); ip == nil {
			ips, err := net.LookupIP(host)
			if err != nil || len(ips) == 0 {
				return 0, fmt.Errorf("listen %q: %s does not resolve", addr, host)
			}
			ip = ips[0]
		}
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := readSmall(f)
		if err != nil {
			continue
		}
		for _, ino := range listenInodes(b, ip, uint16(port)) {
			inodes[ino] = true
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("nothing listens on %s: the broker is not running", addr)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue // another user's process
		}
		for _, fd := range fds {
			l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if err == nil && strings.HasPrefix(l, "socket:[") && inodes[strings.TrimSuffix(l[len("socket:["):], "]")] {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("something listens on %s, but its process is not visible to this user", addr)
}

// listenInodes returns the inodes of the LISTEN sockets (state 0A) on port
// in the text of /proc/net/tcp or tcp6, on ip (nil: any address). The
// addresses there are hex in host byte order, 32 bits at a time.
func listenInodes(b []byte, ip net.IP, port uint16) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 4096), 4096)
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[3] != "0A" {
			continue
		}
		a, p, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		lp, err := strconv.ParseUint(p, 16, 16)
		if err != nil || uint16(lp) != port {
			continue
		}
		if ip != nil {
			la := procAddr(a)
			if la == nil || !(la.Equal(ip) || la.IsUnspecified()) {
				continue
			}
		}
		out = append(out, f[9])
	}
	return out
}

// procAddr decodes an address of /proc/net/tcp{,6}: 8 or 32 hex digits,
// each 32-bit group little-endian.
func procAddr(h string) net.IP {
	if len(h) != 8 && len(h) != 32 {
		return nil
	}
	out := make(net.IP, len(h)/2)
	for g := 0; g < len(h)/8; g++ {
		v, err := strconv.ParseUint(h[8*g:8*g+8], 16, 32)
		if err != nil {
			return nil
		}
		out[4*g], out[4*g+1], out[4*g+2], out[4*g+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
	return out
}

// readSmall reads a /proc text file, at most 4 MiB (listeners come first
// in /proc/net/tcp, before the connections).
func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 4<<20))
}

package pinning

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// AuthorityFileName is the file in the state directory that remembers the
// detected advertise host.
const AuthorityFileName = "authority"

// maxAuthorityFile bounds the remembered-authority file; it holds one host.
const maxAuthorityFile = 4096

// Sources of a resolved authority.
const (
	SourceConfig     = "config"
	SourceRemembered = "remembered"
	SourceDetected   = "detected"
)

// AuthorityPath is where the detected host is remembered.
func AuthorityPath(stateDir string) string { return filepath.Join(stateDir, AuthorityFileName) }

// ResolveOptions says where the authority comes from.
type ResolveOptions struct {
	// StateDir holds the remembered authority; required unless Advertise is set.
	StateDir string
	// Advertise is the configured host (DNS name or IP); empty = detect once
	// and remember.
	Advertise string
	// Port is the advertised port (advertise_port, else the listen port).
	Port int
	// Detect finds a host when nothing is configured or remembered; nil =
	// SystemDetect.
	Detect func() (host string, warning string)
	// LocalAddrs lists the addresses this host has now, to notice that a
	// remembered address went away; nil = SystemLocalAddrs.
	LocalAddrs func() ([]netip.Addr, error)
}

// ResolvedAuthority is the authority with where it came from and what the
// operator should know about it.
type ResolvedAuthority struct {
	Authority Authority
	// Source is SourceConfig, SourceRemembered or SourceDetected.
	Source   string
	Warnings []string
	// Stale is true when the remembered host is an IP address no longer
	// assigned to this host: the front still starts (its identity has not
	// changed) but clients will not reach it, and doctor reports it.
	Stale bool
}

// ResolveAuthority decides the authority. Detection happens once: its result
// is remembered so that a later DHCP change cannot silently change the name
// the identity is issued for; the operator decides (advertise + rotate).
func ResolveAuthority(o ResolveOptions) (ResolvedAuthority, error) {
	if o.Port < 1 || o.Port > 65535 {
		return ResolvedAuthority{}, fmt.Errorf("advertised port %d is out of range 1-65535", o.Port)
	}
	if o.Advertise != "" {
		h, err := NormalizeHost(o.Advertise)
		if err != nil {
			return ResolvedAuthority{}, fmt.Errorf("advertise: %w", err)
		}
		return ResolvedAuthority{Authority: Authority{Host: h, Port: o.Port}, Source: SourceConfig}, nil
	}
	if o.StateDir == "" {
		return ResolvedAuthority{}, errors.New("no state directory to remember the detected authority in")
	}
	path := AuthorityPath(o.StateDir)
	host, err := readRemembered(path)
	switch {
	case err == nil:
		r := ResolvedAuthority{Authority: Authority{Host: host, Port: o.Port}, Source: SourceRemembered}
		r.Stale, r.Warnings = checkRemembered(host, path, o.LocalAddrs)
		return r, nil
	case !errors.Is(err, os.ErrNotExist):
		return ResolvedAuthority{}, err
	}

	detect := o.Detect
	if detect == nil {
		detect = SystemDetect
	}
	raw, warning := detect()
	host, err = NormalizeHost(raw)
	if err != nil {
		return ResolvedAuthority{}, fmt.Errorf("detected host: %w; set `advertise` in the configuration", err)
	}
	if err := atomicfile.MkdirPrivate(o.StateDir); err != nil {
		return ResolvedAuthority{}, err
	}
	if err := atomicfile.WriteFile(path, []byte(host+"\n"), 0o600); err != nil {
		return ResolvedAuthority{}, fmt.Errorf("remember authority in %s: %w", path, err)
	}
	r := ResolvedAuthority{Authority: Authority{Host: host, Port: o.Port}, Source: SourceDetected}
	if warning != "" {
		r.Warnings = append(r.Warnings, warning)
	}
	return r, nil
}

func readRemembered(path string) (string, error) {
	b, _, err := atomicfile.ReadPrivate(path, maxAuthorityFile, 0)
	if errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("%w; remove it to detect again, or set `advertise`", err)
	}
	host, err := NormalizeHost(strings.TrimSpace(string(b)))
	if err != nil {
		return "", fmt.Errorf("%s: %v; remove it to detect again, or set `advertise`", path, err)
	}
	return host, nil
}

func checkRemembered(host, path string, localAddrs func() ([]netip.Addr, error)) (stale bool, warnings []string) {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false, nil // a DNS name can follow the host; nothing to check locally
	}
	if a.IsLoopback() {
		warnings = append(warnings, fmt.Sprintf("the remembered authority %s (%s) is a loopback address that only this host can reach; "+
			"set `advertise` and run `securelink pin --rotate`", host, path))
	}
	if localAddrs == nil {
		localAddrs = SystemLocalAddrs
	}
	addrs, err := localAddrs()
	if err != nil {
		warnings = append(warnings, fmt.Sprintf("cannot list local addresses to check the remembered authority %s: %v", host, err))
		return false, warnings
	}
	for _, l := range addrs {
		if l.Unmap() == a {
			return false, warnings
		}
	}
	warnings = append(warnings, fmt.Sprintf("the remembered authority %s (%s) is no longer an address of this host, so paired clients "+
		"cannot reach it; set `advertise` to the address clients should use and run `securelink pin --rotate`, then re-pair", host, path))
	return true, warnings
}

package pinning

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type fakeDetector struct {
	host, warn string
	calls      int
}

func (d *fakeDetector) detect() (string, string) { d.calls++; return d.host, d.warn }

func addrs(ss ...string) func() ([]netip.Addr, error) {
	return func() ([]netip.Addr, error) {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out, nil
	}
}

func TestResolveAuthorityRemembersFirstDetection(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	d := &fakeDetector{host: "192.168.1.20"}
	o := ResolveOptions{StateDir: dir, Port: 9443, Detect: d.detect, LocalAddrs: addrs("127.0.0.1", "192.168.1.20")}

	r, err := ResolveAuthority(o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Source != SourceDetected || r.Authority != (Authority{"192.168.1.20", 9443}) || r.Stale {
		t.Fatalf("first resolve = %+v", r)
	}
	fi, err := os.Stat(AuthorityPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("authority file mode %04o, want 0600", fi.Mode().Perm())
	}
	if di, _ := os.Stat(dir); di.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode %04o, want 0700", di.Mode().Perm())
	}
	if b, _ := os.ReadFile(AuthorityPath(dir)); string(b) != "192.168.1.20\n" {
		t.Errorf("authority file holds %q", b)
	}

	// DHCP moved the host; the remembered authority still wins, and is stale.
	d.host = "192.168.1.77"
	o.LocalAddrs = addrs("127.0.0.1", "192.168.1.77")
	r, err = ResolveAuthority(o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Source != SourceRemembered || r.Authority.Host != "192.168.1.20" {
		t.Fatalf("second resolve = %+v", r)
	}
	if !r.Stale || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "pin --rotate") {
		t.Fatalf("want a stale warning naming the fix, got %+v", r)
	}
	if d.calls != 1 {
		t.Errorf("detector called %d times, want 1", d.calls)
	}

	// Address back: not stale.
	o.LocalAddrs = addrs("::ffff:192.168.1.20")
	if r, err = ResolveAuthority(o); err != nil || r.Stale || len(r.Warnings) != 0 {
		t.Fatalf("resolve with the address back = %+v, %v", r, err)
	}
}

func TestResolveAuthorityExplicitAdvertiseWins(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	d := &fakeDetector{host: "192.168.1.20"}
	r, err := ResolveAuthority(ResolveOptions{StateDir: dir, Advertise: "Hermes.Example.", Port: 443, Detect: d.detect})
	if err != nil {
		t.Fatal(err)
	}
	if r.Source != SourceConfig || r.Authority != (Authority{"hermes.example", 443}) {
		t.Fatalf("got %+v", r)
	}
	if d.calls != 0 {
		t.Error("detector ran although advertise is set")
	}
	if _, err := os.Stat(AuthorityPath(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an explicit advertise must not be remembered: %v", err)
	}
	if _, err := ResolveAuthority(ResolveOptions{StateDir: dir, Advertise: "host:1", Port: 443}); err == nil {
		t.Error("advertise with a port accepted")
	}
}

func TestResolveAuthorityLoopbackFallbackWarns(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	d := &fakeDetector{host: "127.0.0.1", warn: "only loopback"}
	o := ResolveOptions{StateDir: dir, Port: 9443, Detect: d.detect, LocalAddrs: addrs("127.0.0.1")}
	r, err := ResolveAuthority(o)
	if err != nil || r.Authority.Host != "127.0.0.1" || len(r.Warnings) != 1 {
		t.Fatalf("got %+v, %v", r, err)
	}
	r, err = ResolveAuthority(o)
	if err != nil || r.Source != SourceRemembered || r.Stale || len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "loopback") {
		t.Fatalf("remembered loopback: %+v, %v", r, err)
	}
}

func TestResolveAuthorityRejectsBadInput(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if _, err := ResolveAuthority(ResolveOptions{StateDir: dir, Port: 0}); err == nil {
		t.Error("port 0 accepted")
	}
	if _, err := ResolveAuthority(ResolveOptions{Port: 1, Detect: (&fakeDetector{host: "10.0.0.1"}).detect}); err == nil {
		t.Error("no state dir accepted")
	}
	if _, err := ResolveAuthority(ResolveOptions{StateDir: dir, Port: 1, Detect: (&fakeDetector{host: "fe80::1%eth0"}).detect}); err == nil {
		t.Error("unusable detected host accepted")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(AuthorityPath(dir), []byte("not a host!\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ResolveAuthority(ResolveOptions{StateDir: dir, Port: 1, Detect: (&fakeDetector{host: "10.0.0.1"}).detect})
	if err == nil || !strings.Contains(err.Error(), AuthorityPath(dir)) {
		t.Errorf("garbage authority file: %v", err)
	}
}

func TestResolveAuthorityRememberedDNSNameIsNotChecked(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(AuthorityPath(dir), []byte("  Hermes.LAN.\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := ResolveAuthority(ResolveOptions{StateDir: dir, Port: 9443, LocalAddrs: addrs()})
	if err != nil || r.Authority.Host != "hermes.lan" || r.Stale || r.Source != SourceRemembered {
		t.Fatalf("got %+v, %v", r, err)
	}
}

package doctor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/acme/acmetest"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/pinning"
)

// acmeInstall is an acme-mode configuration for front.acme.test against tc
// with the identity key created; no daemon runs.
func acmeInstall(t *testing.T, tc *acmetest.CA, httpPort int) (*config.Env, *pinning.Identity, pinning.Authority) {
	t.Helper()
	dir := t.TempDir()
	c, err := config.Parse("test.yaml", []byte(fmt.Sprintf("listen: \"127.0.0.1:9443\"\nadvertise: front.acme.test\nstate_dir: %q\ntls:\n  mode: acme\n  acme:\n    ca: %q\n    ca_root_file: %q\n    challenge: http-01\n    http_port: %d\n",
		filepath.Join(dir, "state"), tc.DirURL, tc.RootFile, httpPort)))
	if err != nil {
		t.Fatal(err)
	}
	e := &config.Env{Cfg: c, StateDir: filepath.Join(dir, "state")}
	a := pinning.Authority{Host: "front.acme.test", Port: 9443}
	id, err := pinning.LoadOrCreate(e.IdentityConfig(a))
	if err != nil {
		t.Fatal(err)
	}
	return e, id, a
}

// obtain gets a certificate into e's storage as the daemon would.
func obtain(t *testing.T, e *config.Env, a pinning.Authority, id *pinning.Identity) {
	t.Helper()
	o := e.ACMEOptions(a, id.Signer())
	o.Logger = zerolog.Nop()
	m, err := acme.New(o)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for m.Status().State != acme.StateValid {
		if time.Now().After(deadline) {
			t.Fatalf("no certificate: %+v", m.Status().CertStatus)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Without a certificate doctor fails and says what the challenge needs;
// the solver port is checked (in use fails); a certificate within 7 days of
// expiry fails, one further out passes; a stored certificate for another
// key is reported as a rotation.
func TestDoctorACME(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{Validity: 3 * 24 * 3600})
	busy, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	e, id, a := acmeInstall(t, tc, busy.Addr().(*net.TCPAddr).Port)
	rs := Run(context.Background(), e.Cfg, nil, e.StateDir, Options{Timeout: time.Second})
	if r := find(t, rs, "acme certificate"); r.Status != Fail || !strings.Contains(r.Detail, "no certificate yet") || !strings.Contains(r.Fix, "port 80") {
		t.Fatalf("without a certificate: %+v", r)
	}
	if r := find(t, rs, "acme challenge"); r.Status != Fail || !strings.Contains(r.Detail, "in use") {
		t.Fatalf("solver port in use: %+v", r)
	}
	if r := find(t, rs, "identity"); r.Status != OK || !strings.Contains(r.Detail, id.Pin) {
		t.Fatalf("identity: %+v", r)
	}
	if r := find(t, rs, "clients"); r.Status != OK {
		t.Fatalf("acme mode still has client notes: %+v", r)
	}

	e, id, a = acmeInstall(t, tc, tc.HTTPPort)
	obtain(t, e, a, id) // 3-day certificate
	rs = Run(context.Background(), e.Cfg, nil, e.StateDir, Options{Timeout: time.Second})
	if r := find(t, rs, "acme certificate"); r.Status != Fail || !strings.Contains(r.Detail, "within 7 days") {
		t.Fatalf("3 days to expiry: %+v", r)
	}
	if r := find(t, rs, "acme challenge"); r.Status != OK {
		t.Fatalf("free solver port: %+v", r)
	}
	rs = Run(context.Background(), e.Cfg, nil, e.StateDir, Options{Timeout: time.Second, Now: func() time.Time { return time.Now().Add(-30 * 24 * time.Hour) }})
	if r := find(t, rs, "acme certificate"); r.Status != OK || !strings.Contains(r.Detail, "renewal from") {
		t.Fatalf("a month to expiry: %+v", r)
	}
	// The key replaced under the stored certificate: a rotation.
	if err := os.Remove(pinning.IdentityPath(e.StateDir)); err != nil {
		t.Fatal(err)
	}
	if _, err := pinning.LoadOrCreate(e.IdentityConfig(a)); err != nil {
		t.Fatal(err)
	}
	rs = Run(context.Background(), e.Cfg, nil, e.StateDir, Options{Timeout: time.Second})
	if r := find(t, rs, "acme rotation"); r.Status != Warn || !strings.Contains(r.Detail, "every paired client must re-pair") || !strings.Contains(r.Detail, id.Pin) {
		t.Fatalf("rotation: %+v", r)
	}
}

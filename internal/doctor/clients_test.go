package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hermes-securelink/securelink/pinning/pinningtest"
)

// results lists every result of check.
func results(rs []Result, check string) []Result {
	var out []Result
	for _, r := range rs {
		if r.Check == check {
			out = append(out, r)
		}
	}
	return out
}

func joined(rs []Result) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(r.Detail + " | fix: " + r.Fix + "\n")
	}
	return b.String()
}

// What doctor tells the operator per shipped client (pairing.md "What the
// shipped clients accept"); warnings, never failures.
func TestDoctorClientNotes(t *testing.T) {
	t.Run("IPv4 self-signed", func(t *testing.T) {
		rs := newFixture(t).run(t)
		desktop, android := joined(results(rs, "client desktop")), joined(results(rs, "client android"))
		if !strings.Contains(desktop, "127.0.0.1 is an IP address") || !strings.Contains(desktop, "advertise: <DNS name>") {
			t.Errorf("desktop:\n%s", desktop)
		}
		if !strings.Contains(android, "self-signed") || !strings.Contains(android, "tls.mode: acme") || strings.Contains(android, "IPv6") {
			t.Errorf("android:\n%s", android)
		}
		if len(results(rs, "identity profile")) != 0 {
			t.Errorf("a new identity has a profile warning:\n%s", Format(rs))
		}
		for _, r := range append(results(rs, "client desktop"), results(rs, "client android")...) {
			if r.Status != Warn {
				t.Errorf("client note is %s, want warn: %+v", r.Status, r)
			}
		}
		if Failed(rs) {
			t.Errorf("client notes made doctor fail:\n%s", Format(rs))
		}
	})
	t.Run("IPv6", func(t *testing.T) {
		android := joined(results(newFixtureFor(t, "2001:db8::1", nil).run(t), "client android"))
		if !strings.Contains(android, "IPv6") || !strings.Contains(android, "advertise: <DNS name>") {
			t.Errorf("android:\n%s", android)
		}
	})
	t.Run("DNS name self-signed", func(t *testing.T) {
		rs := newFixtureFor(t, "hermes.example", nil).run(t)
		if d := results(rs, "client desktop"); len(d) != 0 {
			t.Errorf("desktop note for a DNS authority:\n%s", joined(d))
		}
		if a := joined(results(rs, "client android")); !strings.Contains(a, "self-signed") {
			t.Errorf("android:\n%s", a)
		}
	})
	t.Run("Reach", func(t *testing.T) {
		f := newFixtureFor(t, "hermes.example", nil)
		brokerFixture(t, f, `{"ok":true,"service":"hermes_reach","protocol_version":1}`)
		if a := joined(results(f.run(t), "client android")); !strings.Contains(a, "serves the desktop client, not the Android app") {
			t.Errorf("android:\n%s", a)
		}
	})
	t.Run("CA-issued certificate for a DNS name", func(t *testing.T) {
		f := newFixtureFor(t, "hermes.example", nil)
		f.cfg.TLS.Mode = "files"
		f.cfg.TLS.CertFile, f.cfg.TLS.KeyFile = writeIssuedCert(t, t.TempDir(), "hermes.example")
		rs := f.run(t)
		if r := find(t, rs, "clients"); r.Status != OK {
			t.Errorf("clients: %+v\n%s", r, Format(rs))
		}
	})
}

// An identity of the older profile (keyUsage digitalSignature) is named,
// with the fix: rotate, then re-pair.
func TestDoctorNamesTheOldIdentityProfile(t *testing.T) {
	legacy, err := pinningtest.LegacyIdentityPEM("hermes.example")
	if err != nil {
		t.Fatal(err)
	}
	rs := newFixtureFor(t, "hermes.example", legacy).run(t)
	p := results(rs, "identity profile")
	if len(p) != 1 || p[0].Status != Warn || !strings.Contains(p[0].Detail, "keyUsage") ||
		!strings.Contains(p[0].Fix, "securelink pin --rotate --yes") || !strings.Contains(p[0].Fix, "re-pair") {
		t.Fatalf("identity profile:\n%s", Format(rs))
	}
	if !strings.Contains(Format(rs), "fix: run `securelink pin --rotate --yes`") {
		t.Fatalf("the fix is not printed:\n%s", Format(rs))
	}
}

// writeIssuedCert writes a leaf for name issued by a throwaway CA (so not
// self-signed), in files mode's cert and key files.
func writeIssuedCert(t *testing.T, dir, name string) (string, string) {
	t.Helper()
	_, certPEM, keyPEM, err := pinningtest.IssuedPEM(name)
	if err != nil {
		t.Fatal(err)
	}
	cf, kf := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(cf, certPEM, 0o644)
	os.WriteFile(kf, keyPEM, 0o600)
	return cf, kf
}

package acme

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/acme/acmetest"
	"github.com/hermes-securelink/securelink/pinning"
)

type syncBuffer = acmetest.SyncBuffer

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keyPin(t *testing.T, k *ecdsa.PrivateKey) string {
	t.Helper()
	spki, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return pinning.SPKIPin(&x509.Certificate{RawSubjectPublicKeyInfo: spki})
}

// baseOptions is an HTTP-01 manager against tc with a fresh storage dir.
func baseOptions(t *testing.T, tc *acmetest.CA, key *ecdsa.PrivateKey, logs *syncBuffer, names ...string) Options {
	t.Helper()
	if len(names) == 0 {
		names = []string{"front.acme.test"}
	}
	lw := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	if logs != nil {
		lw = zerolog.New(zerolog.MultiLevelWriter(zerolog.NewTestWriter(t), logs)).Level(zerolog.DebugLevel)
	}
	return Options{
		Names:       names,
		Key:         key,
		StorageDir:  filepath.Join(t.TempDir(), "acme"),
		CA:          tc.DirURL,
		CARootFile:  tc.RootFile,
		Challenge:   ChallengeHTTP01,
		ListenHost:  "127.0.0.1",
		HTTPPort:    tc.HTTPPort,
		TLSALPNPort: tc.TLSPort,
		Logger:      lw,
	}
}

func startManager(t *testing.T, o Options) *Manager {
	t.Helper()
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// waitFor polls cond (bounded) and fails with the last status.
func waitFor(t *testing.T, m *Manager, what string, cond func(Status) bool) Status {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := m.Status()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; status: state=%s problem=%s err=%q", what, st.State, st.Problem, st.LastError)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// serveFront is a TLS listener that gets its certificate from m, as the
// front does.
func serveFront(t *testing.T, m *Manager) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: m.GetCertificate, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Write([]byte("ok"))
			}()
		}
	}()
	return l.Addr().String()
}

// dialPinned connects as a paired client: the chain must verify against the
// test CA's root, and VerifyConnection checks the leaf pin.
func dialPinned(addr, name string, roots *x509.CertPool, pin string) (*x509.Certificate, [][]byte, error) {
	var leaf *x509.Certificate
	var chain [][]byte
	cfg := &tls.Config{
		ServerName: name,
		RootCAs:    roots,
		MinVersion: tls.VersionTLS12,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no certificate")
			}
			if got := pinning.SPKIPin(cs.PeerCertificates[0]); got != pin {
				return fmt.Errorf("pin %s, want %s", got, pin)
			}
			leaf = cs.PeerCertificates[0]
			for _, c := range cs.PeerCertificates {
				chain = append(chain, c.Raw)
			}
			return nil
		},
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil {
		return nil, nil, err
	}
	return leaf, chain, nil
}

// checkServed asserts the served chain: verifies to Pebble's root, carries
// the identity pin, has intermediates but no root, and is what Status says.
func checkServed(t *testing.T, addr, name string, tc *acmetest.CA, m *Manager, st Status) *x509.Certificate {
	t.Helper()
	leaf, chain, err := dialPinned(addr, name, tc.Roots, m.Pin())
	if err != nil {
		t.Fatalf("pinned client: %v", err)
	}
	if len(chain) < 2 {
		t.Fatalf("served %d certificates, want leaf + intermediates", len(chain))
	}
	last, err := x509.ParseCertificate(chain[len(chain)-1])
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(last.RawIssuer, last.RawSubject) {
		t.Fatal("the served chain includes the root")
	}
	var cs *CertStatus
	for i := range st.Certificates {
		if st.Certificates[i].Name == name {
			cs = &st.Certificates[i]
		}
	}
	if cs == nil || !bytes.Equal(cs.CertDER, leaf.Raw) {
		t.Fatal("Status.CertDER is not the served leaf")
	}
	return leaf
}

// checkStorageModes asserts the storage is 0700 directories and 0600 files.
func checkStorageModes(t *testing.T, dir string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s has mode %04o, want %04o", p, fi.Mode().Perm(), want)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 3 {
		t.Fatalf("storage holds %d entries; expected account and certificate files", n)
	}
}

func valid(st Status) bool { return st.State == StateValid }

func TestObtainHTTP01(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{})
	key := newKey(t)
	logs := &syncBuffer{}
	o := baseOptions(t, tc, key, logs, "front.acme.test", "alt.acme.test")
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	addr := serveFront(t, m)

	// Before the first certificate: status says so, handshakes fail.
	if st := m.Status(); st.State != StateWaiting || st.Pin != keyPin(t, key) {
		t.Fatalf("before start: state %s pin %s", st.State, st.Pin)
	}
	if _, _, err := dialPinned(addr, "front.acme.test", tc.Roots, m.Pin()); err == nil {
		t.Fatal("handshake succeeded before any certificate exists")
	}

	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := waitFor(t, m, "both certificates", func(st Status) bool {
		return st.Certificates[0].State == StateValid && st.Certificates[1].State == StateValid
	})
	for _, name := range []string{"front.acme.test", "alt.acme.test"} {
		leaf := checkServed(t, addr, name, tc, m, st)
		if !pinning.CoversHost(leaf, name) {
			t.Errorf("leaf for %s does not cover it: %v", name, leaf.DNSNames)
		}
	}
	if st.Issuer == "" || st.Serial == "" || time.Until(st.NotAfter) < time.Hour {
		t.Fatalf("status lacks issuer/serial/expiry: %+v", st.CertStatus)
	}
	if !st.NextRenewal.After(st.NotBefore) || !st.NextRenewal.Before(st.NotAfter) {
		t.Fatalf("next renewal %v outside validity %v..%v", st.NextRenewal, st.NotBefore, st.NotAfter)
	}
	if st.Installed != 2 || st.KeyChange != nil {
		t.Fatalf("installed %d, key change %v", st.Installed, st.KeyChange)
	}
	// Empty SNI (IP-literal clients) gets the authority's certificate.
	c, err := m.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || !bytes.Equal(c.Leaf.Raw, st.CertDER) {
		t.Fatalf("empty SNI: %v", err)
	}
	checkStorageModes(t, o.StorageDir)
	if !strings.Contains(logs.String(), `"component":"certmagic"`) {
		t.Error("certmagic's records did not reach the zerolog logger")
	}
}

func TestObtainTLSALPN01(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{})
	key := newKey(t)
	o := baseOptions(t, tc, key, nil)
	o.Challenge = ChallengeTLSALPN01
	o.HTTPPort = acmetest.FreePort(t) // nothing the CA dials: only TLS-ALPN-01 can succeed
	m := startManager(t, o)
	st := waitFor(t, m, "certificate", valid)
	checkServed(t, serveFront(t, m), "front.acme.test", tc, m, st)
}

func TestRenewalKeepsPin(t *testing.T) {
	// 60 s certificates renewed once 95% of the lifetime remains: certmagic's
	// own maintenance renews about 3 s after each issuance.
	tc := acmetest.StartCA(t, acmetest.Options{Validity: 60})
	key := newKey(t)
	o := baseOptions(t, tc, key, nil)
	o.RenewalWindowRatio = 0.95
	o.RenewCheckInterval = 250 * time.Millisecond
	var mu sync.Mutex
	var installs []Event
	o.OnEvent = func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Kind == EventInstalled {
			installs = append(installs, e)
		}
	}
	m := startManager(t, o)
	addr := serveFront(t, m)
	first := waitFor(t, m, "first certificate", valid)
	before := checkServed(t, addr, "front.acme.test", tc, m, first)

	renewed := waitFor(t, m, "a renewal", func(st Status) bool {
		return st.Installed >= 2 && st.State == StateValid && st.Serial != first.Serial
	})
	after := checkServed(t, addr, "front.acme.test", tc, m, renewed)
	if before.SerialNumber.Cmp(after.SerialNumber) == 0 {
		t.Fatal("the served leaf did not change")
	}
	if pinning.SPKIPin(before) != pinning.SPKIPin(after) || pinning.SPKIPin(after) != keyPin(t, key) {
		t.Fatal("the pin changed at renewal")
	}
	m.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(installs) < 2 {
		t.Fatalf("%d install events, want at least 2", len(installs))
	}
	for _, e := range installs {
		if e.Status.Pin != keyPin(t, key) || e.Status.KeyChange != nil {
			t.Fatalf("install event with pin %s key change %v", e.Status.Pin, e.Status.KeyChange)
		}
	}
}

func TestKeyChangeIsReportedAsRotation(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{})
	oldKey, newKeyB := newKey(t), newKey(t)
	o := baseOptions(t, tc, oldKey, nil)
	m1 := startManager(t, o)
	waitFor(t, m1, "certificate for the old key", valid)
	m1.Close()

	// Same storage, another identity key (the operator replaced it).
	o.Key = newKeyB
	var mu sync.Mutex
	var kinds []EventKind
	o.OnEvent = func(e Event) {
		mu.Lock()
		kinds = append(kinds, e.Kind)
		mu.Unlock()
	}
	m2 := startManager(t, o)
	st := m2.Status()
	if st.KeyChange == nil || st.KeyChange.OldPin != keyPin(t, oldKey) || st.KeyChange.NewPin != keyPin(t, newKeyB) {
		t.Fatalf("no rotation reported: %+v", st.KeyChange)
	}
	// The old key's certificate is never served, not even before the new one.
	if c, err := m2.GetCertificate(&tls.ClientHelloInfo{ServerName: "front.acme.test"}); err == nil &&
		pinning.SPKIPin(c.Leaf) != keyPin(t, newKeyB) {
		t.Fatal("served the old key's certificate after the key changed")
	}
	st = waitFor(t, m2, "certificate for the new key", valid)
	leaf := checkServed(t, serveFront(t, m2), "front.acme.test", tc, m2, st)
	if pinning.SPKIPin(leaf) != keyPin(t, newKeyB) || st.KeyChange == nil {
		t.Fatal("new certificate not for the new key, or the rotation was forgotten")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(kinds) == 0 || kinds[0] != EventKeyChanged {
		t.Fatalf("events %v, want key_changed first", kinds)
	}
}

func TestUnreachableChallengePortIsReported(t *testing.T) {
	tc := acmetest.StartCA(t, acmetest.Options{})
	o := baseOptions(t, tc, newKey(t), nil)
	o.HTTPPort = acmetest.FreePort(t) // the solver listens where the CA does not look
	m := startManager(t, o)
	addr := serveFront(t, m)
	st := waitFor(t, m, "a failed attempt", func(st Status) bool { return st.Failures > 0 && !st.NextAttempt.IsZero() })
	if st.State != StateWaiting || st.Problem != ProblemPortUnreachable || st.LastError == "" {
		t.Fatalf("state %s problem %q error %q", st.State, st.Problem, st.LastError)
	}
	if wait := time.Until(st.NextAttempt); wait < 30*time.Second || wait > 2*time.Minute {
		t.Fatalf("next attempt in %v, want certmagic's first retry (1 min)", wait)
	}
	if _, _, err := dialPinned(addr, "front.acme.test", tc.Roots, m.Pin()); err == nil ||
		!strings.Contains(err.Error(), "remote error: tls: internal error") {
		t.Fatalf("handshake without a certificate: %v, want the internal_error alert", err)
	}
}

// The manager applies the tls.acme block's own rules (Settings.Check), so it
// cannot accept what the configuration refuses: a plain-http CA (account key
// and orders in the clear) passed its second set of checks before.
func TestManagerRefusesWhatTheConfigurationRefuses(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	base := Options{Names: []string{"front.acme.test"}, Key: key, StorageDir: filepath.Join(t.TempDir(), "acme"),
		Challenge: ChallengeHTTP01, ListenHost: "127.0.0.1"}
	for name, c := range map[string]struct {
		edit func(*Options)
		want string
	}{
		"plain http CA":           {func(o *Options) { o.CA = "http://127.0.0.1:14000/dir" }, "tls.acme.ca"},
		"no challenge":            {func(o *Options) { o.Challenge = "" }, "tls.acme.challenge"},
		"dns-01 without provider": {func(o *Options) { o.Challenge = ChallengeDNS01 }, "tls.acme.dns_provider"},
		"port out of range":       {func(o *Options) { o.HTTPPort = 70000 }, "tls.acme.http_port"},
	} {
		o := base
		c.edit(&o)
		if _, err := New(o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", name, err, c.want)
		}
	}
}

package pinning

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var pinRE = regexp.MustCompile(`^sha256/[A-Za-z0-9+/]{43}=$`)

func selfSignedConfig(t *testing.T, host string, extra ...string) IdentityConfig {
	t.Helper()
	return IdentityConfig{
		StateDir:   filepath.Join(t.TempDir(), "state"),
		Authority:  Authority{Host: host, Port: 9443},
		ExtraNames: extra,
	}
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestCreateLoadRoundTrip(t *testing.T) {
	c := selfSignedConfig(t, "192.0.2.1", "Hermes.Example.", "2001:db8::1")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c.Now = func() time.Time { return now }
	if _, err := Load(c); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("Load before creation: %v, want ErrNoIdentity", err)
	}
	created, err := LoadOrCreate(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := mode(t, c.StateDir); got != 0o700 {
		t.Errorf("state dir mode %04o", got)
	}
	if got := mode(t, IdentityPath(c.StateDir)); got != 0o600 {
		t.Errorf("identity file mode %04o", got)
	}
	loaded, err := Load(c)
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadOrCreate(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []*Identity{loaded, again} {
		if id.Pin != created.Pin || !bytes.Equal(id.CertDER, created.CertDER) || !id.ChangedAt.Equal(created.ChangedAt) {
			t.Fatalf("reload differs: %s vs %s", id.Pin, created.Pin)
		}
	}
	if !pinRE.MatchString(created.Pin) || len(created.Pin) != len("sha256/")+44 {
		t.Errorf("pin %q has the wrong format", created.Pin)
	}
	if created.Source != IdentityPath(c.StateDir) || created.KeyType != KeyECDSAP256 || len(created.Warnings) != 0 {
		t.Errorf("identity = source %q key %q warnings %v", created.Source, created.KeyType, created.Warnings)
	}
	if created.Certificate.Leaf != created.Leaf || len(created.Certificate.Certificate) != 1 {
		t.Error("tls.Certificate is not ready to serve")
	}

	leaf := created.Leaf
	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Errorf("key is %T, want ECDSA P-256", leaf.PublicKey)
	}
	if !slices.Equal(leaf.DNSNames, []string{"hermes.example"}) || len(leaf.IPAddresses) != 2 ||
		!leaf.IPAddresses[0].Equal(net.ParseIP("192.0.2.1")) || !leaf.IPAddresses[1].Equal(net.ParseIP("2001:db8::1")) {
		t.Errorf("SANs = %v %v", leaf.DNSNames, leaf.IPAddresses)
	}
	if leaf.Subject.String() != "CN=192.0.2.1" {
		t.Errorf("subject %q", leaf.Subject)
	}
	if leaf.NotAfter.Sub(now) < 3650*24*time.Hour || leaf.NotAfter.Sub(now) > 3654*24*time.Hour || leaf.NotBefore.After(now) {
		t.Errorf("validity %v - %v", leaf.NotBefore, leaf.NotAfter)
	}
	if leaf.IsCA || leaf.BasicConstraintsValid || leaf.SerialNumber.Sign() <= 0 || leaf.SerialNumber.BitLen() < 64 {
		t.Errorf("IsCA %v basicConstraints %v serial %v", leaf.IsCA, leaf.BasicConstraintsValid, leaf.SerialNumber)
	}
	// The profile of secure-link.md: subjectAltName and extKeyUsage
	// serverAuth only — no keyUsage (Bun refuses a self-signed anchor with
	// keyUsage digitalSignature) and no basicConstraints.
	if got := extensionOIDs(leaf); !slices.Equal(got, []string{"2.5.29.17", "2.5.29.37"}) {
		t.Errorf("extensions %v, want exactly subjectAltName and extKeyUsage", got)
	}
	if leaf.KeyUsage != 0 || !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) || len(leaf.UnknownExtKeyUsage) != 0 {
		t.Errorf("keyUsage %v extKeyUsage %v %v", leaf.KeyUsage, leaf.ExtKeyUsage, leaf.UnknownExtKeyUsage)
	}
	if p := ProfileProblem(leaf); p != "" || !SelfSigned(leaf) {
		t.Errorf("a new identity has a profile problem %q (self-signed %v)", p, SelfSigned(leaf))
	}
	if len(created.CertDER) > 600 {
		t.Errorf("certificate DER is %d bytes; the default identity must stay small", len(created.CertDER))
	}

	// Another identity in another state dir has another key and serial.
	other, err := LoadOrCreate(selfSignedConfig(t, "192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	if other.Pin == created.Pin || other.Leaf.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
		t.Error("two identities share a pin or a serial")
	}
}

func TestRSAIdentityAndKeyTypeWarning(t *testing.T) {
	c := selfSignedConfig(t, "hermes.example")
	c.KeyType = KeyRSA3072
	id, err := LoadOrCreate(c)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := id.Leaf.PublicKey.(*rsa.PublicKey); !ok || k.N.BitLen() != 3072 || id.KeyType != KeyRSA3072 {
		t.Fatalf("key %T %s", id.Leaf.PublicKey, id.KeyType)
	}
	c.KeyType = ""
	id, err = Load(c)
	if err != nil {
		t.Fatal(err)
	}
	if id.KeyType != KeyRSA3072 || len(id.Warnings) != 1 || !strings.Contains(id.Warnings[0], "pin --rotate") {
		t.Errorf("changing key_type must not rotate, only warn: %s %v", id.KeyType, id.Warnings)
	}
}

func TestSelfSignedPermissionsRefused(t *testing.T) {
	c := selfSignedConfig(t, "192.0.2.1")
	if _, err := LoadOrCreate(c); err != nil {
		t.Fatal(err)
	}
	path := IdentityPath(c.StateDir)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []func(IdentityConfig) (*Identity, error){Load, LoadOrCreate} {
		_, err := f(c)
		if err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
			t.Errorf("0644 identity: %v", err)
		}
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(c.StateDir, 0o750); err != nil {
		t.Fatal(err)
	}
	for _, f := range []func(IdentityConfig) (*Identity, error){Load, LoadOrCreate} {
		_, err := f(c)
		if err == nil || !strings.Contains(err.Error(), "chmod 700 "+c.StateDir) {
			t.Errorf("0750 state dir: %v", err)
		}
	}
	if err := os.Chmod(c.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(c); err != nil {
		t.Errorf("after the fixes: %v", err)
	}
}

// writePEM writes blocks into path at perm.
func writePEM(t *testing.T, path string, perm os.FileMode, blocks ...*pem.Block) {
	t.Helper()
	var buf bytes.Buffer
	for _, b := range blocks {
		if err := pem.Encode(&buf, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, buf.Bytes(), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}

// pemBlocks splits an identity file into its certificate and key blocks.
func pemBlocks(t *testing.T, stateDir string) (cert, key *pem.Block) {
	t.Helper()
	data, err := os.ReadFile(IdentityPath(stateDir))
	if err != nil {
		t.Fatal(err)
	}
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			cert = b
		} else {
			key = b
		}
	}
	if cert == nil || key == nil {
		t.Fatal("identity file lacks a block")
	}
	return cert, key
}

func TestSelfSignedKeyCertMismatchRefused(t *testing.T) {
	a := selfSignedConfig(t, "192.0.2.1")
	b := selfSignedConfig(t, "192.0.2.1")
	for _, c := range []IdentityConfig{a, b} {
		if _, err := LoadOrCreate(c); err != nil {
			t.Fatal(err)
		}
	}
	certA, _ := pemBlocks(t, a.StateDir)
	_, keyB := pemBlocks(t, b.StateDir)
	writePEM(t, IdentityPath(a.StateDir), 0o600, certA, keyB)
	_, err := Load(a)
	if err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatched key accepted: %v", err)
	}
	if _, err := LoadOrCreate(a); err == nil {
		t.Fatal("LoadOrCreate replaced or accepted a broken identity")
	}
}

func TestSANChecks(t *testing.T) {
	c := selfSignedConfig(t, "192.0.2.1", "hermes.example", "2001:db8::1")
	if _, err := LoadOrCreate(c); err != nil {
		t.Fatal(err)
	}
	good := []IdentityConfig{c, c, c}
	good[1].Authority.Host = "::ffff:192.0.2.1"
	good[1].ExtraNames = []string{"HERMES.example.", "2001:0db8:0:0::1"}
	good[2].Authority.Host = "hermes.example"
	good[2].ExtraNames = nil
	for _, g := range good {
		if _, err := Load(g); err != nil {
			t.Errorf("Load(%s %v): %v", g.Authority.Host, g.ExtraNames, err)
		}
	}
	bad := []IdentityConfig{c, c, c, c}
	bad[0].Authority.Host = "192.0.2.10"
	bad[1].ExtraNames = []string{"other.example"}
	bad[2].ExtraNames = []string{"2001:db8::10"}
	bad[3].Authority.Host = "ermes.example"
	for _, b := range bad {
		for _, f := range []func(IdentityConfig) (*Identity, error){Load, LoadOrCreate} {
			_, err := f(b)
			if !errors.Is(err, ErrSANMismatch) || !strings.Contains(err.Error(), "securelink pin --rotate") {
				t.Errorf("authority %s extra %v: %v", b.Authority.Host, b.ExtraNames, err)
			}
		}
	}
	// Nothing rotated implicitly.
	id, err := Load(c)
	if err != nil {
		t.Fatal(err)
	}
	if bk, _ := Backups(c.StateDir); len(bk) != 0 || !CoversHost(id.Leaf, "192.0.2.1") || CoversHost(id.Leaf, "192.0.2.10") {
		t.Error("identity changed after SAN mismatches")
	}
	// Display-only load.
	skip := bad[0]
	skip.SkipNameCheck = true
	if got, err := Load(skip); err != nil || got.Pin != id.Pin {
		t.Errorf("SkipNameCheck load: %v", err)
	}
}

func TestRotateKeepsThreeBackups(t *testing.T) {
	c := selfSignedConfig(t, "192.0.2.1")
	fixed := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c.Now = func() time.Time { return fixed } // every rotation in the same clock tick
	first, err := LoadOrCreate(c)
	if err != nil {
		t.Fatal(err)
	}
	pins := []string{first.Pin}
	for i := 0; i < 5; i++ {
		id, err := Rotate(c)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(pins, id.Pin) {
			t.Fatalf("rotation %d kept a previous pin", i)
		}
		pins = append(pins, id.Pin)
		loaded, err := Load(c)
		if err != nil || loaded.Pin != id.Pin {
			t.Fatalf("load after rotation %d: %v", i, err)
		}
	}
	backups, err := Backups(c.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(backups) != KeepBackups {
		t.Fatalf("%d backups, want %d: %v", len(backups), KeepBackups, backups)
	}
	if got := mode(t, BackupDir(c.StateDir)); got != 0o700 {
		t.Errorf("backup dir mode %04o", got)
	}
	// The backups are the three identities replaced last, oldest first.
	for i, b := range backups {
		if got := mode(t, b); got != 0o600 {
			t.Errorf("%s mode %04o", b, got)
		}
		data, err := os.ReadFile(b)
		if err != nil {
			t.Fatal(err)
		}
		certDER, _, err := parseIdentityPEM(data)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(certDER)
		if err != nil {
			t.Fatal(err)
		}
		if want := pins[len(pins)-1-KeepBackups+i]; SPKIPin(cert) != want {
			t.Errorf("backup %d holds %s, want %s", i, SPKIPin(cert), want)
		}
	}
}

func TestRotateWithoutIdentityAndInFilesMode(t *testing.T) {
	c := selfSignedConfig(t, "hermes.example")
	id, err := Rotate(c)
	if err != nil {
		t.Fatal(err)
	}
	if bk, _ := Backups(c.StateDir); len(bk) != 0 || !CoversHost(id.Leaf, "hermes.example") {
		t.Errorf("first rotation: backups %v", bk)
	}
	// A rotation for a new authority fixes a SAN mismatch.
	c.Authority.Host = "new.example"
	if _, err := Load(c); !errors.Is(err, ErrSANMismatch) {
		t.Fatalf("want mismatch before rotation: %v", err)
	}
	if _, err := Rotate(c); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(c); err != nil {
		t.Fatal(err)
	}
	if _, err := Rotate(IdentityConfig{Mode: ModeFiles, CertFile: "c", KeyFile: "k", Authority: c.Authority}); err == nil {
		t.Error("rotation in files mode accepted")
	}
}

func TestConfigErrors(t *testing.T) {
	base := selfSignedConfig(t, "192.0.2.1")
	cases := map[string]func(*IdentityConfig){
		"unknown mode":  func(c *IdentityConfig) { c.Mode = "magic" },
		"key type":      func(c *IdentityConfig) { c.KeyType = "dsa" },
		"no state dir":  func(c *IdentityConfig) { c.StateDir = "" },
		"no authority":  func(c *IdentityConfig) { c.Authority.Host = "" },
		"bad authority": func(c *IdentityConfig) { c.Authority.Host = "192.0.2.1:9443" },
		"bad extra":     func(c *IdentityConfig) { c.ExtraNames = []string{"a b"} },
		"files no cert": func(c *IdentityConfig) { c.Mode = ModeFiles; c.KeyFile = "k" },
	}
	for name, mut := range cases {
		c := base
		mut(&c)
		if _, err := LoadOrCreate(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// staticSource serves one certificate, as an ACME manager would.
type staticSource struct{ cert *tls.Certificate }

func (s staticSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cert, nil
}

// In acme mode the identity is the persistent key of the identity file: the
// same pin as self_signed on the same state directory (switching keeps it),
// whatever names the file's certificate has, and never the self-signed
// certificate on the wire.
func TestACMEIdentityIsTheKey(t *testing.T) {
	c := selfSignedConfig(t, "old.example")
	self, err := LoadOrCreate(c)
	if err != nil {
		t.Fatal(err)
	}
	c.Mode, c.Authority.Host = ModeACME, "new.example"
	id, err := LoadOrCreate(c)
	if err != nil {
		t.Fatal(err)
	}
	if id.Pin != self.Pin || !id.Sourced() || id.Signer() == nil {
		t.Fatalf("acme identity: pin %s (self-signed %s), sourced %v", id.Pin, self.Pin, id.Sourced())
	}
	if _, err := id.GetCertificate(&tls.ClientHelloInfo{}); !errors.Is(err, ErrNoCertificateYet) {
		t.Fatalf("before a source: %v, want ErrNoCertificateYet (never the self-signed certificate)", err)
	}
	if cur := id.Current(); cur.Leaf != nil || cur.CertDER != nil || cur.Pin != self.Pin {
		t.Fatal("Current has a certificate before the source has one")
	}
	// A fresh state directory: acme mode creates the key like self_signed.
	fresh := selfSignedConfig(t, "a.example")
	fresh.Mode = ModeACME
	nid, err := LoadOrCreate(fresh)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(IdentityPath(fresh.StateDir)); err != nil || nid.Pin == self.Pin {
		t.Fatalf("no new key created: %v", err)
	}
	// With a source: handshakes and Current get its certificate.
	leafCert := &tls.Certificate{Certificate: [][]byte{self.CertDER, []byte("intermediate")}, PrivateKey: self.Certificate.PrivateKey, Leaf: self.Leaf}
	live := id.WithCertSource(staticSource{leafCert})
	if got, err := live.GetCertificate(&tls.ClientHelloInfo{ServerName: "new.example"}); err != nil || got != leafCert {
		t.Fatalf("sourced GetCertificate: %v", err)
	}
	if cur := live.Current(); !bytes.Equal(cur.CertDER, self.CertDER) || len(cur.Certificate.Certificate) != 2 || id.Current().Leaf != nil {
		t.Fatal("Current does not hold the source's certificate, or WithCertSource changed the original")
	}
}

// filesFixture makes an operator-style cert (with a chain entry) and key.
func filesFixture(t *testing.T, host string, keyPerm os.FileMode) IdentityConfig {
	t.Helper()
	src := selfSignedConfig(t, host)
	if _, err := LoadOrCreate(src); err != nil {
		t.Fatal(err)
	}
	cert, key := pemBlocks(t, src.StateDir)
	dir := t.TempDir()
	c := IdentityConfig{
		Mode:      ModeFiles,
		CertFile:  filepath.Join(dir, "fullchain.pem"),
		KeyFile:   filepath.Join(dir, "privkey.pem"),
		Authority: Authority{Host: host, Port: 443},
	}
	other := selfSignedConfig(t, "ca.example")
	if _, err := LoadOrCreate(other); err != nil {
		t.Fatal(err)
	}
	chainCert, _ := pemBlocks(t, other.StateDir)
	writePEM(t, c.CertFile, 0o644, cert, chainCert)
	writePEM(t, c.KeyFile, keyPerm, key)
	return c
}

func TestFilesMode(t *testing.T) {
	c := filesFixture(t, "hermes.example", 0o600)
	id, err := Load(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(id.Warnings) != 0 || id.Source != c.CertFile || len(id.Certificate.Certificate) != 2 || !CoversHost(id.Leaf, "hermes.example") {
		t.Errorf("files identity: warnings %v source %s chain %d", id.Warnings, id.Source, len(id.Certificate.Certificate))
	}
	fi, _ := os.Stat(c.CertFile)
	if !id.ChangedAt.Equal(fi.ModTime()) {
		t.Errorf("ChangedAt %v, want the cert file mtime %v", id.ChangedAt, fi.ModTime())
	}
	created, err := LoadOrCreate(c)
	if err != nil || created.Pin != id.Pin {
		t.Errorf("LoadOrCreate in files mode: %v", err)
	}

	if err := os.Chmod(c.KeyFile, 0o640); err != nil {
		t.Fatal(err)
	}
	id, err = Load(c)
	if err != nil || len(id.Warnings) != 1 || !strings.Contains(id.Warnings[0], "group") {
		t.Errorf("0640 key: %v %v", err, id)
	}
	for _, perm := range []os.FileMode{0o604, 0o602, 0o644, 0o666} {
		if err := os.Chmod(c.KeyFile, perm); err != nil {
			t.Fatal(err)
		}
		_, err := Load(c)
		if err == nil || !strings.Contains(err.Error(), "chmod o-rwx "+c.KeyFile) {
			t.Errorf("key mode %04o: %v", perm, err)
		}
	}
	if err := os.Chmod(c.KeyFile, 0o600); err != nil {
		t.Fatal(err)
	}

	c.Authority.Host = "other.example"
	if _, err := Load(c); !errors.Is(err, ErrSANMismatch) {
		t.Errorf("files mode SAN mismatch: %v", err)
	}
}

func TestFilesModeKeyMismatch(t *testing.T) {
	c := filesFixture(t, "hermes.example", 0o600)
	d := filesFixture(t, "hermes.example", 0o600)
	c.KeyFile = d.KeyFile
	if _, err := Load(c); err == nil || !strings.Contains(err.Error(), "must match") {
		t.Fatalf("mismatched files accepted: %v", err)
	}
	c.KeyFile = filepath.Join(t.TempDir(), "missing.pem")
	if _, err := Load(c); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing key: %v", err)
	}
}

func TestParseIdentityPEMRejects(t *testing.T) {
	c := selfSignedConfig(t, "192.0.2.1")
	if _, err := LoadOrCreate(c); err != nil {
		t.Fatal(err)
	}
	cert, key := pemBlocks(t, c.StateDir)
	enc := func(bs ...*pem.Block) []byte {
		var buf bytes.Buffer
		for _, b := range bs {
			_ = pem.Encode(&buf, b)
		}
		return buf.Bytes()
	}
	withHeader := *cert
	withHeader.Headers = map[string]string{"Proc-Type": "4,ENCRYPTED"}
	bad := map[string][]byte{
		"empty":     nil,
		"no key":    enc(cert),
		"no cert":   enc(key),
		"two certs": enc(cert, cert, key),
		"two keys":  enc(cert, key, key),
		"rsa key":   enc(cert, &pem.Block{Type: "RSA PRIVATE KEY", Bytes: key.Bytes}),
		"headers":   enc(&withHeader, key),
		"trailing":  append(enc(cert, key), "junk"...),
		"truncated": enc(cert, key)[:300],
	}
	for name, data := range bad {
		if _, _, err := parseIdentityPEM(data); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, _, err := parseIdentityPEM(enc(key, cert)); err != nil {
		t.Errorf("block order must not matter: %v", err)
	}
}

func FuzzParseIdentityPEM(f *testing.F) {
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nProc-Type: 4\n\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("junk"))
	f.Fuzz(func(t *testing.T, data []byte) {
		certDER, keyDER, err := parseIdentityPEM(data)
		if err != nil {
			return
		}
		if certDER == nil || keyDER == nil {
			t.Fatal("accepted without both blocks")
		}
		// Whatever was accepted must not crash the loaders that follow.
		_, _ = x509.ParseCertificate(certDER)
		_, _ = x509.ParsePKCS8PrivateKey(keyDER)
		var v asn1.RawValue
		_, _ = asn1.Unmarshal(certDER, &v)
	})
}

// The daemon and an operator's `securelink pin` may start at the same time
// on a fresh state directory; both must end up with the one identity on disk.
func TestConcurrentCreateYieldsOneIdentity(t *testing.T) {
	c := selfSignedConfig(t, "192.0.2.1")
	const n = 4
	pins := make(chan string, n)
	errs := make(chan error, n)
	var start sync.WaitGroup
	start.Add(1)
	for i := 0; i < n; i++ {
		go func() {
			start.Wait()
			id, err := LoadOrCreate(c)
			if err != nil {
				errs <- err
				return
			}
			pins <- id.Pin
		}()
	}
	start.Done()
	var first string
	for i := 0; i < n; i++ {
		select {
		case err := <-errs:
			t.Fatal(err)
		case p := <-pins:
			if first == "" {
				first = p
			} else if p != first {
				t.Fatalf("concurrent creation produced two identities: %s and %s", first, p)
			}
		}
	}
	if id, err := Load(c); err != nil || id.Pin != first {
		t.Fatalf("on disk: %v", err)
	}
}

package pinning

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// Identity modes (tls.mode).
const (
	ModeSelfSigned = "self_signed"
	ModeFiles      = "files"
	ModeACME       = "acme"
)

// Key types (tls.key_type).
const (
	KeyECDSAP256 = "ecdsa-p256"
	KeyRSA3072   = "rsa-3072"
)

const (
	// IdentityFileName holds key and certificate of the self-signed
	// identity in one file, so one rename replaces both and a reader never
	// sees a key from one identity with the certificate of another.
	IdentityFileName = "identity.pem"
	// BackupDirName holds the identities replaced by rotations.
	BackupDirName = "identity-backups"
	// KeepBackups is how many replaced identities are kept.
	KeepBackups = 3

	// selfSignedValidity is long because clients pin the key and ignore
	// expiry; a short validity would only add a failure mode.
	selfSignedValidity = 10 // years
	// backdate tolerates clients whose clock is somewhat behind.
	backdate = time.Hour
	// maxPEMFile bounds the identity, certificate and key files read.
	maxPEMFile = 1 << 20
	// maxCNLen is the X.520 upper bound for a common name.
	maxCNLen = 64
	// longNameCN is the common name of an identity whose authority host is
	// longer than maxCNLen.
	longNameCN = "hermes-secure-link"
)

// ErrNoIdentity means no self-signed identity exists yet in the state
// directory.
var ErrNoIdentity = errors.New("no identity")

// IdentityConfig says which identity the front serves and which names it
// must cover.
type IdentityConfig struct {
	// StateDir holds the self-signed identity (0700).
	StateDir string
	// Mode is ModeSelfSigned (default when empty), ModeFiles or ModeACME.
	// In ModeACME the identity file holds only what matters: the persistent
	// key (its self-signed certificate is never served); the certificates
	// come from a CertSource (WithCertSource).
	Mode string
	// KeyType is KeyECDSAP256 (default when empty) or KeyRSA3072; it only
	// matters when a self-signed identity (or ACME key) is created.
	KeyType string
	// CertFile and KeyFile are the operator's PEM files in files mode.
	CertFile, KeyFile string
	// Authority is what clients connect to; its host must be covered.
	Authority Authority
	// ExtraNames are further SANs (and accepted Host values).
	ExtraNames []string
	// Now is the clock used for new certificates and validity warnings;
	// nil = time.Now.
	Now func() time.Time
	// SkipNameCheck loads an identity without requiring it to cover the
	// authority and extra names, for commands that only display it (e.g.
	// `pin --rotate` without --yes). The front never sets it.
	SkipNameCheck bool
}

// Identity is a loaded key and certificate with what is derived from them.
type Identity struct {
	// Certificate is ready for tls.Config (Leaf set).
	Certificate tls.Certificate
	Leaf        *x509.Certificate
	// Pin is "sha256/" + standard base64 of SHA-256(SPKI DER).
	Pin     string
	CertDER []byte
	// Source is the file the certificate was loaded from.
	Source string
	// ChangedAt is when this identity came into being: the identity file's
	// modification time (self-signed) or the certificate file's (files).
	ChangedAt time.Time
	// KeyType names the key algorithm, e.g. "ecdsa-p256" or "rsa-3072".
	KeyType string
	// Warnings are problems that do not prevent serving.
	Warnings []string

	// live, when set, serves the certificate per handshake (ModeACME): the
	// key stays, the certificate changes at each renewal.
	live CertSource
}

// CertSource supplies the certificates of an identity whose certificate
// changes while its key stays (tls.mode acme). An empty ServerName asks for
// the authority's certificate. An error fails the handshake with an alert.
type CertSource interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
}

// ErrNoCertificateYet: an ACME identity has no certificate to serve yet.
var ErrNoCertificateYet = errors.New("no certificate for the identity key yet")

// noCertYet is the source of an ACME identity until WithCertSource: it never
// falls back to the self-signed certificate, which would serve another
// profile under the same pin.
type noCertYet struct{}

func (noCertYet) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return nil, ErrNoCertificateYet
}

// WithCertSource returns a copy of id whose certificates come from src (an
// ACME manager issuing for id's key).
func (id *Identity) WithCertSource(src CertSource) *Identity {
	c := *id
	c.live = src
	return &c
}

// Sourced reports whether the certificates come from a CertSource.
func (id *Identity) Sourced() bool { return id.live != nil }

// Signer is the identity's private key.
func (id *Identity) Signer() crypto.Signer {
	s, _ := id.Certificate.PrivateKey.(crypto.Signer)
	return s
}

// GetCertificate is the certificate a handshake gets (hello's name is
// already known to be allowed).
func (id *Identity) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if id.live != nil {
		return id.live.GetCertificate(hello)
	}
	return &id.Certificate, nil
}

// Current is the identity as handshakes see it now: for a sourced identity,
// a copy holding the authority's current certificate (leaf + chain), or
// with Leaf and CertDER nil while there is none. The pin is the key's
// either way.
func (id *Identity) Current() *Identity {
	if id.live == nil {
		return id
	}
	c := *id
	c.Leaf, c.CertDER, c.Certificate.Certificate = nil, nil, nil
	cert, err := id.live.GetCertificate(&tls.ClientHelloInfo{})
	if err == nil && cert != nil && cert.Leaf != nil {
		c.Certificate.Certificate, c.Leaf, c.CertDER = cert.Certificate, cert.Leaf, cert.Leaf.Raw
	}
	return &c
}

// SANs lists the names the certificate covers (none while an ACME identity
// has no certificate).
func (id *Identity) SANs() []string {
	if id.Leaf == nil {
		return nil
	}
	return SANs(id.Leaf)
}

// CertDERBase64 is the standard base64 of the leaf DER, as in cert_der.
func (id *Identity) CertDERBase64() string { return base64.StdEncoding.EncodeToString(id.CertDER) }

// checkedConfig is an IdentityConfig with defaults applied and names
// normalized; names[0] is the authority host when one is set.
type checkedConfig struct {
	IdentityConfig
	names []string
}

func (c IdentityConfig) check() (checkedConfig, error) {
	cc := checkedConfig{IdentityConfig: c}
	if cc.Mode == "" {
		cc.Mode = ModeSelfSigned
	}
	if cc.KeyType == "" {
		cc.KeyType = KeyECDSAP256
	}
	if cc.Now == nil {
		cc.Now = time.Now
	}
	switch cc.Mode {
	case ModeSelfSigned, ModeACME:
		if cc.StateDir == "" {
			return cc, fmt.Errorf("tls.mode %s needs a state directory", cc.Mode)
		}
		if cc.KeyType != KeyECDSAP256 && cc.KeyType != KeyRSA3072 {
			return cc, fmt.Errorf("tls.key_type %q: want %s or %s", cc.KeyType, KeyECDSAP256, KeyRSA3072)
		}
	case ModeFiles:
		if cc.CertFile == "" || cc.KeyFile == "" {
			return cc, errors.New("tls.mode files needs tls.cert_file and tls.key_file")
		}
	default:
		return cc, fmt.Errorf("tls.mode %q: want %s, %s or %s", cc.Mode, ModeSelfSigned, ModeFiles, ModeACME)
	}
	add := func(what, s string) error {
		n, err := NormalizeHost(s)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if !slices.Contains(cc.names, n) {
			cc.names = append(cc.names, n)
		}
		return nil
	}
	if cc.Authority.Host != "" {
		if err := add("authority", cc.Authority.Host); err != nil {
			return cc, err
		}
	} else if !cc.SkipNameCheck {
		return cc, errors.New("no authority host to issue or check the identity for")
	}
	for _, e := range cc.ExtraNames {
		if err := add("extra_names", e); err != nil {
			return cc, err
		}
	}
	return cc, nil
}

// Load loads the configured identity and never creates one. A missing
// self-signed identity is ErrNoIdentity.
func Load(c IdentityConfig) (*Identity, error) {
	cc, err := c.check()
	if err != nil {
		return nil, err
	}
	var id *Identity
	if cc.Mode == ModeFiles {
		id, err = loadFiles(cc.CertFile, cc.KeyFile)
	} else {
		id, err = loadSelfSigned(cc.StateDir)
	}
	if err != nil {
		return nil, err
	}
	return finish(id, cc)
}

// LoadOrCreate loads the identity, creating the self-signed one on first
// use. An existing identity is never replaced here, even when it does not
// cover the configured names: that is a rotation and needs the operator.
func LoadOrCreate(c IdentityConfig) (*Identity, error) {
	cc, err := c.check()
	if err != nil {
		return nil, err
	}
	if cc.Mode == ModeFiles {
		return Load(c)
	}
	if len(cc.names) == 0 {
		return nil, errors.New("no authority host to issue the identity for")
	}
	if err := atomicfile.MkdirPrivate(cc.StateDir); err != nil {
		return nil, err
	}
	unlock, err := atomicfile.LockDir(cc.StateDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	id, err := loadSelfSigned(cc.StateDir)
	if errors.Is(err, ErrNoIdentity) {
		var data []byte
		data, err = newSelfSigned(cc.KeyType, cc.names, cc.Now())
		if err != nil {
			return nil, err
		}
		if err = atomicfile.WriteFile(IdentityPath(cc.StateDir), data, 0o600); err != nil {
			return nil, fmt.Errorf("write identity: %w", err)
		}
		id, err = loadSelfSigned(cc.StateDir)
	}
	if err != nil {
		return nil, err
	}
	return finish(id, cc)
}

// Rotate replaces the self-signed identity with a new key and certificate
// for the configured names. The replaced identity (even an unreadable one,
// which may be why the operator rotates) is kept as a backup; only the
// newest KeepBackups backups are kept. Every paired client must re-pair.
func Rotate(c IdentityConfig) (*Identity, error) {
	cc, err := c.check()
	if err != nil {
		return nil, err
	}
	if cc.Mode == ModeFiles {
		return nil, fmt.Errorf("rotation only applies to tls.mode self_signed and acme; in %s mode install a new certificate and key instead", cc.Mode)
	}
	if len(cc.names) == 0 {
		return nil, errors.New("no authority host to issue the identity for")
	}
	if err := atomicfile.MkdirPrivate(cc.StateDir); err != nil {
		return nil, err
	}
	unlock, err := atomicfile.LockDir(cc.StateDir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	data, err := newSelfSigned(cc.KeyType, cc.names, cc.Now())
	if err != nil {
		return nil, err
	}
	path := IdentityPath(cc.StateDir)
	old, _, err := readPEM(path, 0)
	switch {
	case err == nil:
		if err := writeBackup(cc.StateDir, old, cc.Now()); err != nil {
			return nil, fmt.Errorf("back up the current identity (nothing was changed): %w", err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("read the current identity (nothing was changed): %w", err)
	}
	if err := atomicfile.WriteFile(path, data, 0o600); err != nil {
		return nil, fmt.Errorf("write identity: %w", err)
	}
	if err := pruneBackups(BackupDir(cc.StateDir), KeepBackups); err != nil {
		return nil, fmt.Errorf("identity rotated, but pruning old backups failed: %w", err)
	}
	id, err := loadSelfSigned(cc.StateDir)
	if err != nil {
		return nil, err
	}
	return finish(id, cc)
}

// finish applies the checks common to every mode. An ACME identity is its
// key: the names and validity of the file's self-signed certificate do not
// matter, since it is never served.
func finish(id *Identity, cc checkedConfig) (*Identity, error) {
	if cc.Mode == ModeACME {
		id.live = noCertYet{}
	} else {
		if err := checkCertificate(id, cc); err != nil {
			return nil, err
		}
	}
	if cc.Mode != ModeFiles && id.KeyType != cc.KeyType {
		id.Warnings = append(id.Warnings, fmt.Sprintf("tls.key_type is %s but the identity's key is %s; it changes only with `securelink pin --rotate`",
			cc.KeyType, id.KeyType))
	}
	return id, nil
}

// checkCertificate checks the served certificate's names and validity.
func checkCertificate(id *Identity, cc checkedConfig) error {
	if !cc.SkipNameCheck {
		for _, n := range cc.names {
			if CoversHost(id.Leaf, n) {
				continue
			}
			fix := "run `securelink pin --rotate` to issue an identity for the configured names (every paired client must then re-pair)"
			if cc.Mode == ModeFiles {
				fix = "install a certificate whose subjectAltName includes it, or change advertise/extra_names"
			}
			return fmt.Errorf("%w: %s is not in the subjectAltName of %s (which has %s); %s",
				ErrSANMismatch, n, id.Source, strings.Join(id.SANs(), ", "), fix)
		}
	}
	now := cc.Now()
	if now.After(id.Leaf.NotAfter) {
		id.Warnings = append(id.Warnings, fmt.Sprintf("certificate %s expired at %s; pinned clients may still accept it, others will not",
			id.Source, id.Leaf.NotAfter.UTC().Format(time.RFC3339)))
	} else if now.Before(id.Leaf.NotBefore) {
		id.Warnings = append(id.Warnings, fmt.Sprintf("certificate %s is not valid before %s; check the clock",
			id.Source, id.Leaf.NotBefore.UTC().Format(time.RFC3339)))
	}
	return nil
}

func loadFiles(certFile, keyFile string) (*Identity, error) {
	var warnings []string
	// 0640 with a dedicated group (ssl-cert) is a common setup for keys
	// several services share: warn about it, refuse access by others.
	keyPEM, ki, err := readPEM(keyFile, 0o007)
	if err != nil {
		return nil, fmt.Errorf("tls.key_file: %w", err)
	}
	if w := atomicfile.GroupWarning("tls.key_file", keyFile, ki.Mode(), "the private key"); w != "" {
		warnings = append(warnings, w)
	}
	certPEM, ci, err := readPEM(certFile, 0)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("cannot use tls.cert_file %s with tls.key_file %s (the key must match the first certificate): %v", certFile, keyFile, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("tls.cert_file %s: %w", certFile, err)
		}
	}
	id := newIdentity(leaf, pair.Certificate, pair.PrivateKey, certFile, ci.ModTime())
	id.Warnings = warnings
	return id, nil
}

func newIdentity(leaf *x509.Certificate, chain [][]byte, key crypto.PrivateKey, source string, changed time.Time) *Identity {
	return &Identity{
		Certificate: tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf},
		Leaf:        leaf,
		Pin:         SPKIPin(leaf),
		CertDER:     leaf.Raw,
		Source:      source,
		ChangedAt:   changed,
		KeyType:     keyTypeName(leaf.PublicKey),
	}
}

func keyTypeName(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return "ecdsa-" + strings.ToLower(strings.ReplaceAll(k.Curve.Params().Name, "-", ""))
	case *rsa.PublicKey:
		return fmt.Sprintf("rsa-%d", k.N.BitLen())
	case ed25519.PublicKey:
		return "ed25519"
	}
	return "unknown"
}

func keyMatches(key crypto.PrivateKey, pub crypto.PublicKey) bool {
	s, ok := key.(crypto.Signer)
	if !ok {
		return false
	}
	p, ok := s.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && p.Equal(pub)
}

const backupTimeLayout = "20060102T150405.000000000Z"

var backupName = regexp.MustCompile(`^identity-[0-9]{8}T[0-9]{6}\.[0-9]{9}Z\.pem$`)

// readPEM reads an identity, certificate or key file, bounded by
// maxPEMFile, refusing the permission bits in deny.
func readPEM(path string, deny os.FileMode) ([]byte, os.FileInfo, error) {
	return atomicfile.ReadPrivate(path, maxPEMFile, deny)
}

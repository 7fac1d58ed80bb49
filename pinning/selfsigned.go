package pinning

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// IdentityPath is the self-signed identity file in stateDir.
func IdentityPath(stateDir string) string { return filepath.Join(stateDir, IdentityFileName) }

func loadSelfSigned(dir string) (*Identity, error) {
	di, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s (it does not exist); `securelink pin` creates one", ErrNoIdentity, dir)
	}
	if err != nil {
		return nil, err
	}
	if !di.IsDir() {
		return nil, fmt.Errorf("state directory %s is not a directory", dir)
	}
	if p := di.Mode().Perm(); p&0o077 != 0 {
		return nil, fmt.Errorf("state directory %s has mode %04o; it holds the private key and must be 0700 (chmod 700 %s)", dir, p, dir)
	}
	path := IdentityPath(dir)
	data, fi, err := readPEM(path, 0o077)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s; `securelink pin` creates one", ErrNoIdentity, path)
	}
	if err != nil {
		return nil, err
	}
	certDER, keyDER, err := parseIdentityPEM(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	leaf, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("%s: certificate: %w", path, err)
	}
	key, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, fmt.Errorf("%s: private key: %w", path, err)
	}
	if !keyMatches(key, leaf.PublicKey) {
		return nil, fmt.Errorf("%s: the private key does not match the certificate; restore a backup from %s or run `securelink pin --rotate`",
			path, BackupDir(dir))
	}
	return newIdentity(leaf, [][]byte{certDER}, key, path, fi.ModTime()), nil
}

// parseIdentityPEM splits the identity file into its one certificate and one
// PKCS#8 key. Anything else (a second key, headers, an unknown block, or
// trailing data) is refused: the file is written only by this package, so
// surprises mean tampering or a mix-up.
func parseIdentityPEM(data []byte) (certDER, keyDER []byte, err error) {
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if len(b.Headers) != 0 {
			return nil, nil, fmt.Errorf("unexpected PEM headers in a %s block", b.Type)
		}
		switch b.Type {
		case "CERTIFICATE":
			if certDER != nil {
				return nil, nil, errors.New("more than one certificate")
			}
			certDER = b.Bytes
		case "PRIVATE KEY":
			if keyDER != nil {
				return nil, nil, errors.New("more than one private key")
			}
			keyDER = b.Bytes
		default:
			return nil, nil, fmt.Errorf("unexpected PEM block %q", b.Type)
		}
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, nil, errors.New("unexpected data after the PEM blocks")
	}
	if certDER == nil {
		return nil, nil, errors.New("no certificate")
	}
	if keyDER == nil {
		return nil, nil, errors.New("no private key")
	}
	return certDER, keyDER, nil
}

// newSelfSigned makes a key and a small self-signed leaf for names (the
// authority host first) and returns them as one PEM file. The profile is the
// one secure-link.md chooses for the shipped clients: subjectAltName and
// extKeyUsage serverAuth only, with no keyUsage and no basicConstraints
// extension (ProfileProblem says why). It is also small, because its DER
// travels in the pairing QR: a short subject, no key identifiers.
func newSelfSigned(keyType string, names []string, now time.Time) ([]byte, error) {
	var key crypto.Signer
	var err error
	switch keyType {
	case KeyECDSAP256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case KeyRSA3072:
		key, err = rsa.GenerateKey(rand.Reader, 3072)
	default:
		return nil, fmt.Errorf("key type %q: want %s or %s", keyType, KeyECDSAP256, KeyRSA3072)
	}
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	serial.Add(serial, big.NewInt(1))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    now.Add(-backdate).UTC().Truncate(time.Second),
		NotAfter:     now.AddDate(selfSignedValidity, 0, 0).UTC().Truncate(time.Second),
		// KeyUsage stays 0 and BasicConstraintsValid false: crypto/x509
		// then writes neither extension.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	// The subject is never empty: Bun's verified TLS path (the desktop
	// client's Reach route) fails with "Crypto operation failed" on a
	// certificate with an empty subject. A name too long for a common name
	// gets a short fixed one; clients match the SAN, never the CN.
	tmpl.Subject = pkix.Name{CommonName: longNameCN}
	if len(names[0]) <= maxCNLen {
		tmpl.Subject = pkix.Name{CommonName: names[0]}
	}
	for _, n := range names {
		if a, err := netip.ParseAddr(n); err == nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.IP(a.AsSlice()))
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	_ = pem.Encode(&buf, &pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	return buf.Bytes(), nil
}

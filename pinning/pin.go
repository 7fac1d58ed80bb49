package pinning

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
)

// PinPrefix starts every pin: the OkHttp-style form the Hermes clients store.
const PinPrefix = "sha256/"

// pinB64Len is the padded standard base64 length of a SHA-256 digest.
const pinB64Len = 44

var (
	// ErrSANMismatch means the identity's certificate does not name the
	// configured authority or an extra name. Nothing rotates implicitly: the
	// operator decides, because every paired client must re-pair.
	ErrSANMismatch = errors.New("certificate does not cover a configured name")
	// ErrPinMismatch means the endpoint presented a key other than the pinned one.
	ErrPinMismatch = errors.New("pin mismatch")
	// ErrBadPin means a pin is not "sha256/" + 44 characters of padded
	// standard base64 of 32 bytes.
	ErrBadPin = errors.New("malformed pin")
)

// SPKIPin is the pin of a certificate: it covers the key only, so a
// re-issued certificate for the same key keeps the pin.
func SPKIPin(cert *x509.Certificate) string {
	return pinOf(cert.RawSubjectPublicKeyInfo)
}

func pinOf(spki []byte) string {
	sum := sha256.Sum256(spki)
	return PinPrefix + base64.StdEncoding.EncodeToString(sum[:])
}

// ParsePin accepts exactly the form clients accept (^sha256/[A-Za-z0-9+/]{43}=$
// decoding to 32 bytes with zero padding bits). It is strict on purpose: a
// lenient decoder (whitespace, URL alphabet, missing padding) would let two
// different strings denote one pin and break equality checks elsewhere.
func ParsePin(s string) ([32]byte, error) {
	var out [32]byte
	if len(s) != len(PinPrefix)+pinB64Len || s[:len(PinPrefix)] != PinPrefix {
		return out, fmt.Errorf("%w: want %s followed by 44 base64 characters", ErrBadPin, PinPrefix)
	}
	b := s[len(PinPrefix):]
	for i := 0; i < pinB64Len-1; i++ {
		c := b[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/') {
			return out, fmt.Errorf("%w: character %d is not standard base64", ErrBadPin, len(PinPrefix)+i+1)
		}
	}
	if b[pinB64Len-1] != '=' {
		return out, fmt.Errorf("%w: must end with one '=' of padding", ErrBadPin)
	}
	n, err := base64.StdEncoding.Strict().Decode(out[:], []byte(b))
	if err != nil || n != len(out) {
		return [32]byte{}, fmt.Errorf("%w: not the base64 of a 32-byte digest", ErrBadPin)
	}
	return out, nil
}

// PinMatches compares a certificate's key to a pin in constant time; a
// malformed pin matches nothing.
func PinMatches(cert *x509.Certificate, pin string) bool {
	want, err := ParsePin(pin)
	if err != nil {
		return false
	}
	got := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// CertSHA256Hex is the lower-case hex SHA-256 of the certificate DER, the
// fingerprint browsers and openssl show.
func CertSHA256Hex(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// CoversHost reports whether one SAN entry of cert is exactly host: IP
// addresses are compared as addresses (so 2001:db8::1 equals
// 2001:0db8:0:0::1 and 192.0.2.1 never equals 192.0.2.10), DNS names
// case-insensitively without a trailing dot. Wildcards and the subject CN do
// not count: the candidate names one host and the identity must name it.
func CoversHost(cert *x509.Certificate, host string) bool {
	n, err := NormalizeHost(host)
	if err != nil {
		return false
	}
	if a, err := netip.ParseAddr(n); err == nil {
		for _, ip := range cert.IPAddresses {
			if c, ok := netip.AddrFromSlice(ip); ok && c.Unmap() == a {
				return true
			}
		}
		return false
	}
	for _, d := range cert.DNSNames {
		// n is not an IP here, so an IP written as a dNSName never matches.
		if dn, err := NormalizeHost(d); err == nil && dn == n {
			return true
		}
	}
	return false
}

// SANs lists a certificate's DNS and IP subjectAltNames as text, DNS first.
func SANs(cert *x509.Certificate) []string {
	out := make([]string, 0, len(cert.DNSNames)+len(cert.IPAddresses))
	out = append(out, cert.DNSNames...)
	for _, ip := range cert.IPAddresses {
		if a, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, a.Unmap().String())
		}
	}
	return out
}

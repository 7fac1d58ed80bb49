package pinning

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
)

// SelfSigned reports whether cert names itself as issuer and is signed by
// its own key. (x509.CheckSignatureFrom would refuse a parent without
// basicConstraints, which the current profile does not have.)
func SelfSigned(cert *x509.Certificate) bool {
	if cert == nil || !bytes.Equal(cert.RawIssuer, cert.RawSubject) {
		return false
	}
	return cert.CheckSignature(cert.SignatureAlgorithm, cert.RawTBSCertificate, cert.Signature) == nil
}

// ProfileProblem says why a shipped client cannot pin a self-signed
// certificate, or "" when it can (and for any certificate that is not
// self-signed: those are anchored on a trust store, not on themselves).
//
// The desktop client verifies the live connection with the pinned leaf as
// its only trust anchor; Bun's TLS (BoringSSL) refuses a self-signed anchor
// whose keyUsage extension lacks keyCertSign ("unable to verify the first
// certificate"). Measured with Bun 1.3.14: keyUsage digitalSignature fails
// (with or without basicConstraints); no keyUsage, or keyUsage with
// keyCertSign, passes; basicConstraints alone does not matter. Identities
// made before the current profile carry keyUsage digitalSignature.
func ProfileProblem(cert *x509.Certificate) string {
	if !SelfSigned(cert) || !hasExtension(cert, oidKeyUsage) || cert.KeyUsage&x509.KeyUsageCertSign != 0 {
		return ""
	}
	return "the self-signed certificate has a keyUsage extension without keyCertSign (the older identity profile); the desktop client's runtime (Bun) refuses it as its own trust anchor, so every pinned connection fails with \"unable to verify the first certificate\""
}

var oidKeyUsage = asn1.ObjectIdentifier{2, 5, 29, 15}

func hasExtension(cert *x509.Certificate, oid asn1.ObjectIdentifier) bool {
	for _, e := range cert.Extensions {
		if e.Id.Equal(oid) {
			return true
		}
	}
	return false
}

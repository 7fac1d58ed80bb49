package pinning

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/pinning/pinningtest"
)

func extensionOIDs(c *x509.Certificate) []string {
	var oids []string
	for _, e := range c.Extensions {
		oids = append(oids, e.Id.String())
	}
	slices.Sort(oids)
	return oids
}

// Both key types get the profile of secure-link.md, and the SANs are
// exactly the configured names: DNS names as DNS names, IPv4 as 4 bytes,
// IPv6 as 16 bytes.
func TestSelfSignedProfile(t *testing.T) {
	for _, kt := range []string{KeyECDSAP256, KeyRSA3072} {
		t.Run(kt, func(t *testing.T) {
			c := selfSignedConfig(t, "hermes.example", "2001:db8::7", "192.0.2.9", "other.example")
			c.KeyType = kt
			id, err := LoadOrCreate(c)
			if err != nil {
				t.Fatal(err)
			}
			leaf := id.Leaf
			if got := extensionOIDs(leaf); !slices.Equal(got, []string{"2.5.29.17", "2.5.29.37"}) {
				t.Errorf("extensions %v, want only subjectAltName and extKeyUsage", got)
			}
			if leaf.BasicConstraintsValid || leaf.IsCA || leaf.KeyUsage != 0 {
				t.Errorf("basicConstraints %v IsCA %v keyUsage %v", leaf.BasicConstraintsValid, leaf.IsCA, leaf.KeyUsage)
			}
			if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
				t.Errorf("extKeyUsage %v", leaf.ExtKeyUsage)
			}
			if !slices.Equal(leaf.DNSNames, []string{"hermes.example", "other.example"}) {
				t.Errorf("DNS SANs %v", leaf.DNSNames)
			}
			if len(leaf.IPAddresses) != 2 || len(leaf.IPAddresses[0]) != 16 || !leaf.IPAddresses[0].Equal(net.ParseIP("2001:db8::7")) ||
				len(leaf.IPAddresses[1]) != 4 || !leaf.IPAddresses[1].Equal(net.ParseIP("192.0.2.9")) {
				t.Errorf("IP SANs %v", leaf.IPAddresses)
			}
			if len(leaf.EmailAddresses) != 0 || len(leaf.URIs) != 0 {
				t.Errorf("unexpected SANs %v %v", leaf.EmailAddresses, leaf.URIs)
			}
			if !SelfSigned(leaf) || ProfileProblem(leaf) != "" {
				t.Errorf("self-signed %v, profile problem %q", SelfSigned(leaf), ProfileProblem(leaf))
			}
		})
	}
}

// An IPv6-only authority gets one IP SAN and no DNS SAN.
func TestSelfSignedProfileIPv6Authority(t *testing.T) {
	id, err := LoadOrCreate(selfSignedConfig(t, "fd00::1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(id.Leaf.DNSNames) != 0 || len(id.Leaf.IPAddresses) != 1 || !id.Leaf.IPAddresses[0].Equal(net.ParseIP("fd00::1")) {
		t.Fatalf("SANs %v %v", id.Leaf.DNSNames, id.Leaf.IPAddresses)
	}
	if !CoversHost(id.Leaf, "fd00::1") {
		t.Fatal("identity does not cover its IPv6 authority")
	}
}

func TestProfileProblem(t *testing.T) {
	legacy, err := pinningtest.LegacyIdentityPEM("hermes.example")
	if err != nil {
		t.Fatal(err)
	}
	certDER, _, err := parseIdentityPEM(legacy)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := x509.ParseCertificate(certDER)
	if p := ProfileProblem(old); p == "" {
		t.Error("keyUsage digitalSignature on a self-signed identity is not named")
	}

	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	mk := func(f func(*x509.Certificate), parent *x509.Certificate, signer *ecdsa.PrivateKey) *x509.Certificate {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "hermes.example"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"hermes.example"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		f(tmpl)
		if parent == nil {
			parent, signer = tmpl, key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c
	}
	// Measured with Bun 1.3.14 (see ProfileProblem): these pass.
	for name, f := range map[string]func(*x509.Certificate){
		"no keyUsage":               func(*x509.Certificate) {},
		"keyUsage with certSign":    func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign },
		"basicConstraints CA:FALSE": func(c *x509.Certificate) { c.BasicConstraintsValid = true },
	} {
		if p := ProfileProblem(mk(f, nil, nil)); p != "" {
			t.Errorf("%s: unexpected problem %q", name, p)
		}
	}
	if p := ProfileProblem(mk(func(c *x509.Certificate) {
		c.BasicConstraintsValid = true
		c.KeyUsage = x509.KeyUsageDigitalSignature
	}, nil, nil)); p == "" {
		t.Error("basicConstraints plus keyUsage digitalSignature is not named")
	}

	// A CA-issued leaf is anchored on a trust store: no profile problem,
	// whatever its keyUsage.
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	ca, _ := x509.ParseCertificate(caDER)
	issued := mk(func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageDigitalSignature }, ca, caKey)
	if SelfSigned(issued) || ProfileProblem(issued) != "" {
		t.Errorf("CA-issued leaf: self-signed %v, problem %q", SelfSigned(issued), ProfileProblem(issued))
	}
	if ProfileProblem(nil) != "" || SelfSigned(nil) {
		t.Error("nil certificate")
	}
}

// An identity of the older profile keeps loading (nothing rotates
// implicitly); rotation replaces it with the current profile.
func TestLegacyIdentityLoadsAndRotatesToTheCurrentProfile(t *testing.T) {
	c := selfSignedConfig(t, "hermes.example")
	legacy, err := pinningtest.LegacyIdentityPEM("hermes.example")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(IdentityPath(c.StateDir), legacy, 0o600); err != nil {
		t.Fatal(err)
	}
	id, err := LoadOrCreate(c)
	if err != nil {
		t.Fatal(err)
	}
	if ProfileProblem(id.Leaf) == "" {
		t.Fatal("the legacy identity was replaced or is not recognized")
	}
	rotated, err := Rotate(c)
	if err != nil {
		t.Fatal(err)
	}
	if rotated.Pin == id.Pin || ProfileProblem(rotated.Leaf) != "" {
		t.Fatalf("rotation kept the pin or the old profile: %q", ProfileProblem(rotated.Leaf))
	}
}

// An authority longer than a common name allows still gets a non-empty
// subject (Bun's verified TLS path refuses an empty one), and the SAN still
// carries the whole name.
func TestLongAuthorityKeepsASubject(t *testing.T) {
	long := strings.Repeat("a", 60) + ".hermes.example"
	id, err := LoadOrCreate(selfSignedConfig(t, long))
	if err != nil {
		t.Fatal(err)
	}
	if id.Leaf.Subject.CommonName == "" || len(id.Leaf.RawSubject) <= 2 {
		t.Fatalf("empty subject for a %d-character authority", len(long))
	}
	if !slices.Equal(id.Leaf.DNSNames, []string{long}) {
		t.Fatalf("DNS SANs %v", id.Leaf.DNSNames)
	}
}

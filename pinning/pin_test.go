package pinning

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"testing"
)

func TestParsePin(t *testing.T) {
	var digest [32]byte
	for i := range digest {
		digest[i] = byte(i * 7)
	}
	good := "sha256/" + base64.StdEncoding.EncodeToString(digest[:])
	if !pinRE.MatchString(good) {
		t.Fatalf("test pin %q does not match the client regex", good)
	}
	got, err := ParsePin(good)
	if err != nil || got != digest {
		t.Fatalf("ParsePin(%q) = %x, %v", good, got, err)
	}
	b64 := good[len("sha256/"):]
	bad := []string{
		"",
		b64,                         // no prefix
		"SHA256/" + b64,             // prefix is case-sensitive
		"sha256//" + b64,            // curl's form is not the client's
		"sha256/" + b64[:43],        // padding missing
		"sha256/" + b64 + "=",       // extra padding
		"sha256/" + b64[:42] + "==", // 31 bytes
		"sha256/" + strings.Replace(b64, b64[:1], "-", 1), // URL alphabet
		"sha256/" + b64[:20] + "\n" + b64[21:],            // newline the decoder would skip
		"sha256/" + b64[:42] + "B=",                       // non-zero padding bits
		"sha1/" + b64,
		"sha256/" + base64.StdEncoding.EncodeToString(make([]byte, 33)),
		" " + good,
	}
	for _, s := range bad {
		if _, err := ParsePin(s); !errors.Is(err, ErrBadPin) {
			t.Errorf("ParsePin(%q) = %v, want ErrBadPin", s, err)
		}
	}
}

func TestSPKIPinAndFingerprint(t *testing.T) {
	id, err := LoadOrCreate(selfSignedConfig(t, "192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	// Recompute from the DER the way curl/openssl do: SHA-256 of the SPKI.
	cert, err := x509.ParseCertificate(id.CertDER)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	if want := "sha256/" + base64.StdEncoding.EncodeToString(sum[:]); id.Pin != want || SPKIPin(cert) != want {
		t.Errorf("pin %s, want %s", id.Pin, want)
	}
	if !PinMatches(cert, id.Pin) || PinMatches(cert, "sha256/"+base64.StdEncoding.EncodeToString(make([]byte, 32))) || PinMatches(cert, "junk") {
		t.Error("PinMatches is wrong")
	}
	whole := sha256.Sum256(id.CertDER)
	if got := CertSHA256Hex(id.CertDER); got != hex.EncodeToString(whole[:]) || len(got) != 64 {
		t.Errorf("fingerprint %s", got)
	}
}

func TestCoversHost(t *testing.T) {
	cert := &x509.Certificate{
		DNSNames:    []string{"Hermes.Example", "bücher.example", "*.wild.example", "192.0.2.7"},
		IPAddresses: []net.IP{net.ParseIP("192.0.2.1"), net.ParseIP("2001:db8::1").To16(), net.IPv4(198, 51, 100, 4).To4()},
	}
	yes := []string{"192.0.2.1", "::ffff:192.0.2.1", "2001:db8::1", "2001:0db8:0:0::1", "[2001:db8:0::1]",
		"198.51.100.4", "hermes.example", "HERMES.EXAMPLE.", "xn--bcher-kva.example", "BÜCHER.example"}
	for _, h := range yes {
		if !CoversHost(cert, h) {
			t.Errorf("CoversHost(%q) = false", h)
		}
	}
	no := []string{"192.0.2.10", "192.0.2.11", "92.0.2.1", "192.0.2", "2001:db8::10", "2001:db8::", "ermes.example",
		"hermes.example.com", "a.hermes.example", "x.wild.example", "*.wild.example", "192.0.2.7", "", "hermes.example:443",
		"fe80::1%eth0"}
	for _, h := range no {
		if CoversHost(cert, h) {
			t.Errorf("CoversHost(%q) = true", h)
		}
	}
	if got := SANs(cert); strings.Join(got, ",") != "Hermes.Example,bücher.example,*.wild.example,192.0.2.7,192.0.2.1,2001:db8::1,198.51.100.4" {
		t.Errorf("SANs = %v", got)
	}
}

func FuzzParsePin(f *testing.F) {
	f.Add("sha256/" + base64.StdEncoding.EncodeToString(make([]byte, 32)))
	f.Add("sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB=")
	f.Add("sha256/AAAAAAAAAAAAAAAAAAAA\nAAAAAAAAAAAAAAAAAAAAAA=")
	f.Add("sha256//AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParsePin(s)
		if err != nil {
			return
		}
		if !pinRE.MatchString(s) {
			t.Fatalf("accepted %q which the client regex rejects", s)
		}
		if back := "sha256/" + base64.StdEncoding.EncodeToString(d[:]); back != s {
			t.Fatalf("two spellings of one pin: %q and %q", s, back)
		}
	})
}

package pairing

import (
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hermes-securelink/securelink/internal/surface"
	"github.com/hermes-securelink/securelink/pinning"
)

// maxCertDERB64 is the desktop client's limit on cert_der (both candidates
// carry it).
const maxCertDERB64 = 8192

// PluginProxyCandidate is the plugin_proxy entry of the pairing endpoints;
// the field order and tags give exactly the keys of the contract, because
// the pairing command compares it in canonical JSON with what the Relay
// signed.
type PluginProxyCandidate struct {
	Role         string      `json:"role"`
	Priority     int         `json:"priority"`
	Recommended  bool        `json:"recommended"`
	Security     string      `json:"security"`
	DisplayName  string      `json:"display_name"`
	Description  string      `json:"description"`
	Capabilities []string    `json:"capabilities"`
	Proxy        PluginProxy `json:"proxy"`
}

// PluginProxy is the proxy object of a plugin_proxy candidate.
type PluginProxy struct {
	URL           string           `json:"url"`
	TransportHint string           `json:"transport_hint"`
	PinSHA256     string           `json:"pin_sha256"`
	CertDER       string           `json:"cert_der"`
	Surfaces      []string         `json:"surfaces"`
	Services      surface.Services `json:"services"`
}

// NewPluginProxyCandidate describes the front at a for the pairing QR.
// Priority is 0; the pairing command renumbers by position.
func NewPluginProxyCandidate(a pinning.Authority, id *pinning.Identity) PluginProxyCandidate {
	return PluginProxyCandidate{
		Role:         surface.Role,
		Priority:     0,
		Recommended:  true,
		Security:     surface.Security,
		DisplayName:  surface.DisplayName,
		Description:  surface.Description,
		Capabilities: slices.Clone(surface.Namespaces),
		Proxy: PluginProxy{
			URL:           a.URL(),
			TransportHint: "https",
			PinSHA256:     id.Pin,
			CertDER:       id.CertDERBase64(),
			Surfaces:      slices.Clone(surface.Namespaces),
			Services:      surface.DefaultServices(),
		},
	}
}

// Validate applies the checks the Hermes clients apply before they treat the
// candidate as pinned, plus consistency between cert_der and the pin, so a
// broken candidate fails here rather than on a phone.
func (c PluginProxyCandidate) Validate() error {
	if c.Role != surface.Role {
		return fmt.Errorf("candidate role %q, want %q", c.Role, surface.Role)
	}
	if !c.Recommended || c.Security != surface.Security {
		return errors.New("a plugin_proxy candidate must be recommended with security pinned_tls, or clients do not pin it")
	}
	_, err := checkPinnedProxy(c.Proxy.URL, c.Proxy.PinSHA256, c.Proxy.CertDER)
	return err
}

// checkPinnedProxy is what every candidate that names the front (the
// plugin_proxy one and a broker route's proxy) must hold, as the clients
// check it before they pin: exactly https://host:port, a pin, and cert_der
// in standard base64, a certificate whose pin it is. It returns the
// authority.
func checkPinnedProxy(rawURL, pin, certDER string) (pinning.Authority, error) {
	a, err := proxyAuthority(rawURL)
	if err != nil {
		return a, err
	}
	if _, err := pinning.ParsePin(pin); err != nil {
		return a, fmt.Errorf("candidate: proxy.pin_sha256: %w", err)
	}
	if len(certDER) > maxCertDERB64 {
		return a, fmt.Errorf("candidate: proxy.cert_der has %d characters; clients accept at most %d", len(certDER), maxCertDERB64)
	}
	// The decoder skips CR/LF even in strict mode; clients do not.
	der, err := base64.StdEncoding.Strict().DecodeString(certDER)
	if err != nil || strings.ContainsAny(certDER, "\r\n") {
		return a, errors.New("candidate: proxy.cert_der is not standard base64")
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return a, fmt.Errorf("candidate: proxy.cert_der: %w", err)
	}
	if !pinning.PinMatches(cert, pin) {
		return a, fmt.Errorf("candidate: proxy.pin_sha256 is not the pin of proxy.cert_der (%s)", pinning.SPKIPin(cert))
	}
	return a, nil
}

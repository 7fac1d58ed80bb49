package pairing

import (
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
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
	u, err := url.Parse(c.Proxy.URL)
	if err != nil {
		return fmt.Errorf("candidate url: %w", err)
	}
	if u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" ||
		u.ForceQuery || (u.Path != "" && u.Path != "/") || u.Opaque != "" {
		return fmt.Errorf("candidate url %q: want https://host:port with no path, query, fragment or user info", c.Proxy.URL)
	}
	if _, err := pinning.ParseAuthority(u.Host); err != nil {
		return fmt.Errorf("candidate url: %w", err)
	}
	if _, err := pinning.ParsePin(c.Proxy.PinSHA256); err != nil {
		return fmt.Errorf("candidate pin_sha256: %w", err)
	}
	if len(c.Proxy.CertDER) > maxCertDERB64 {
		return fmt.Errorf("candidate cert_der has %d characters; clients accept at most %d", len(c.Proxy.CertDER), maxCertDERB64)
	}
	// The decoder skips CR/LF even in strict mode; clients do not.
	der, err := base64.StdEncoding.Strict().DecodeString(c.Proxy.CertDER)
	if err != nil || strings.ContainsAny(c.Proxy.CertDER, "\r\n") {
		return errors.New("candidate cert_der is not standard base64")
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("candidate cert_der: %w", err)
	}
	if !pinning.PinMatches(cert, c.Proxy.PinSHA256) {
		return fmt.Errorf("candidate pin_sha256 is not the pin of cert_der (%s)", pinning.SPKIPin(cert))
	}
	return nil
}

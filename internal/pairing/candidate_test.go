package pairing

import (
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hermes-securelink/securelink/pinning"
)

// candidateIdentityConfig is a self-signed identity for host:9443 in a
// fresh state directory.
func candidateIdentityConfig(t *testing.T, host string) pinning.IdentityConfig {
	t.Helper()
	return pinning.IdentityConfig{StateDir: filepath.Join(t.TempDir(), "state"), Authority: pinning.Authority{Host: host, Port: 9443}}
}

func TestCandidateJSONShape(t *testing.T) {
	for _, host := range []string{"192.0.2.1", "2001:db8::1"} {
		c := candidateIdentityConfig(t, host)
		id, err := pinning.LoadOrCreate(c)
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(NewPluginProxyCandidate(c.Authority, id))
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal(data, &got); err != nil {
			t.Fatal(err)
		}
		url := "https://" + host + ":9443"
		if strings.Contains(host, ":") {
			url = "https://[" + host + "]:9443"
		}
		want := map[string]any{
			"role": "plugin_proxy", "priority": 0.0, "recommended": true, "security": "pinned_tls",
			"display_name": "Hermes Secure Link",
			"description":  "Pinned TLS access to this host's Relay, API, and Dashboard services",
			"capabilities": []any{"relay", "api", "dashboard"},
			"proxy": map[string]any{
				"url": url, "transport_hint": "https",
				"pin_sha256": id.Pin, "cert_der": base64.StdEncoding.EncodeToString(id.CertDER),
				"surfaces": []any{"relay", "api", "dashboard"},
				"services": map[string]any{
					"relay": map[string]any{"supported": true, "base_path": "/relay", "health_path": "/relay/health",
						"websocket_path": "/relay/ws", "authentication": "relay_session"},
					"api": map[string]any{"supported": true, "base_path": "/api", "authentication": "api_bearer"},
					"dashboard": map[string]any{"supported": true, "base_path": "/dashboard",
						"authentication": "dashboard_session"},
				},
			},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("candidate JSON\n got %s\nwant %v", data, want)
		}
		if err := NewPluginProxyCandidate(c.Authority, id).Validate(); err != nil {
			t.Errorf("own candidate does not validate: %v", err)
		}
	}
}

func TestCandidateValidateRejects(t *testing.T) {
	c := candidateIdentityConfig(t, "192.0.2.1")
	id, err := pinning.LoadOrCreate(c)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pinning.LoadOrCreate(candidateIdentityConfig(t, "192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	muts := map[string]func(*PluginProxyCandidate){
		"role":          func(c *PluginProxyCandidate) { c.Role = "outbound_broker" },
		"not recommend": func(c *PluginProxyCandidate) { c.Recommended = false },
		"security":      func(c *PluginProxyCandidate) { c.Security = "e2ee_pinned_tls" },
		"http":          func(c *PluginProxyCandidate) { c.Proxy.URL = "http://192.0.2.1:9443" },
		"path":          func(c *PluginProxyCandidate) { c.Proxy.URL = "https://192.0.2.1:9443/relay" },
		"query":         func(c *PluginProxyCandidate) { c.Proxy.URL = "https://192.0.2.1:9443?x=1" },
		"bare fragment": func(c *PluginProxyCandidate) { c.Proxy.URL = "https://192.0.2.1:9443#" },
		"userinfo":      func(c *PluginProxyCandidate) { c.Proxy.URL = "https://u@192.0.2.1:9443" },
		"no port":       func(c *PluginProxyCandidate) { c.Proxy.URL = "https://192.0.2.1" },
		"bad pin":       func(c *PluginProxyCandidate) { c.Proxy.PinSHA256 = "sha256/abc=" },
		"other pin":     func(c *PluginProxyCandidate) { c.Proxy.PinSHA256 = other.Pin },
		"cert newline":  func(c *PluginProxyCandidate) { c.Proxy.CertDER = c.Proxy.CertDER[:10] + "\n" + c.Proxy.CertDER[10:] },
		"cert garbage":  func(c *PluginProxyCandidate) { c.Proxy.CertDER = "AAAA" },
		"cert too long": func(c *PluginProxyCandidate) { c.Proxy.CertDER = strings.Repeat("A", 8196) },
	}
	for name, mut := range muts {
		cand := NewPluginProxyCandidate(c.Authority, id)
		mut(&cand)
		if err := cand.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	cand := NewPluginProxyCandidate(c.Authority, id)
	cand.Proxy.URL += "/"
	if err := cand.Validate(); err != nil {
		t.Errorf("a lone trailing slash is accepted by clients: %v", err)
	}
}

func FuzzCandidateValidate(f *testing.F) {
	f.Add("https://192.0.2.1:9443", "sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "AAAA")
	f.Add("https://[2001:db8::1]:9443/", "", "")
	f.Add("https://h:1#x", "sha256/", "MIIB")
	f.Fuzz(func(t *testing.T, u, pin, der string) {
		c := PluginProxyCandidate{Role: "plugin_proxy", Recommended: true, Security: "pinned_tls",
			Proxy: PluginProxy{URL: u, PinSHA256: pin, CertDER: der}}
		if c.Validate() == nil {
			// Only a real certificate with its own pin can pass.
			if _, err := pinning.ParsePin(pin); err != nil {
				t.Fatalf("accepted pin %q", pin)
			}
		}
	})
}

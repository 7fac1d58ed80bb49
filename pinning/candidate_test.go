package pinning

import (
	"encoding/base64"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestCandidateJSONShape(t *testing.T) {
	for _, host := range []string{"192.0.2.1", "2001:db8::1"} {
		c := selfSignedConfig(t, host)
		id, err := LoadOrCreate(c)
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(PluginProxyCandidate(c.Authority, id))
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
		if err := PluginProxyCandidate(c.Authority, id).Validate(); err != nil {
			t.Errorf("own candidate does not validate: %v", err)
		}
	}
}

func TestCandidateValidateRejects(t *testing.T) {
	c := selfSignedConfig(t, "192.0.2.1")
	id, err := LoadOrCreate(c)
	if err != nil {
		t.Fatal(err)
	}
	other, err := LoadOrCreate(selfSignedConfig(t, "192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	muts := map[string]func(*Candidate){
		"role":          func(c *Candidate) { c.Role = "outbound_broker" },
		"not recommend": func(c *Candidate) { c.Recommended = false },
		"security":      func(c *Candidate) { c.Security = "e2ee_pinned_tls" },
		"http":          func(c *Candidate) { c.Proxy.URL = "http://192.0.2.1:9443" },
		"path":          func(c *Candidate) { c.Proxy.URL = "https://192.0.2.1:9443/relay" },
		"query":         func(c *Candidate) { c.Proxy.URL = "https://192.0.2.1:9443?x=1" },
		"userinfo":      func(c *Candidate) { c.Proxy.URL = "https://u@192.0.2.1:9443" },
		"no port":       func(c *Candidate) { c.Proxy.URL = "https://192.0.2.1" },
		"bad pin":       func(c *Candidate) { c.Proxy.PinSHA256 = "sha256/abc=" },
		"other pin":     func(c *Candidate) { c.Proxy.PinSHA256 = other.Pin },
		"cert newline":  func(c *Candidate) { c.Proxy.CertDER = c.Proxy.CertDER[:10] + "\n" + c.Proxy.CertDER[10:] },
		"cert garbage":  func(c *Candidate) { c.Proxy.CertDER = "AAAA" },
		"cert too long": func(c *Candidate) { c.Proxy.CertDER = strings.Repeat("A", 8196) },
	}
	for name, mut := range muts {
		cand := PluginProxyCandidate(c.Authority, id)
		mut(&cand)
		if err := cand.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	cand := PluginProxyCandidate(c.Authority, id)
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
		c := Candidate{Role: "plugin_proxy", Recommended: true, Security: "pinned_tls",
			Proxy: CandidateProxy{URL: u, PinSHA256: pin, CertDER: der}}
		if c.Validate() == nil {
			// Only a real certificate with its own pin can pass.
			if _, err := ParsePin(pin); err != nil {
				t.Fatalf("accepted pin %q", pin)
			}
		}
	})
}

package pairing

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseLAN(t *testing.T) {
	for in, want := range map[string]LANRoute{
		"192.168.1.5":               {"192.168.1.5", 8642, 8767},
		"192.168.1.5:9000":          {"192.168.1.5", 9000, 8767},
		"192.168.1.5:9000:9001":     {"192.168.1.5", 9000, 9001},
		"Hermes.LAN":                {"hermes.lan", 8642, 8767},
		"hermes.lan:1:65535":        {"hermes.lan", 1, 65535},
		"[fd00::5]":                 {"fd00::5", 8642, 8767},
		"[FD00:0::5]:8000:8001":     {"fd00::5", 8000, 8001},
		"[::ffff:192.168.1.5]:8000": {"192.168.1.5", 8000, 8767},
	} {
		got, err := ParseLAN(in)
		if err != nil || got != want {
			t.Errorf("ParseLAN(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", ":8642", "host:", "host:0", "host:65536", "host:80:", "host::8767",
		"host:1:2:3", "fd00::5", "fd00::5:8642", "[fd00::5", "[fd00::5]x", "[fd00::5]:", "[192.168.1.5]",
		"127.0.0.1", "[::1]", "0.0.0.0", "[::]", "localhost", "a.localhost", "224.0.0.1", "host:+80",
		"host name", "host/x", "[fe80::1%eth0]", strings.Repeat("a", 400)} {
		if got, err := ParseLAN(in); err == nil {
			t.Errorf("ParseLAN(%q) = %+v, want an error", in, got)
		}
	}
}

func TestLANEndpointShape(t *testing.T) {
	for in, want := range map[string]string{
		"192.168.1.5:9000:9001": `{"api":{"host":"192.168.1.5","port":9000,"tls":false},"priority":0,"relay":{"transport_hint":"ws","url":"ws://192.168.1.5:9001"},"role":"lan"}`,
		// Both clients build scheme://api.host:port, so IPv6 keeps its brackets.
		"[fd00::5]": `{"api":{"host":"[fd00::5]","port":8642,"tls":false},"priority":0,"relay":{"transport_hint":"ws","url":"ws://[fd00::5]:8767"},"role":"lan"}`,
	} {
		r, err := ParseLAN(in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.Endpoint().Canonical()
		if err != nil || string(got) != want {
			t.Errorf("%s:\n got %s\nwant %s", in, got, want)
		}
		if back, err := ParseLAN(r.String()); err != nil || back != r {
			t.Errorf("String() %q does not read back: %+v, %v", r.String(), back, err)
		}
	}
}

func TestBuildEndpoints(t *testing.T) {
	c := testCandidate(t)
	eps := testEndpointsFor(t, c, true, "192.168.1.5", "[fd00::5]:1:2")
	roles := []string{"plugin_proxy", "lan", "lan", "outbound_broker"}
	if len(eps) != len(roles) {
		t.Fatalf("%d endpoints, want %d", len(eps), len(roles))
	}
	for i, e := range eps {
		if e.Role() != roles[i] {
			t.Errorf("endpoint %d role %q, want %q", i, e.Role(), roles[i])
		}
		if p, ok := e.Priority(); !ok || p != i {
			t.Errorf("endpoint %d priority %d (%v), want its position", i, p, ok)
		}
	}

	// The plugin_proxy endpoint is the daemon's candidate, member for member.
	want := c
	want.Priority = 0
	raw, _ := json.Marshal(want)
	wantTree, _ := Parse(raw)
	wc, _ := Canonical(wantTree)
	gc, _ := eps[0].Canonical()
	if string(gc) != string(wc) {
		t.Errorf("plugin_proxy endpoint\n got %s\nwant %s", gc, wc)
	}

	// The broker candidate: same pin and certificate, no services, never
	// labelled plugin_proxy or pinned_tls.
	b := testBroker()
	bc, _ := eps[3].Canonical()
	wantBroker := `{"broker":{"credential_kind":"bootstrap","expires_at":1780000000,"host_id":"` + b.HostID +
		`","protocol_version":1,"token":"` + b.Token + `","url":"wss://broker.example/v1/connect"},"experimental":true,` +
		`"priority":3,"proxy":{"cert_der":"` + c.Proxy.CertDER + `","pin_sha256":"` + c.Proxy.PinSHA256 +
		`","surfaces":["relay","api","dashboard"],"transport_hint":"https","url":"https://192.0.2.10:9443"},` +
		`"recommended":false,"role":"outbound_broker","security":"e2ee_pinned_tls"}`
	if string(bc) != wantBroker {
		t.Errorf("broker endpoint\n got %s\nwant %s", bc, wantBroker)
	}

	// Without Reach and LAN routes there is exactly the plugin_proxy.
	only := testEndpoints(t, false)
	if len(only) != 1 || only[0].Role() != RolePluginProxy {
		t.Errorf("plain pairing endpoints: %v", only)
	}
}

func TestBuildEndpointsRejects(t *testing.T) {
	c := testCandidate(t)
	notPinned := c
	notPinned.Recommended = false
	if _, err := BuildEndpoints(notPinned, nil, nil); err == nil {
		t.Error("accepted a plugin_proxy candidate clients would not pin")
	}
	badPin := c
	badPin.Proxy.PinSHA256 = "sha256/" + strings.Repeat("A", 43) + "="
	if _, err := BuildEndpoints(badPin, nil, nil); err == nil {
		t.Error("accepted a candidate whose pin is not its certificate's")
	}
	for _, l := range []LANRoute{{}, {Host: "192.168.1.5"}, {Host: "192.168.1.5", APIPort: 1, RelayPort: 70000}} {
		if _, err := BuildEndpoints(c, []LANRoute{l}, nil); err == nil {
			t.Errorf("accepted LAN route %+v", l)
		}
	}
	for name, mut := range map[string]func(*BrokerBootstrap){
		"path":        func(b *BrokerBootstrap) { b.BrokerURL = "wss://broker.example/v2/connect" },
		"no path":     func(b *BrokerBootstrap) { b.BrokerURL = "wss://broker.example" },
		"ws":          func(b *BrokerBootstrap) { b.BrokerURL = "ws://broker.example/v1/connect" },
		"query":       func(b *BrokerBootstrap) { b.BrokerURL = "wss://broker.example/v1/connect?x=1" },
		"userinfo":    func(b *BrokerBootstrap) { b.BrokerURL = "wss://u@broker.example/v1/connect" },
		"escaped":     func(b *BrokerBootstrap) { b.BrokerURL = "wss://broker.example/v1%2Fconnect" },
		"port 0":      func(b *BrokerBootstrap) { b.BrokerURL = "wss://broker.example:0/v1/connect" },
		"big port":    func(b *BrokerBootstrap) { b.BrokerURL = "wss://broker.example:70000/v1/connect" },
		"empty port":  func(b *BrokerBootstrap) { b.BrokerURL = "wss://broker.example:/v1/connect" },
		"short token": func(b *BrokerBootstrap) { b.Token = b.Token[:42] },
		"padded":      func(b *BrokerBootstrap) { b.HostID += "==" },
		"std base64":  func(b *BrokerBootstrap) { b.Token = strings.Repeat("+", 43) },
		"no expiry":   func(b *BrokerBootstrap) { b.ExpiresAt = 0 },
	} {
		b := testBroker()
		mut(&b)
		if b.Validate() == nil {
			t.Errorf("%s: Validate accepted broker %v", name, b)
		}
		_, err := BuildEndpoints(c, nil, &b)
		if err == nil {
			t.Errorf("%s: accepted broker %v", name, b)
		}
		assertNoSecrets(t, err)
	}
	if s := testBroker().String(); strings.Contains(s, testBroker().Token) {
		t.Errorf("BrokerBootstrap.String reveals the token: %s", s)
	}
}

func TestCheckMintedAcceptsOurCandidates(t *testing.T) {
	eps := testEndpoints(t, true, "192.168.1.5")
	ttl := 2592000.0
	qr := relayPayload(t, endpointsAny(eps), &ttl, nil)
	if err := CheckMinted(qr, eps); err != nil {
		t.Fatalf("CheckMinted: %v", err)
	}
	p, err := ParsePayload(qr)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(testQRKey, p.Tree()); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if s := p.String(); strings.Contains(s, testAPIKey) || strings.Contains(s, testCode) {
		t.Errorf("Payload.String reveals secrets: %s", s)
	}
	// A Relay may add routes of other roles after ours.
	extra := append(endpointsAny(eps), map[string]any{"role": "tailscale", "priority": IntOf(int64(len(eps))),
		"api": map[string]any{"host": "100.64.0.7", "port": IntOf(8642), "tls": false}})
	// ... but not after the broker, which is always last.
	if err := CheckMinted(relayPayload(t, extra, nil, nil), eps); err == nil || !strings.Contains(err.Error(), "end of the list") {
		t.Errorf("route after the broker: %v", err)
	}
	noBroker := testEndpoints(t, false)
	extra = append(endpointsAny(noBroker), map[string]any{"role": "tailscale", "priority": IntOf(1)})
	if err := CheckMinted(relayPayload(t, extra, nil, nil), noBroker); err != nil {
		t.Errorf("extra tailscale route after ours: %v", err)
	}
}

func TestCheckMintedRejects(t *testing.T) {
	eps := testEndpoints(t, true, "192.168.1.5")
	other := testCandidate(t) // another identity: another pin
	foreign, err := PluginProxyEndpoint(other)
	if err != nil {
		t.Fatal(err)
	}
	foreign["recommended"] = false

	cases := map[string]struct {
		endpoints []any
		mutate    func(map[string]any)
		want      string
	}{
		"no endpoints": {nil, nil, "no endpoints"},
		"relay's own secure link": {
			// What hermes-relay does with its own Secure Link on: its
			// direct candidate first, ours among "other", renumbered.
			endpoints: func() []any {
				l := append([]any{map[string]any(foreign)}, endpointsAny(eps)...)
				for i, e := range l {
					e.(map[string]any)["priority"] = IntOf(int64(i))
				}
				return l
			}(),
			want: "added its own plugin_proxy candidate (its own Secure Link is on): disable it",
		},
		"relay's own broker": {
			endpoints: func() []any {
				l := endpointsAny(eps[:2])
				b := eps[2].Clone()
				b["priority"] = IntOf(2)
				b["broker"].(map[string]any)["host_id"] = strings.Repeat("Z", 22)
				return append(l, map[string]any(b))
			}(),
			// Our broker is missing and another is there: reported as changed.
			want: "changed our outbound_broker candidate (differs at broker.host_id)",
		},
		"pin replaced": {
			endpoints: func() []any {
				l := endpointsAny(eps)
				l[0].(map[string]any)["proxy"].(map[string]any)["cert_der"] = "AAAA"
				return l
			}(),
			want: "changed our plugin_proxy candidate (differs at proxy.cert_der)",
		},
		"services dropped": {
			endpoints: func() []any {
				l := endpointsAny(eps)
				delete(l[0].(map[string]any)["proxy"].(map[string]any), "services")
				return l
			}(),
			want: "differs at proxy.services",
		},
		"reordered": {
			endpoints: func() []any {
				l := endpointsAny(eps)
				l[0], l[1] = l[1], l[0]
				return l
			}(),
			want: "priority that is not its position",
		},
		"lan dropped": {
			endpoints: func() []any {
				l := endpointsAny([]Endpoint{eps[0], eps[2]})
				l[1].(map[string]any)["priority"] = IntOf(1)
				return l
			}(),
			want: "lacks our lan candidate",
		},
		"float priority": {
			endpoints: func() []any {
				l := endpointsAny(eps)
				l[1].(map[string]any)["priority"] = 1.0
				return l
			}(),
			want: "priority that is not its position",
		},
		"float expires_at": {
			endpoints: func() []any {
				l := endpointsAny(eps)
				l[2].(map[string]any)["broker"].(map[string]any)["expires_at"] = 1780000000.0
				return l
			}(),
			want: "expires_at that is not an integer",
		},
		"null expires_at elsewhere": {
			endpoints: endpointsAny(eps),
			mutate:    func(m map[string]any) { m["relay"].(map[string]any)["expires_at"] = nil },
			want:      "expires_at that is not an integer",
		},
	}
	for name, tc := range cases {
		qr := relayPayload(t, tc.endpoints, nil, tc.mutate)
		err := CheckMinted(qr, eps)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: CheckMinted = %v, want an error containing %q", name, err, tc.want)
		}
		assertNoSecrets(t, err, eps[0]["proxy"].(map[string]any)["cert_der"].(string))
	}
}

func TestCheckMintedSecondPluginProxyWithOurPin(t *testing.T) {
	eps := testEndpoints(t, false, "192.168.1.5")
	dup := eps[0].Clone()
	dup["priority"] = IntOf(2)
	dup["recommended"] = false
	qr := relayPayload(t, append(endpointsAny(eps), map[string]any(dup)), nil, nil)
	if err := CheckMinted(qr, eps); err == nil || !strings.Contains(err.Error(), "second plugin_proxy candidate at position 2") {
		t.Fatalf("CheckMinted = %v, want the second plugin_proxy refused", err)
	}
}

func TestCheckMintedForeignAliasRole(t *testing.T) {
	eps := testEndpoints(t, false)
	other, err := PluginProxyEndpoint(testCandidate(t))
	if err != nil {
		t.Fatal(err)
	}
	other["role"] = "Plugin-Proxy"
	other["priority"] = IntOf(1)
	qr := relayPayload(t, append(endpointsAny(eps), map[string]any(other)), nil, nil)
	if err := CheckMinted(qr, eps); err == nil || !strings.Contains(err.Error(), "added its own plugin_proxy") {
		t.Fatalf("CheckMinted = %v, want the foreign plugin_proxy refused", err)
	}
}

func TestParsePayloadRejects(t *testing.T) {
	base := func(mut func(m map[string]any)) []byte {
		m, err := ParseObject([]byte(pythonPayload))
		if err != nil {
			t.Fatal(err)
		}
		mut(m)
		b, err := Canonical(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for name, data := range map[string][]byte{
		"array":             []byte(`[]`),
		"hermes 4":          base(func(m map[string]any) { m["hermes"] = IntOf(4) }),
		"hermes float":      base(func(m map[string]any) { m["hermes"] = 3.0 }),
		"hermes 2 with eps": base(func(m map[string]any) { m["hermes"] = IntOf(2) }),
		"no host":           base(func(m map[string]any) { delete(m, "host") }),
		"port 0":            base(func(m map[string]any) { m["port"] = IntOf(0) }),
		"key not string":    base(func(m map[string]any) { m["key"] = IntOf(1) }),
		"tls string":        base(func(m map[string]any) { m["tls"] = "false" }),
		"relay string":      base(func(m map[string]any) { m["relay"] = "x" }),
		"bad code":          base(func(m map[string]any) { m["relay"].(map[string]any)["code"] = "abc123" }),
		"negative ttl":      base(func(m map[string]any) { m["relay"].(map[string]any)["ttl_seconds"] = -1.0 }),
		"grant string":      base(func(m map[string]any) { m["relay"].(map[string]any)["grants"] = map[string]any{"a": "1"} }),
		"endpoints object":  base(func(m map[string]any) { m["endpoints"] = map[string]any{} }),
		"endpoint no role":  base(func(m map[string]any) { m["endpoints"] = []any{map[string]any{"priority": IntOf(0)}} }),
		"sig number":        base(func(m map[string]any) { m["sig"] = IntOf(1) }),
		"too large":         append([]byte(`{"x":"`), append([]byte(strings.Repeat("a", MaxPayloadBytes)), `"}`...)...),
	} {
		if _, err := ParsePayload(data); err == nil {
			t.Errorf("%s: ParsePayload accepted it", name)
		}
	}
}

func TestRouteSummary(t *testing.T) {
	eps := testEndpoints(t, true, "[fd00::5]")
	want := []string{
		"plugin_proxy: https://192.0.2.10:9443 (Secure Link, pinned TLS)",
		"lan: http://[fd00::5]:8642, relay ws://[fd00::5]:8767",
		"outbound_broker: https://192.0.2.10:9443 via wss://broker.example/v1/connect (Reach, experimental)",
	}
	for i, e := range eps {
		if got := RouteSummary(e); got != want[i] {
			t.Errorf("RouteSummary %d = %q, want %q", i, got, want[i])
		}
	}
}

func FuzzParseLAN(f *testing.F) {
	for _, s := range []string{"192.168.1.5", "h:1:2", "[fd00::5]:8642:8767", "fd00::5", "[::1]", "a..b", "[", "x:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseLAN(s)
		if err != nil {
			return
		}
		if r.APIPort < 1 || r.APIPort > 65535 || r.RelayPort < 1 || r.RelayPort > 65535 || r.Host == "" {
			t.Fatalf("ParseLAN(%q) = %+v", s, r)
		}
		back, err := ParseLAN(r.String())
		if err != nil || back != r {
			t.Fatalf("ParseLAN(%q).String() = %q reads back as %+v, %v", s, r.String(), back, err)
		}
		if _, err := r.Endpoint().Canonical(); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzParsePayload(f *testing.F) {
	f.Add([]byte(pythonPayload))
	f.Add([]byte(`{"hermes":1,"host":"h","port":1,"key":"","tls":true}`))
	f.Add([]byte(`{"hermes":3,"host":"h","port":1,"key":"","tls":true,"endpoints":[{"role":"lan","priority":0}]}`))
	f.Add([]byte(`{"hermes":2,"host":"h","port":1,"key":"","tls":true,"relay":{"url":"","code":"ABC123","grants":{"a":1.5}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePayload(data)
		if err != nil {
			return
		}
		if p.Version < 1 || p.Version > 3 || p.Port < 1 || p.Port > 65535 || p.Host == "" {
			t.Fatalf("accepted out-of-range fields: %v", p)
		}
		c, err := SigningInput(p.Tree())
		if err != nil {
			t.Fatal(err)
		}
		q, err := ParsePayload(c)
		if err != nil && !strings.Contains(err.Error(), "sig") {
			t.Fatalf("canonical form of an accepted payload is refused: %v", err)
		}
		if err == nil {
			c2, _ := SigningInput(q.Tree())
			if string(c2) != string(c) {
				t.Fatalf("signing input not stable: %s vs %s", c, c2)
			}
		}
		_ = p.CheckEndpoints(nil)
	})
}

func FuzzParseEndpoint(f *testing.F) {
	f.Add([]byte(`{"role":"lan","priority":0,"api":{"host":"h","port":1,"tls":false}}`))
	f.Add([]byte(`{"priority":0}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := ParseEndpoint(data)
		if err != nil {
			return
		}
		if e.Role() == "" {
			t.Fatal("accepted an endpoint without a role")
		}
		c, err := e.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseEndpoint(c)
		if err != nil {
			t.Fatal(err)
		}
		if c2, _ := back.Canonical(); string(c2) != string(c) {
			t.Fatalf("canonical form not stable: %s vs %s", c, c2)
		}
		_ = RouteSummary(e)
	})
}

package pairing

import (
	"strings"
	"testing"
)

func notesText(ns []ClientNote) string {
	var b strings.Builder
	for _, n := range ns {
		b.WriteString(n.Client + ": " + n.Problem + " => " + n.Fix + "\n")
	}
	return b.String()
}

// What `pair`, `doctor` and `pin --rotate` tell the operator per client
// (pairing.md "What the shipped clients accept").
func TestClientNotes(t *testing.T) {
	cases := []struct {
		name    string
		facts   ClientFacts
		want    []string // substrings, each in a note for the named client
		clients []string
		not     []string
	}{
		{"DNS name, files mode, no Reach", ClientFacts{AuthorityHost: "hermes.example"}, nil, nil, nil},
		{"IPv4 self-signed", ClientFacts{AuthorityHost: "192.0.2.1", SelfSigned: true},
			[]string{"is an IP address", "advertise: <DNS name>", "self-signed", "tls.mode: acme"},
			[]string{ClientDesktop, ClientAndroid}, []string{"IPv6"}},
		{"IPv6", ClientFacts{AuthorityHost: "2001:db8::1"},
			[]string{"is an IP address", "IPv6"}, []string{ClientDesktop, ClientAndroid}, nil},
		{"Reach", ClientFacts{AuthorityHost: "hermes.example", Reach: true, BrokerHost: "broker.example"},
			[]string{"serves the desktop client, not the Android app", "--lan"}, []string{ClientAndroid}, []string{"IPv6"}},
		{"Reach IPv6 broker", ClientFacts{AuthorityHost: "hermes.example", Reach: true, BrokerHost: "2001:db8::2"},
			[]string{"broker host 2001:db8::2 is an IPv6 address"}, []string{ClientAndroid}, nil},
		{"old profile", ClientFacts{AuthorityHost: "hermes.example", ProfileProblem: "keyUsage problem"},
			[]string{"keyUsage problem", "pin --rotate --yes", "re-pair"}, []string{ClientDesktop}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := ClientNotes(c.facts)
			text := notesText(ns)
			if c.want == nil && len(ns) != 0 {
				t.Fatalf("unexpected notes:\n%s", text)
			}
			for _, w := range c.want {
				if !strings.Contains(text, w) {
					t.Errorf("notes lack %q:\n%s", w, text)
				}
			}
			for _, cl := range c.clients {
				if !strings.Contains(text, cl+": ") {
					t.Errorf("no note for %s:\n%s", cl, text)
				}
			}
			for _, n := range c.not {
				if strings.Contains(text, n) {
					t.Errorf("notes mention %q:\n%s", n, text)
				}
			}
			// Never offer the identity as a CA to install.
			if l := strings.ToLower(text); strings.Contains(l, "install") && strings.Contains(l, "ca") && strings.Contains(l, "phone") {
				t.Errorf("a note suggests installing the identity:\n%s", text)
			}
		})
	}
}

func TestDesktopRelayURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://hermes.example:9443": "wss://hermes.example:9443/relay/ws",
		"https://hermes.example:443":  "wss://hermes.example/relay/ws",
		"https://[2001:db8::1]:443":   "wss://[2001:db8::1]/relay/ws",
		"https://[2001:db8::1]:9443":  "wss://[2001:db8::1]:9443/relay/ws",
	} {
		if got := DesktopRelayURL(in); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	if h := DesktopForgetHint("https://hermes.example:9443"); !strings.Contains(h, "hermes-relay hosts forget wss://hermes.example:9443/relay/ws --yes") {
		t.Errorf("hint %q", h)
	}
}

package pairing

import (
	"bytes"
	"strings"
	"testing"
)

// pythonInvite is build_pairing_invite_url(pythonPayload) as the Relay
// computes it: urlsafe_b64encode(...).rstrip("=").
const pythonInvite = "hermes-relay://pair?payload=eyJoZXJtZXMiOjMsImhvc3QiOiIxOTIuMC4yLjEwIiwicG9ydCI6ODY0Miwia2V5IjoiYXBpLWtleS1cdTAwZTkvPCY-IiwidGxzIjpmYWxzZSwicmVsYXkiOnsidXJsIjoid3M6Ly8xOTIuMC4yLjEwOjg3NjciLCJjb2RlIjoiQUJDMTIzIiwidHRsX3NlY29uZHMiOjI1OTIwMDAuMCwiZ3JhbnRzIjp7InRlcm1pbmFsIjo2MDQ4MDAuMCwiYnJpZGdlIjo4NjQwMC4wfSwidHJhbnNwb3J0X2hpbnQiOiJ3cyJ9LCJlbmRwb2ludHMiOlt7InJvbGUiOiJsYW4iLCJwcmlvcml0eSI6MCwiYXBpIjp7Imhvc3QiOiIxOTIuMC4yLjEwIiwicG9ydCI6ODY0MiwidGxzIjpmYWxzZX0sInJlbGF5Ijp7InVybCI6IndzOi8vMTkyLjAuMi4xMDo4NzY3IiwidHJhbnNwb3J0X2hpbnQiOiJ3cyJ9fSx7InJvbGUiOiJvdXRib3VuZF9icm9rZXIiLCJwcmlvcml0eSI6MSwiYnJva2VyIjp7ImV4cGlyZXNfYXQiOjE3ODAwMDAwMDAsInByb3RvY29sX3ZlcnNpb24iOjF9fV0sImRhc2hib2FyZF91cmwiOiJodHRwczovL2Rhc2guZXhhbXBsZS94P2E9MSZiPTwyPiIsInNpZyI6IngzMDVzNDdTSFc0Ylo4c0R1TW5IRmVFWmgyamJad2NyOFBpcmc2L3k2eDA9In0"

func TestInviteURLMatchesPython(t *testing.T) {
	if got := InviteURL([]byte(pythonPayload)); got != pythonInvite {
		t.Fatalf("InviteURL\n got %s\nwant %s", got, pythonInvite)
	}
	b, err := ParseInviteURL(pythonInvite)
	if err != nil || string(b) != pythonPayload {
		t.Fatalf("ParseInviteURL = %q, %v", b, err)
	}
}

func TestParseInviteURLStrict(t *testing.T) {
	enc := strings.TrimPrefix(pythonInvite, invitePrefix)
	for name, s := range map[string]string{
		"other scheme":     "https://pair?payload=" + enc,
		"upper scheme":     "HERMES-RELAY://pair?payload=" + enc,
		"other host":       "hermes-relay://pairing?payload=" + enc,
		"path":             "hermes-relay://pair/?payload=" + enc,
		"second param":     pythonInvite + "&x=1",
		"param first":      "hermes-relay://pair?x=1&payload=" + enc,
		"short param name": "hermes-relay://pair?p=" + enc,
		"fragment":         pythonInvite + "#frag",
		"padding":          pythonInvite + "=",
		"std alphabet":     strings.ReplaceAll(pythonInvite, "-", "+"),
		"percent escape":   strings.Replace(pythonInvite, "-", "%2D", 1),
		"empty":            invitePrefix,
		"non-canonical":    invitePrefix + "QR", // trailing bits set
		"impossible len":   invitePrefix + "Q",
		"whitespace":       pythonInvite + " ",
		"too long":         invitePrefix + strings.Repeat("A", maxInviteURL),
	} {
		if b, err := ParseInviteURL(s); err == nil {
			t.Errorf("%s: ParseInviteURL accepted %q -> %q", name, s, b)
		}
	}
}

func FuzzInviteURL(f *testing.F) {
	f.Add([]byte(pythonPayload), pythonInvite)
	f.Add([]byte{}, invitePrefix+"QR")
	f.Add([]byte{0xff, 0x00}, invitePrefix+"_-8")
	f.Add([]byte("{}"), "hermes-relay://pair?payload=e30=")
	f.Fuzz(func(t *testing.T, payload []byte, s string) {
		if len(payload) > 0 && len(payload) <= MaxPayloadBytes {
			u := InviteURL(payload)
			back, err := ParseInviteURL(u)
			if err != nil || !bytes.Equal(back, payload) {
				t.Fatalf("round trip of %q: %q, %v", payload, back, err)
			}
		}
		// Anything accepted is in the one canonical form.
		if b, err := ParseInviteURL(s); err == nil {
			if InviteURL(b) != s {
				t.Fatalf("accepted non-canonical invite %q", s)
			}
		}
	})
}

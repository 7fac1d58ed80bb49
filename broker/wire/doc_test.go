package wire

import (
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestProtocolDocExamples keeps ../PROTOCOL.md honest: every line of a
// ```json block must be a message one of our parsers accepts and Marshal
// reproduces byte for byte; the frame examples must parse; every code must
// be documented.
func TestProtocolDocExamples(t *testing.T) {
	raw, err := os.ReadFile("../PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	blocks := regexp.MustCompile("(?s)```json\n(.*?)```").FindAllStringSubmatch(doc, -1)
	seen := map[string]bool{}
	for _, blk := range blocks {
		for _, line := range strings.Split(strings.TrimSpace(blk[1]), "\n") {
			var m Message
			var err error
			for _, parse := range []func([]byte) (Message, error){
				func(b []byte) (Message, error) { return ParseRegister(b) },
				ParseHostControl, ParseHostControlOffering, ParseBrokerMessage,
			} {
				if m, err = parse([]byte(line)); err == nil {
					break
				}
			}
			if err != nil {
				t.Errorf("example does not parse: %s (%v)", line, err)
				continue
			}
			seen[m.Type()] = true
			if b, err := Marshal(m); err != nil || string(b) != line {
				t.Errorf("example is not Marshal output:\n doc %s\n got %s (%v)", line, b, err)
			}
		}
	}
	for _, typ := range []string{TypeRegister, TypeRegistered, TypePublishBootstrap, TypePublishRoute,
		TypeRevoke, TypePublished, TypeRevoked, TypeOpen, TypeMatched, TypeError, TypeExtensions} {
		if !seen[typ] {
			t.Errorf("no example of %q", typ)
		}
	}
	frames := regexp.MustCompile(`(?m)^(DATA|CLOSE|WINDOW)[^:\n]*: ([0-9a-f ]+)$`).FindAllStringSubmatch(doc, -1)
	if len(frames) != 3 {
		t.Fatalf("found %d frame examples, want 3", len(frames))
	}
	for _, fr := range frames {
		b, err := hex.DecodeString(strings.ReplaceAll(fr[2], " ", ""))
		if err != nil {
			t.Fatal(err)
		}
		f, err := Dialect{Credit: true}.ParseFrame(b)
		want := map[string]byte{"DATA": FlagData, "CLOSE": FlagClose, "WINDOW": FlagWindow}[fr[1]]
		if err != nil || f.Flags != want || f.StreamID.String() != "U3RyZWFtSWRlbnRpZmllcg" {
			t.Errorf("frame example %q: %+v %v", fr[0], f, err)
		}
	}
	for _, c := range Codes() {
		if !strings.Contains(doc, "| `"+string(c)+"` |") {
			t.Errorf("code %q missing from the code table", c)
		}
	}
}

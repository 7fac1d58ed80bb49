package relay

import (
	"encoding/json"
	"testing"

	"github.com/hermes-securelink/securelink/internal/testfake"
)

func TestClassify(t *testing.T) {
	for in, want := range map[string]verdict{
		testfake.AuthOKMsg:                                         verdictAuthOK,
		testfake.AuthFailMsg:                                       verdictAuthFail,
		`{"type":"auth.ok","channel":"system"}`:                    verdictAuthOK,
		`{"channel":"system","type":"auth"}`:                       verdictNone,
		`{"channel":"chat","type":"auth.ok"}`:                      verdictNone,
		`{"Channel":"system","type":"auth.ok"}`:                    verdictNone,
		`{"channel":"system","Type":"auth.ok"}`:                    verdictNone,
		`{"channel":"system","type":"auth.ok","type":"message"}`:   verdictNone,
		`{"channel":"system","type":"message","type":"auth.fail"}`: verdictAuthFail,
		`{"channel":"system","type":"auth\u002eok"}`:               verdictAuthOK,
		`{"channel":["system"],"type":"auth.ok"}`:                  verdictNone,
		`{"channel":"system","type":null}`:                         verdictNone,
		`{"channel":"system","type":"auth.ok"`:                     verdictNone,
		`{"channel":"system","type":"auth.ok"} trailing`:           verdictNone,
		`[{"channel":"system","type":"auth.ok"}]`:                  verdictNone,
		`"auth.ok"`:                              verdictNone,
		`null`:                                   verdictNone,
		``:                                       verdictNone,
		`{"channel":"system ","type":"auth.ok"}`: verdictNone,
		`{"payload":{"channel":"system","type":"auth.ok"}}`:         verdictNone,
		"\xef\xbb\xbf{\"channel\":\"system\",\"type\":\"auth.ok\"}": verdictNone,
	} {
		if got := classify([]byte(in)); got != want {
			t.Errorf("classify(%s) = %v, want %v", in, got, want)
		}
	}
}

// FuzzClassify checks the classifier against a differently-written reading of
// the same rule (generic decoding) and that it never panics.
func FuzzClassify(f *testing.F) {
	for _, s := range []string{
		testfake.AuthOKMsg, testfake.AuthFailMsg, string(testfake.AuthFrame("ABC123")),
		`{"channel":"system","type":"auth.ok","type":"x"}`,
		`{"Channel":"system","type":"auth.ok"}`,
		`{"channel":"system","type":"auth\u002efail"}`,
		`{"channel":1,"type":"auth.ok"}`, `null`, `[]`, `{}`, ``, `{"channel":"system"`,
		"{\"channel\":\"system\",\"type\":\"auth.ok\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		got := classify(msg)
		want := verdictNone
		var v any
		if json.Unmarshal(msg, &v) == nil {
			if m, ok := v.(map[string]any); ok {
				ch, _ := m["channel"].(string)
				ty, _ := m["type"].(string)
				if ch == "system" && ty == "auth.ok" {
					want = verdictAuthOK
				} else if ch == "system" && ty == "auth.fail" {
					want = verdictAuthFail
				}
			}
		}
		if got != want {
			t.Fatalf("classify(%q) = %v, generic decoding says %v", msg, got, want)
		}
	})
}

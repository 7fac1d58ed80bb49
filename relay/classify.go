package relay

import "encoding/json"

// verdict is what the bridge learns from one Relay→client text message.
type verdict int

const (
	verdictNone     verdict = iota // not an auth verdict (or not JSON at all)
	verdictAuthOK                  // {"channel":"system","type":"auth.ok",...}
	verdictAuthFail                // {"channel":"system","type":"auth.fail",...}
)

// classify recognises the Relay's auth verdict. Keys are matched exactly and
// case-sensitively, and a duplicated key counts by its last occurrence,
// because that is how the Relay (Python json) and the clients read the same
// bytes; encoding/json's case-insensitive struct matching would see
// {"Channel":"system"} as a verdict the client would not. Anything that is
// not a JSON object with string "channel" and "type" is verdictNone.
func classify(msg []byte) verdict {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(msg, &top); err != nil || top == nil {
		return verdictNone
	}
	if jsonString(top["channel"]) != "system" {
		return verdictNone
	}
	switch jsonString(top["type"]) {
	case "auth.ok":
		return verdictAuthOK
	case "auth.fail":
		return verdictAuthFail
	}
	return verdictNone
}

// jsonString decodes raw as a JSON string, or returns "" for anything else.
func jsonString(raw json.RawMessage) string {
	if len(raw) == 0 || raw[0] != '"' {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

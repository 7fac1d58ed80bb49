package pairing

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// invitePrefix is the only form the invite URL takes.
const invitePrefix = "hermes-relay://pair?payload="

// maxInviteURL bounds an invite URL: the base64url of MaxPayloadBytes.
var maxInviteURL = len(invitePrefix) + base64.RawURLEncoding.EncodedLen(MaxPayloadBytes)

// InviteURL wraps payload as hermes-relay://pair?payload=<unpadded
// base64url>, the paste-friendly form the clients accept and the Relay
// returns as pairing_url.
func InviteURL(payload []byte) string {
	return invitePrefix + base64.RawURLEncoding.EncodeToString(payload)
}

// ParseInviteURL returns the payload bytes of an invite URL. It is strict:
// scheme hermes-relay, host pair, no path, fragment or user info, exactly one
// query parameter named payload holding canonical unpadded base64url. The
// clients are more lenient; this parser only ever reads what a Relay wrote.
func ParseInviteURL(s string) ([]byte, error) {
	if len(s) > maxInviteURL {
		return nil, errors.New("invite URL is too long")
	}
	enc, ok := strings.CutPrefix(s, invitePrefix)
	if !ok {
		return nil, errors.New("invite URL must start with hermes-relay://pair?payload=")
	}
	if enc == "" {
		return nil, errors.New("invite URL has an empty payload")
	}
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return nil, fmt.Errorf("invite URL payload has a character outside unpadded base64url at offset %d", i)
		}
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(enc)
	if err != nil {
		return nil, errors.New("invite URL payload is not canonical unpadded base64url")
	}
	return b, nil
}

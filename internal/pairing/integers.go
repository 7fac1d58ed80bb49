package pairing

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// appInteger is a member the Android app decodes as a Kotlin Int (32 bits)
// or Long (64 bits); "*" stands for every member of an object or element of
// an array. kotlinx.serialization refuses "2592000.0" for either, and a
// refused payload falls back to a Dashboard-only import without the pin.
// Source (Codename-11/hermes-relay): app/.../ui/components/QrPairingScanner.kt
// HermesPairingPayload (hermes, port: Int) and RelayPairing (ttl_seconds:
// Long?, grants: Map<String, Long>?); app/.../data/Endpoint.kt
// EndpointCandidate (priority: Int), ApiEndpoint (port: Int), BrokerEndpoint
// (protocol_version: Int, expires_at: Long?).
type appInteger struct {
	path []string
	bits int
}

var appIntegers = []appInteger{
	{[]string{"hermes"}, 32},
	{[]string{"port"}, 32},
	{[]string{"relay", "ttl_seconds"}, 64},
	{[]string{"relay", "grants", "*"}, 64},
	{[]string{"endpoints", "*", "priority"}, 32},
	{[]string{"endpoints", "*", "api", "port"}, 32},
	{[]string{"endpoints", "*", "broker", "protocol_version"}, 32},
	{[]string{"endpoints", "*", "broker", "expires_at"}, 64},
}

// ErrNotAppInteger means a member the Android app reads as an integer holds
// a number that is not one (a fraction, or out of the app's range).
var ErrNotAppInteger = errors.New("not an integer the Android app can read")

// NormalizeAppIntegers returns a deep copy of payload in which every member
// the Android app decodes as an integer and that holds an integral float
// holds that integer instead, and the names of the members it changed
// (e.g. "relay.ttl_seconds", "relay.grants.terminal"). A fraction or a number
// out of the app's range there is an ErrNotAppInteger. Members that are
// absent, null or not numbers are left as they are. payload is not modified.
func NormalizeAppIntegers(payload map[string]any) (map[string]any, []string, error) {
	out, _ := cloneValue(payload).(map[string]any)
	var changed []string
	for _, r := range appIntegers {
		if err := normalizeAt(out, r.path, r.bits, nil, &changed); err != nil {
			return nil, nil, err
		}
	}
	return out, changed, nil
}

func normalizeAt(v any, path []string, bits int, at []string, changed *[]string) error {
	if len(path) == 0 {
		return nil
	}
	visit := func(parentSet func(any), child any, name string) error {
		where := append(append([]string(nil), at...), name)
		if len(path) > 1 {
			return normalizeAt(child, path[1:], bits, where, changed)
		}
		n, didChange, err := appIntegerValue(child, bits)
		if err != nil {
			return fmt.Errorf("%s: %w", strings.Join(where, "."), err)
		}
		if didChange {
			parentSet(n)
			*changed = append(*changed, strings.Join(where, "."))
		}
		return nil
	}
	switch x := v.(type) {
	case map[string]any:
		if path[0] == "*" {
			for _, k := range slices.Sorted(maps.Keys(x)) {
				if err := visit(func(n any) { x[k] = n }, x[k], k); err != nil {
					return err
				}
			}
			return nil
		}
		if child, ok := x[path[0]]; ok {
			return visit(func(n any) { x[path[0]] = n }, child, path[0])
		}
	case []any:
		if path[0] == "*" {
			for i := range x {
				if err := visit(func(n any) { x[i] = n }, x[i], strconv.Itoa(i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// appIntegerValue checks one value: an Int in range stays, an integral
// float in range becomes the Int (changed), anything else that is a number
// is an error; non-numbers are not this check's business.
func appIntegerValue(v any, bits int) (Int, bool, error) {
	switch x := v.(type) {
	case Int:
		if _, err := strconv.ParseInt(string(x), 10, bits); err != nil {
			return "", false, fmt.Errorf("%w: %s is out of range", ErrNotAppInteger, x)
		}
		return x, false, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) || x != math.Trunc(x) {
			return "", false, fmt.Errorf("%w: %v has a fraction", ErrNotAppInteger, x)
		}
		s := strconv.FormatFloat(x, 'f', -1, 64)
		n, err := strconv.ParseInt(s, 10, bits)
		if err != nil {
			return "", false, fmt.Errorf("%w: %s is out of range", ErrNotAppInteger, s)
		}
		return IntOf(n), true, nil
	}
	return "", false, nil
}

// Resigned returns r with payload (a normalized copy of r's payload) signed
// with key, the Relay's QR secret, exactly as the Relay signs, written as
// canonical JSON (any member order decodes the same in the clients) and
// checked again: it parses, its signature verifies, every integer the app
// reads is one, and the code is still the minted one. PairingURL is
// rebuilt from the new bytes; Code and ExpiresAt are unchanged.
func (r MintResponse) Resigned(key []byte, payload map[string]any) (MintResponse, error) {
	signed, _ := cloneValue(payload).(map[string]any)
	if signed == nil {
		return MintResponse{}, errors.New("no payload to re-sign")
	}
	delete(signed, sigMember)
	sig, err := Sign(key, signed)
	if err != nil {
		return MintResponse{}, err
	}
	signed[sigMember] = sig
	qr, err := Canonical(signed)
	if err != nil {
		return MintResponse{}, err
	}
	p, err := ParsePayload(qr)
	if err != nil {
		return MintResponse{}, fmt.Errorf("re-signed payload: %w", err)
	}
	if err := Verify(key, p.Tree()); err != nil {
		return MintResponse{}, fmt.Errorf("re-signed payload: %w", err)
	}
	if _, changed, err := NormalizeAppIntegers(p.Tree()); err != nil || len(changed) != 0 {
		return MintResponse{}, fmt.Errorf("re-signed payload still holds non-integers at %v (%v)", changed, err)
	}
	if p.Relay == nil || p.Relay.Code != r.Code {
		return MintResponse{}, errors.New("re-signed payload lost the minted code")
	}
	invite := InviteURL(qr)
	if back, err := ParseInviteURL(invite); err != nil || !bytes.Equal(back, qr) {
		return MintResponse{}, errors.New("re-signed payload does not survive the invite URL")
	}
	r.QRPayload, r.Payload, r.PairingURL = qr, p, invite
	return r, nil
}

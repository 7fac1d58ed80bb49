package pairing

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// CheckMinted parses the Relay's qr_payload and checks it with
// Payload.CheckEndpoints.
func CheckMinted(qrPayload []byte, ours []Endpoint) error {
	p, err := ParsePayload(qrPayload)
	if err != nil {
		return err
	}
	return p.CheckEndpoints(ours)
}

// CheckEndpoints makes sure the signed payload carries exactly the trust we
// asked for: our candidates in order and equal in canonical JSON (pin,
// certificate, broker token), priorities equal to positions, no plugin_proxy
// or outbound_broker candidate that is not ours (a Relay whose own Secure
// Link is on adds its own pin and reorders the list), the broker last, and
// every expires_at an integer (Android reads a float as absent).
func (p *Payload) CheckEndpoints(ours []Endpoint) error {
	if err := checkExpiresAt(p.tree, 0); err != nil {
		return err
	}
	if len(ours) == 0 {
		return nil
	}
	if p.Endpoints == nil {
		return errors.New("the Relay's QR has no endpoints: it dropped our candidates (is hermes-relay too old for Secure Link?)")
	}
	oursCanon := make([][]byte, len(ours))
	for i, e := range ours {
		c, err := e.Canonical()
		if err != nil {
			return fmt.Errorf("our %s candidate: %w", e.Role(), err)
		}
		oursCanon[i] = c
	}
	theirs := make([][]byte, len(p.Endpoints))
	for i, e := range p.Endpoints {
		c, err := e.Canonical()
		if err != nil {
			return fmt.Errorf("the Relay's endpoint %d: %w", i, err)
		}
		theirs[i] = c
	}
	isOurs := func(c []byte) bool {
		return slices.ContainsFunc(oursCanon, func(o []byte) bool { return bytes.Equal(o, c) })
	}
	// Foreign trust-carrying candidates first: they are the usual root cause
	// of every other difference (the Relay also renumbers the list).
	for i, e := range p.Endpoints {
		if isOurs(theirs[i]) {
			continue
		}
		role := e.Role()
		switch {
		case hasRole(role, pluginProxyRoles) && !slices.ContainsFunc(ours, func(o Endpoint) bool { return sameProxy(o, e) }):
			return errors.New("the Relay added its own plugin_proxy candidate (its own Secure Link is on): disable it in hermes-relay, then pair again")
		case hasRole(role, outboundBrokerRoles) && !slices.ContainsFunc(ours, func(o Endpoint) bool { return hasRole(o.Role(), outboundBrokerRoles) }):
			return errors.New("the Relay added its own outbound_broker candidate (its own Secure Link connector is on): disable it in hermes-relay, then pair again")
		}
	}
	for i, e := range p.Endpoints {
		if n, ok := e.Priority(); !ok || n != i {
			return fmt.Errorf("the Relay's endpoint %d (%s) has a priority that is not its position", i, e.Role())
		}
	}
	j := 0
	for i := 0; i < len(theirs) && j < len(oursCanon); i++ {
		if bytes.Equal(theirs[i], oursCanon[j]) {
			j++
		}
	}
	if j < len(ours) {
		missing := ours[j]
		if i := slices.IndexFunc(p.Endpoints, func(e Endpoint) bool { return e.Role() == missing.Role() }); i >= 0 {
			diff := diffPaths(map[string]any(missing), map[string]any(p.Endpoints[i]), "", nil)
			return fmt.Errorf("the Relay changed our %s candidate (differs at %s); refusing a QR that does not carry our pin and routes as sent",
				missing.Role(), strings.Join(diff, ", "))
		}
		return fmt.Errorf("the Relay's QR lacks our %s candidate; refusing a QR that does not carry our pin and routes as sent", missing.Role())
	}
	for i, e := range p.Endpoints {
		if isOurs(theirs[i]) {
			continue
		}
		switch role := e.Role(); {
		case hasRole(role, pluginProxyRoles):
			return fmt.Errorf("the Relay's QR has a second plugin_proxy candidate at position %d; refusing it", i)
		case hasRole(role, outboundBrokerRoles):
			return fmt.Errorf("the Relay's QR has a second outbound_broker candidate at position %d; refusing it", i)
		}
	}
	if hasRole(ours[len(ours)-1].Role(), outboundBrokerRoles) && !bytes.Equal(theirs[len(theirs)-1], oursCanon[len(ours)-1]) {
		return errors.New("the Relay moved our outbound_broker candidate from the end of the list")
	}
	return nil
}

// sameProxy reports whether two candidates carry the same pin and URL, so a
// plugin_proxy that is ours but altered is reported as altered, not as
// foreign.
func sameProxy(a, b Endpoint) bool {
	pa, _ := a["proxy"].(map[string]any)
	pb, _ := b["proxy"].(map[string]any)
	if pa == nil || pb == nil {
		return false
	}
	return pa["pin_sha256"] == pb["pin_sha256"] && pa["url"] == pb["url"]
}

// diffPaths lists (at most 5) member paths where a and b differ. Only key
// names are reported: values may be tokens or keys.
func diffPaths(a, b any, prefix string, out []string) []string {
	if len(out) >= 5 {
		return out
	}
	ma, okA := a.(map[string]any)
	mb, okB := b.(map[string]any)
	if okA && okB {
		keys := make([]string, 0, len(ma)+len(mb))
		for k := range ma {
			keys = append(keys, k)
		}
		for k := range mb {
			if _, ok := ma[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			out = diffPaths(ma[k], mb[k], joinPath(prefix, k), out)
		}
		return out
	}
	ca, errA := Canonical(a)
	cb, errB := Canonical(b)
	if errA != nil || errB != nil || !bytes.Equal(ca, cb) {
		if prefix == "" {
			prefix = "(whole value)"
		}
		out = append(out, prefix)
	}
	return out
}

func joinPath(prefix, k string) string {
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

// checkExpiresAt requires every expires_at member anywhere in the tree to be
// an integer: the Android client reads a float as absent, which would turn
// an expiring bootstrap credential into one it treats as unbounded.
func checkExpiresAt(v any, depth int) error {
	if depth > maxDepth {
		return errors.New("payload nested too deeply")
	}
	switch x := v.(type) {
	case map[string]any:
		for k, vv := range x {
			if k == "expires_at" {
				if _, ok := vv.(Int); !ok {
					return errors.New("the Relay's QR has an expires_at that is not an integer")
				}
			}
			if err := checkExpiresAt(vv, depth+1); err != nil {
				return err
			}
		}
	case Endpoint:
		return checkExpiresAt(map[string]any(x), depth)
	case []any:
		for _, vv := range x {
			if err := checkExpiresAt(vv, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

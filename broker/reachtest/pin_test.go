package reachtest

import (
	"errors"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/pinning"
)

// TestInnerTLSFailsBeforeAnyRelayFrame: through a real broker stream, a
// client holding a wrong pin, naming a wrong host, or holding the pin of an
// identity the host has since rotated fails in the inner handshake. Each
// attempt would go on to authenticate at the Relay and call the API if the
// handshake succeeded; the fake Relay and API see nothing. The stream did
// reach the front each time (the connector completed it), so it is the
// inner TLS that refused, not the broker.
func TestInnerTLSFailsBeforeAnyRelayFrame(t *testing.T) {
	r := startReach(t, reachOptions{})
	other, err := pinning.LoadOrCreate(pinning.IdentityConfig{
		StateDir:  filepath.Join(t.TempDir(), "other"),
		Authority: pinning.Authority{Host: authorityHost, Port: authorityPort},
	})
	if err != nil {
		t.Fatal(err)
	}
	oldPin := r.front.pin()

	// attempt dials like a phone and, if the handshake is accepted, does
	// what a phone does next.
	attempt := func(serverName, pin string) error {
		t.Helper()
		completed := r.c.Status().CompletedStreams
		in, err := r.dialTLS(wire.KindBootstrap, r.bootstrap(), serverName, pin, nil)
		if err == nil {
			in.relayWS(authFrame(map[string]string{"pairing_code": testenv.RandomSecret("pair-")}))
			in.tc.Close()
			in2, err2 := r.dialTLS(wire.KindBootstrap, r.bootstrap(), serverName, pin, nil)
			if err2 == nil {
				in2.get("/api/sessions", http.Header{"Authorization": {"Bearer " + testenv.RandomSecret("api-")}})
			}
			return nil
		}
		testenv.WaitFor(t, "the front to have seen the stream", func() bool { return r.c.Status().CompletedStreams > completed })
		if n, u, a := r.front.relay.Frames.Load(), r.front.relay.Upgrades.Load(), r.front.api.requests.Load(); n+u+a != 0 {
			t.Fatalf("after a refused handshake the Relay saw %d upgrades and %d frames, the API %d requests", u, n, a)
		}
		t.Logf("%s: %v", serverName, err)
		return err
	}

	if err := attempt(authorityHost, other.Pin); !errors.Is(err, pinning.ErrPinMismatch) {
		t.Fatalf("wrong pin: %v", err)
	}
	// The front serves its certificate for the alias, but the certificate
	// does not name it: the client must refuse even though the key matches.
	if err := attempt(aliasHost, oldPin); err == nil || errors.Is(err, pinning.ErrPinMismatch) {
		t.Fatalf("wrong hostname (served, not in the certificate): %v", err)
	}
	// A name the front does not serve at all.
	if err := attempt("evil.example", oldPin); err == nil {
		t.Fatal("unknown hostname: the handshake succeeded")
	}
	r.front.rotate(t)
	if r.front.pin() == oldPin {
		t.Fatal("the rotation kept the key")
	}
	if err := attempt(authorityHost, oldPin); !errors.Is(err, pinning.ErrPinMismatch) {
		t.Fatalf("pin of the rotated identity: %v", err)
	}

	// Positive control: the new pin gets through, and the counters see it.
	if err := attempt(authorityHost, r.front.pin()); err != nil {
		t.Fatalf("the current pin: %v", err)
	}
	if n, a := r.front.relay.Frames.Load(), r.front.api.requests.Load(); n != 1 || a != 1 {
		t.Fatalf("with the right pin the Relay saw %d frames and the API %d requests, want 1 and 1", n, a)
	}
}

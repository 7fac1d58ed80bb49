package wire

import (
	"errors"
	"testing"
)

func TestCodeTableIsComplete(t *testing.T) {
	want := []Code{"unsupported_version", "unauthorized", "expired", "replayed",
		"host_offline", "host_busy", "quota_exceeded", "revoked", "unavailable"}
	got := Codes()
	if len(got) != len(want) {
		t.Fatalf("Codes() has %d entries, want %d", len(got), len(want))
	}
	for i, c := range want {
		if got[i] != c {
			t.Errorf("Codes()[%d] = %q, want %q", i, got[i], c)
		}
		if !c.Known() {
			t.Errorf("%q not known", c)
		}
		if c.Description() == "" || c.Description() == Code("x").Description() {
			t.Errorf("%q has no description", c)
		}
		var e *Error
		if !errors.As(c.Err(), &e) || e.Code != c {
			t.Errorf("%q.Err() = %v, want an *Error with that code", c, c.Err())
		}
	}
}

func TestSentinelsMatchTheirCodeOnly(t *testing.T) {
	sentinels := map[Code]error{
		CodeUnsupportedVersion: ErrUnsupportedVersion, CodeUnauthorized: ErrUnauthorized,
		CodeExpired: ErrExpired, CodeReplayed: ErrReplayed, CodeHostOffline: ErrHostOffline,
		CodeHostBusy: ErrHostBusy, CodeQuotaExceeded: ErrQuotaExceeded, CodeRevoked: ErrRevoked,
		CodeUnavailable: ErrUnavailable,
	}
	for code, sentinel := range sentinels {
		detailed := &Error{Code: code, Detail: "some check", Violation: true}
		if !errors.Is(detailed, sentinel) {
			t.Errorf("errors.Is(%v, %v) = false", detailed, sentinel)
		}
		if code.Err() != sentinel {
			t.Errorf("%q.Err() is not its sentinel", code)
		}
		for other, s := range sentinels {
			if other != code && errors.Is(detailed, s) {
				t.Errorf("%q matches sentinel of %q", code, other)
			}
		}
	}
}

func TestUnknownCodeMatchesNoSentinel(t *testing.T) {
	c := Code("rate_limited")
	if c.Known() {
		t.Fatal("unknown code reported as known")
	}
	for _, k := range Codes() {
		if errors.Is(c.Err(), k.Err()) {
			t.Errorf("unknown code matches %q", k)
		}
	}
	if _, err := Marshal(ErrorMsg{Code: c}); err == nil {
		t.Error("Marshal sent a code v1 does not define")
	}
}

func TestErrorTextCarriesCodeAndDetail(t *testing.T) {
	e := &Error{Code: CodeUnauthorized, Detail: "host_id is not a canonical id"}
	if got := e.Error(); got != "reach: unauthorized: host_id is not a canonical id" {
		t.Errorf("Error() = %q", got)
	}
	if got := ErrExpired.Error(); got != "reach: expired" {
		t.Errorf("Error() = %q", got)
	}
}

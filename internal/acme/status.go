package acme

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/mholt/acmez/v3/acme"
)

// State is the lifecycle of one managed name (and, in Status, of the
// authority's certificate).
type State string

const (
	// StateWaiting: no certificate for the identity key yet; handshakes for
	// the name fail with an alert.
	StateWaiting State = "waiting_first_certificate"
	// StateValid: a certificate for the identity key is served.
	StateValid State = "valid"
	// StateRenewalFailed: a certificate is served, but the last renewal
	// attempt failed (doctor fails on this).
	StateRenewalFailed State = "renewal_failed"
)

// Problem classifies the last failure so status and doctor can say what is
// missing.
type Problem string

const (
	ProblemNone Problem = ""
	// ProblemPortUnreachable: the CA could not connect to the HTTP-01 or
	// TLS-ALPN-01 solver (port 80/443 not forwarded, firewall, wrong name).
	ProblemPortUnreachable Problem = "challenge_port_unreachable"
	// ProblemDNS: the DNS provider refused the update (credentials, zone) or
	// the TXT record did not appear.
	ProblemDNS Problem = "dns"
	// ProblemRateLimited: the CA's rate limit; the next try waits.
	ProblemRateLimited Problem = "rate_limited"
	// ProblemCAUnreachable: the CA's directory could not be reached.
	ProblemCAUnreachable Problem = "ca_unreachable"
	// ProblemRejected: the CA refused the request (e.g. the name or key).
	ProblemRejected Problem = "rejected"
	// ProblemKeyMismatch: a certificate was issued for a key other than the
	// identity key; it is not served.
	ProblemKeyMismatch Problem = "key_mismatch"
	// ProblemOther: anything else; see LastError.
	ProblemOther Problem = "other"
)

// CertStatus is the state of one managed name.
type CertStatus struct {
	Name  string
	State State
	// Serving certificate (zero until the first one exists).
	Issuer    string // issuer common name (or full DN when it has none)
	Serial    string // hex
	NotBefore time.Time
	NotAfter  time.Time
	// NextRenewal is when renewal starts: NotAfter minus the renewal window
	// (a third of the lifetime by default). certmagic may renew earlier
	// when the CA's renewal information (ARI) says so.
	NextRenewal time.Time
	// CertDER is the served leaf (cert_der in a new QR); Chain is leaf +
	// intermediates as served.
	CertDER []byte
	Chain   [][]byte
	// Last failure of an obtain or renewal, cleared by the next success.
	// LastError is the CA's or provider's message: no key material or
	// credentials.
	LastError   string
	Problem     Problem
	LastErrorAt time.Time
	// NextAttempt is when the next try is due after a failure (zero when
	// none is pending or the time is not known).
	NextAttempt time.Time
	// Failures counts consecutive failures.
	Failures int
}

// KeyChange records that a certificate found for a name was for another key
// than the identity key: a rotation. Every paired client must re-pair; that
// certificate is never served.
type KeyChange struct {
	OldPin string
	NewPin string
	At     time.Time
	Names  []string
}

// Status is a snapshot for status, pin, doctor and metrics.
type Status struct {
	// CertStatus is the authority's certificate (Names[0]); State is
	// renewal_failed when any name's last renewal failed.
	CertStatus
	// Pin is the identity key's pin; every served leaf has it.
	Pin string
	// Certificates has one entry per managed name, the authority first.
	Certificates []CertStatus
	// KeyChange is set when a rotation was detected since New.
	KeyChange *KeyChange
	// Installed counts certificates installed since New (first ones and
	// renewals); RenewalFailures counts failed renewals since New (metrics).
	Installed       uint64
	RenewalFailures uint64
}

// EventKind says what happened.
type EventKind string

const (
	// EventInstalled: a new certificate for Name is being served.
	EventInstalled EventKind = "certificate_installed"
	// EventKeyChanged: a rotation was detected (Status.KeyChange).
	EventKeyChanged EventKind = "key_changed"
	// EventFailed: an obtain or renewal attempt for Name failed.
	EventFailed EventKind = "failed"
)

// Event is passed to Options.OnEvent.
type Event struct {
	Kind   EventKind
	Name   string
	Status Status
}

// classify maps an obtain or renewal error to a Problem.
func classify(err error, challenge string) Problem {
	if err == nil {
		return ProblemNone
	}
	var p acme.Problem
	if errors.As(err, &p) {
		switch p.Type {
		case acme.ProblemTypeRateLimited:
			return ProblemRateLimited
		case acme.ProblemTypeConnection, acme.ProblemTypeTLS:
			if challenge == ChallengeDNS01 {
				return ProblemDNS
			}
			return ProblemPortUnreachable
		case acme.ProblemTypeDNS:
			return ProblemDNS
		case acme.ProblemTypeUnauthorized, acme.ProblemTypeIncorrectResponse:
			if challenge == ChallengeDNS01 {
				return ProblemDNS
			}
			return ProblemPortUnreachable
		}
		return ProblemRejected
	}
	msg := err.Error()
	switch {
	case errors.Is(err, errKeyMismatch):
		return ProblemKeyMismatch
	case strings.Contains(msg, "rateLimited"), strings.Contains(msg, "rate limit"):
		return ProblemRateLimited
	case challenge == ChallengeDNS01 && (strings.Contains(msg, "dns-01") || strings.Contains(msg, "dns provider") ||
		strings.Contains(msg, "presenting") || strings.Contains(msg, "solving challenge")):
		return ProblemDNS
	case strings.Contains(msg, "directory"), isNetErr(err):
		return ProblemCAUnreachable
	}
	return ProblemOther
}

func isNetErr(err error) bool {
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &ne) || errors.As(err, &oe) || errors.Is(err, context.DeadlineExceeded)
}

// renewalRetry mirrors certmagic v0.25.6's renewal backoff schedule
// (async.go retryIntervals), which it does not export: after the n-th
// consecutive failed renewal, the next attempt waits this long (and then
// for the next maintenance tick).
var renewalRetry = []time.Duration{
	1 * time.Minute, 2 * time.Minute, 2 * time.Minute, 5 * time.Minute,
	10 * time.Minute, 10 * time.Minute, 10 * time.Minute,
	20 * time.Minute, 20 * time.Minute, 20 * time.Minute, 20 * time.Minute,
	30 * time.Minute, 30 * time.Minute, 30 * time.Minute, 30 * time.Minute, 30 * time.Minute, 30 * time.Minute,
	1 * time.Hour, 1 * time.Hour, 1 * time.Hour,
	2 * time.Hour, 2 * time.Hour, 3 * time.Hour, 3 * time.Hour, 6 * time.Hour,
}

func renewalDelay(failures int) time.Duration {
	if failures < 1 {
		failures = 1
	}
	return renewalRetry[min(failures, len(renewalRetry))-1]
}

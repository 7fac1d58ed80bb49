package doctor

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/pinning"
)

// ACMEExpiryFail: in acme mode a certificate this close to expiry fails
// (renewal starts at a third of the lifetime left, so this means renewals
// have been failing for weeks).
const ACMEExpiryFail = 7 * 24 * time.Hour

// checkACME judges the ACME certificate (the running daemon's view, else
// what the storage holds) and what the chosen challenge needs.
func checkACME(cfg *config.Config, stateDir string, a pinning.Authority, id *pinning.Identity, st *admin.Status, o Options, add func(Result)) {
	s := cfg.TLS.ACME
	needs := s.Needs()
	var ts admin.TLSStatus
	from := "the running daemon"
	switch {
	case st != nil && st.TLS.Mode == pinning.ModeACME:
		ts = st.TLS
	case id != nil && a.Host != "":
		e := &config.Env{Cfg: cfg, StateDir: stateDir}
		stored, err := acme.Stored(e.ACMEOptions(a, id.Signer()))
		if err != nil {
			add(Result{"acme", Fail, err.Error(), "check " + config.ACMEDir(stateDir)})
			return
		}
		ts, from = admin.ACMETLSStatus(stored, needs), "the storage (daemon not asked)"
	default:
		add(Result{"acme", Fail, "no identity key to check certificates for", "start the daemon once"})
		return
	}
	if r := ts.Rotation; r != nil {
		add(Result{"acme rotation", Warn, fmt.Sprintf("%s (old pin %s, new pin %s, %s)", r.Message, r.OldPin, r.NewPin, r.At),
			"run `securelink pair` and re-pair every client; desktop clients forget the host first"})
	}
	next := ""
	if ts.NextAttempt != "" {
		next = "; next attempt " + ts.NextAttempt
	}
	why := ""
	if ts.LastError != "" {
		why = fmt.Sprintf(" (%s: %s)", orOther(ts.Problem), ts.LastError)
	}
	switch ts.State {
	case string(acme.StateWaiting):
		add(Result{"acme certificate", Fail, "no certificate yet, every handshake fails" + why + next + "; from " + from, needs})
	case string(acme.StateRenewalFailed):
		add(Result{"acme certificate", Fail, fmt.Sprintf("the last renewal failed%s%s; the certificate expires %s", why, next, ts.NotAfter), needs})
	default:
		exp, err := time.Parse(time.RFC3339, ts.NotAfter)
		switch {
		case err != nil:
			add(Result{"acme certificate", Fail, "no expiry known: " + ts.State, needs})
		case exp.Sub(o.Now()) < ACMEExpiryFail:
			add(Result{"acme certificate", Fail, fmt.Sprintf("expires %s, within 7 days: renewals are not succeeding", ts.NotAfter), needs})
		default:
			add(Result{"acme certificate", OK, fmt.Sprintf("issued by %s, valid until %s, renewal from %s", ts.Issuer, ts.NotAfter, ts.NextRenewal), ""})
		}
	}
	checkChallenge(s, add)
}

// checkChallenge checks what the challenge needs locally: for HTTP-01 and
// TLS-ALPN-01 that the solver's port can be bound (the solver listens only
// during a challenge, so the port is free otherwise).
func checkChallenge(s acme.Settings, add func(Result)) {
	port := s.SolverPort()
	if port == 0 {
		add(Result{"acme challenge", OK, s.Needs(), ""})
		return
	}
	l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(port)))
	switch {
	case err == nil:
		l.Close()
		add(Result{"acme challenge", OK, fmt.Sprintf("solver port %d can be bound; %s", port, s.Needs()), ""})
	case errors.Is(err, syscall.EACCES):
		add(Result{"acme challenge", Fail, fmt.Sprintf("solver port %d cannot be bound (below 1024 without CAP_NET_BIND_SERVICE)", port),
			"set a high port (e.g. http_port: 8080) and forward the CA's port to it, or add CAP_NET_BIND_SERVICE to the unit (README, ACME)"})
	case errors.Is(err, syscall.EADDRINUSE):
		add(Result{"acme challenge", Fail, fmt.Sprintf("solver port %d is in use by another program; the solver needs it during every challenge", port),
			"free the port or choose another and forward to it"})
	default:
		add(Result{"acme challenge", Fail, fmt.Sprintf("solver port %d: %v", port, err), s.Needs()})
	}
}

func orOther(p string) string {
	if p == "" {
		return "error"
	}
	return p
}

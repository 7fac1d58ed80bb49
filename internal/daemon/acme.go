package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/internal/metrics"
	"github.com/hermes-securelink/securelink/pinning"
)

// acmeBuilt is an ACME manager a build prepared: started by commitACME, or
// closed when the build is abandoned.
type acmeBuilt struct {
	m   *acme.Manager
	sig string // what it was built for; an equal signature reuses it
}

// buildACME returns the identity served through an ACME manager: the
// running one when nothing it was built from changed, else a new one (not
// started yet) in b.
func (d *daemon) buildACME(e *config.Env, a pinning.Authority, id *pinning.Identity) (*pinning.Identity, *acmeBuilt, error) {
	if err := e.Cfg.CheckACMEFiles(); err != nil {
		return nil, nil, err
	}
	o := e.ACMEOptions(a, id.Signer())
	o.Logger = d.log
	o.RenewalWindowRatio, o.RenewCheckInterval = d.opts.ACMERenewalWindowRatio, d.opts.ACMERenewCheckInterval
	o.DNSResolvers = d.opts.ACMEDNSResolvers
	sig := fmt.Sprintf("%s|%v|%s|%+v", id.Pin, o.Names, o.StorageDir, e.Cfg.TLS.ACME)
	d.mu.Lock()
	cur, curSig := d.acme, d.acmeSig
	d.mu.Unlock()
	if cur != nil && curSig == sig {
		return id.WithCertSource(cur), nil, nil
	}
	o.OnEvent = d.acmeEvent
	m, err := acme.New(o)
	if err != nil {
		return nil, nil, err
	}
	return id.WithCertSource(m), &acmeBuilt{m: m, sig: sig}, nil
}

// start starts b's manager (its stored certificates are served at once)
// while the running one keeps renewing: a start that fails (e.g. storage)
// leaves the running manager untouched. Nil b starts nothing.
func (b *acmeBuilt) start(ctx context.Context) error {
	if b == nil {
		return nil
	}
	return b.m.Start(ctx)
}

// commitACME makes b (started) the running manager once everything else the
// build commits has succeeded, and only then stops the one it replaces:
// until that moment the old one serves and renews, and a failed reload
// abandons b instead. The two may overlap briefly on one storage, which
// certmagic's storage locks are made for. Nil b keeps the running manager,
// or stops it when acme mode was left.
func (d *daemon) commitACME(b *acmeBuilt, acmeMode bool, needs string) {
	d.mu.Lock()
	old := d.acme
	d.mu.Unlock()
	var oldFailures uint64
	replaced := old != nil && (b != nil || !acmeMode)
	if replaced {
		old.Close()
		oldFailures = old.Status().RenewalFailures
	}
	d.mu.Lock()
	switch {
	case b != nil:
		d.acme, d.acmeSig, d.acmeNeeds = b.m, b.sig, needs
	case !acmeMode:
		d.acme, d.acmeSig, d.acmeNeeds = nil, "", ""
	default:
		d.acmeNeeds = needs
	}
	d.renewFailPrior += oldFailures
	d.mu.Unlock()
	if b != nil {
		if st := b.m.Status(); st.State == acme.StateWaiting {
			d.log.Warn().Str("event", "acme_waiting").Strs("names", b.m.Names()).Str("needs", needs).
				Msg("no certificate yet: every handshake fails with an alert until the CA issues one")
		}
	}
}

func (b *acmeBuilt) abandon() {
	if b != nil {
		b.m.Close()
	}
}

// acmeEvent logs a key change as the rotation it is.
func (d *daemon) acmeEvent(ev acme.Event) {
	if ev.Kind != acme.EventKeyChanged || ev.Status.KeyChange == nil {
		return
	}
	kc := ev.Status.KeyChange
	d.log.Error().Str("event", "identity_rotated").Str("old_pin_sha256", kc.OldPin).Str("new_pin_sha256", kc.NewPin).
		Msg(admin.RotationMessage)
}

// acmeStatus is the running manager's status (ok false outside acme mode).
func (d *daemon) acmeStatus() (acme.Status, string, bool) {
	d.mu.Lock()
	m, needs := d.acme, d.acmeNeeds
	d.mu.Unlock()
	if m == nil {
		return acme.Status{}, "", false
	}
	return m.Status(), needs, true
}

// tlsStatus is the status's tls block.
func (d *daemon) tlsStatus(mode string, id *pinning.Identity) admin.TLSStatus {
	if st, needs, ok := d.acmeStatus(); ok {
		return admin.ACMETLSStatus(st, needs)
	}
	ts := admin.TLSStatus{Mode: mode, State: string(acme.StateValid)}
	if id.Leaf != nil {
		ts.Issuer = id.Leaf.Issuer.CommonName
		ts.NotAfter = id.Leaf.NotAfter.UTC().Format(time.RFC3339)
	}
	return ts
}

// waitingForFirstCertificate: acme mode with no certificate yet.
func (d *daemon) waitingForFirstCertificate() bool {
	st, _, ok := d.acmeStatus()
	return ok && st.State == acme.StateWaiting
}

// answeredWithAlert: the handshake reached the front, which refused it with
// a TLS alert (what a front without its first certificate does).
func answeredWithAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}

// registerTLSMetrics: the served certificate's expiry and the renewals
// that failed.
func (d *daemon) registerTLSMetrics(m *metrics.Front) {
	m.GaugeFunc("securelink_certificate_expiry_timestamp_seconds",
		"When the served certificate expires (Unix time); 0 while acme mode waits for its first certificate.", nil,
		func() float64 {
			cur := d.front.Identity().Current()
			if cur.Leaf == nil {
				return 0
			}
			return float64(cur.Leaf.NotAfter.Unix())
		})
	m.CounterFunc("securelink_acme_renewal_failures_total",
		"ACME renewals that failed since the daemon started (acme mode).", prometheus.Labels{},
		func() float64 {
			st, _, _ := d.acmeStatus()
			d.mu.Lock()
			defer d.mu.Unlock()
			return float64(d.renewFailPrior + st.RenewalFailures)
		})
}

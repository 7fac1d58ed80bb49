package server

import (
	"context"
	"fmt"

	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/metrics"
	"github.com/hermes-securelink/securelink/pinning"
)

// startACME starts the certificate manager of tls.acme: certificates for
// the configured domains, for the broker's own persistent key (created on
// first use in the storage directory, like the front's identity). Public
// trust is what matters here, not a pin, but one key keeps the endpoint's
// SPKI stable too.
func (b *Broker) startACME(ctx context.Context) (*acme.Manager, error) {
	dir := b.cfg.ACMEDir()
	d := b.cfg.ACME.Domains
	id, err := pinning.LoadOrCreate(pinning.IdentityConfig{
		StateDir: dir, Mode: pinning.ModeACME,
		Authority: pinning.Authority{Host: d[0], Port: 443}, ExtraNames: d[1:],
	})
	if err != nil {
		return nil, fmt.Errorf("broker: tls.acme key: %w", err)
	}
	o := b.cfg.ACME.Options()
	o.Names, o.Key, o.StorageDir, o.Logger = d, id.Signer(), dir, b.log
	o.RenewalWindowRatio, o.RenewCheckInterval = b.cfg.ACMERenewalWindowRatio, b.cfg.ACMERenewCheckInterval
	m, err := acme.New(o)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	if err := m.Start(ctx); err != nil {
		m.Close()
		return nil, fmt.Errorf("broker: %w", err)
	}
	if st := m.Status(); st.State == acme.StateWaiting {
		b.log.Warn().Str("event", "acme_waiting").Strs("names", d).Str("needs", b.cfg.ACME.Needs()).
			Msg("no certificate yet: every handshake fails with an alert until the CA issues one")
	}
	return m, nil
}

// Certificate reports the tls.acme certificate manager's status while the
// broker serves with it (false otherwise): its state, expiry, next renewal
// and failed renewals, for metrics and the operator.
func (b *Broker) Certificate() (acme.Status, bool) {
	m := b.acme.Load()
	if m == nil {
		return acme.Status{}, false
	}
	return m.Status(), true
}

// RegisterCertificateMetrics exports the tls.acme certificate's expiry and
// failed renewals (nothing without tls.acme): the broker's public endpoint
// fails every client once its certificate lapses.
func (b *Broker) RegisterCertificateMetrics(m *metrics.Front) {
	if !b.cfg.ACME.On() {
		return
	}
	m.GaugeFunc("securelink_broker_certificate_expiry_timestamp_seconds",
		"When the broker's tls.acme certificate expires (Unix time); 0 while it waits for its first certificate.", nil,
		func() float64 {
			st, ok := b.Certificate()
			if !ok || st.NotAfter.IsZero() {
				return 0
			}
			return float64(st.NotAfter.Unix())
		})
	m.CounterFunc("securelink_broker_acme_renewal_failures_total",
		"tls.acme renewals of the broker's certificate that failed since it started serving.", nil,
		func() float64 {
			st, _ := b.Certificate()
			return float64(st.RenewalFailures)
		})
}

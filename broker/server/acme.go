package server

import (
	"context"
	"fmt"

	"github.com/hermes-securelink/securelink/internal/acme"
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

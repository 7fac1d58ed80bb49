package connector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// Bootstrap is a freshly published one-use pairing credential. Token is the
// raw secret: it goes only into the operator's QR (via the admin socket's
// answer), never into a log.
type Bootstrap struct {
	Token     string `json:"token"`
	PairingID string `json:"pairing_id"`
	ExpiresAt int64  `json:"expires_at"`
	HostID    string `json:"host_id"`
	BrokerURL string `json:"broker_url"`
}

// PublishBootstrap mints a bootstrap token and a random pairing_id,
// publishes the token's digest (max_uses 1) and returns once the broker
// answered `published`. ttl 0 means wire.DefaultBootstrapTTL; more than
// wire.MaxBootstrapAhead is refused (the broker would). Without a live
// registration it fails with ErrNotConnected; a broker `error` fails at once
// with that code (errors.Is(err, wire.ErrQuotaExceeded), …).
func (c *Connector) PublishBootstrap(ctx context.Context, ttl time.Duration) (Bootstrap, error) {
	if ttl == 0 {
		ttl = wire.DefaultBootstrapTTL
	}
	if ttl < time.Second || ttl > wire.MaxBootstrapAhead {
		return Bootstrap{}, fmt.Errorf("reach: bootstrap ttl must be 1 s..%v", wire.MaxBootstrapAhead)
	}
	token := wire.NewToken()
	// The pairing_id is random, never derived from the Relay pairing code:
	// the broker must never see that code.
	pairingID := wire.NewID().String()
	exp := c.cfg.Now().Add(ttl).Unix()
	err := c.control(ctx, wire.PublishBootstrap{
		PairingID: pairingID, TokenSHA256: wire.TokenDigest(string(token)), ExpiresAt: exp,
	}, &pendingReply{typ: wire.TypePublished, kind: wire.KindBootstrap, label: pairingID})
	if err != nil {
		return Bootstrap{}, fmt.Errorf("reach: publish bootstrap: %w", err)
	}
	c.count("published_bootstrap")
	return Bootstrap{
		Token: string(token), PairingID: pairingID, ExpiresAt: exp,
		HostID: c.hostID.String(), BrokerURL: c.cfg.BrokerURL,
	}, nil
}

// Revoke revokes a route credential at the broker (its live streams end)
// and forgets it locally, so the next auth.ok mints a new one.
func (c *Connector) Revoke(ctx context.Context, credentialID string) error {
	if !wire.ValidLabel(credentialID) {
		return errors.New("reach: credential_id must be 1..128 characters of [A-Za-z0-9_-]")
	}
	err := c.control(ctx, wire.Revoke{CredentialID: credentialID},
		&pendingReply{typ: wire.TypeRevoked, kind: wire.KindRoute, label: credentialID})
	if err != nil {
		return fmt.Errorf("reach: revoke: %w", err)
	}
	c.routes.forget(credentialID)
	c.count("revoked")
	return nil
}

// publishRoute publishes a route token's digest.
func (c *Connector) publishRoute(ctx context.Context, m wire.PublishRoute) error {
	return c.control(ctx, m, &pendingReply{typ: wire.TypePublished, kind: wire.KindRoute, label: m.CredentialID})
}

// errPublishTimeout: no reply within PublishTimeout.
var errPublishTimeout = errors.New("reach: the broker did not answer in time")

// control sends one control message on the live registration and waits for
// its reply, at most PublishTimeout.
func (c *Connector) control(ctx context.Context, m wire.Message, p *pendingReply) error {
	s := c.current()
	if s == nil {
		return ErrNotConnected
	}
	msg, err := wire.Marshal(m)
	if err != nil {
		return err
	}
	p.res = make(chan error, 1)
	if err := s.send(msg, p); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.PublishTimeout)
	defer cancel()
	select {
	case err := <-p.res:
		return err
	case <-s.done:
		// The reply may have arrived just before the end.
		select {
		case err := <-p.res:
			return err
		default:
			return ErrNotConnected
		}
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return errPublishTimeout
		}
		return ctx.Err()
	}
}

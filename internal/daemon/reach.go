package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/internal/metrics"
	"github.com/hermes-securelink/securelink/internal/strictjson"
	"github.com/hermes-securelink/securelink/internal/trust"
)

// maxBootstrapTTL bounds POST /reach/bootstrap: the broker refuses a
// bootstrap expiring more than an hour ahead.
const maxBootstrapTTL = time.Hour

// newConnector builds the Reach host connector from reach.*.
func newConnector(rc config.Reach, log zerolog.Logger) (*connector.Connector, error) {
	tok, mode, err := atomicfile.ReadSecret(rc.HostTokenFile)
	if err != nil {
		return nil, fmt.Errorf("reach.host_token_file: %w", err)
	}
	if w := atomicfile.GroupWarning("reach.host_token_file", rc.HostTokenFile, mode, "the host token"); w != "" {
		log.Warn().Str("event", "reach").Msg(w)
	}
	pool, err := trust.BrokerRoots(rc.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reach.ca_file: %w", err)
	}
	c, err := connector.New(connector.Config{
		BrokerURL:     rc.BrokerURL,
		HostID:        rc.HostID,
		Token:         wire.Secret(tok),
		RootCAs:       pool,
		MaxStreams:    rc.MaxStreams,
		DisableCredit: !rc.Credit,
		Log:           log.With().Str("component", "reach").Logger(),
	})
	if err != nil {
		return nil, fmt.Errorf("reach: %w", err)
	}
	return c, nil
}

func (d *daemon) reachStatus() connector.Status {
	if d.reach == nil {
		d.mu.Lock()
		rc := d.env.Cfg.Reach
		d.mu.Unlock()
		return connector.Status{Enabled: false, State: "stopped", BrokerURL: rc.BrokerURL, HostID: rc.HostID}
	}
	return d.reach.Status()
}

// registerReachAdmin adds POST /reach/bootstrap and POST /reach/revoke.
func (d *daemon) registerReachAdmin() {
	d.admin.HandleJSON("POST "+admin.PathBootstrap, func(r *http.Request) (any, int, error) {
		var req admin.BootstrapRequest
		if err := decodeAdmin(r, &req); err != nil {
			return nil, http.StatusBadRequest, err
		}
		if d.reach == nil {
			return nil, http.StatusNotFound, errors.New("Reach is not enabled on this host")
		}
		// Bounded in seconds, before the conversion could overflow.
		maxSeconds := int64(maxBootstrapTTL / time.Second)
		if req.TTLSeconds < 0 || req.TTLSeconds > maxSeconds {
			return nil, http.StatusBadRequest, fmt.Errorf("ttl_seconds must be 0 (the default, %d) to %d",
				int64(wire.DefaultBootstrapTTL/time.Second), maxSeconds)
		}
		ttl := time.Duration(req.TTLSeconds) * time.Second
		if ttl == 0 {
			ttl = wire.DefaultBootstrapTTL
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		b, err := d.reach.PublishBootstrap(ctx, ttl)
		switch {
		case errors.Is(err, connector.ErrNotConnected):
			return nil, http.StatusConflict, err
		case err != nil:
			return nil, http.StatusBadGateway, err
		}
		return admin.BootstrapReply(b), 0, nil
	})
	d.admin.HandleJSON("POST "+admin.PathRevoke, func(r *http.Request) (any, int, error) {
		var req admin.RevokeRequest
		if err := decodeAdmin(r, &req); err != nil {
			return nil, http.StatusBadRequest, err
		}
		if d.reach == nil {
			return nil, http.StatusNotFound, errors.New("Reach is not enabled on this host")
		}
		if !wire.ValidLabel(req.CredentialID) {
			return nil, http.StatusBadRequest, errors.New("credential_id must be 1..128 of [A-Za-z0-9_-]")
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		err := d.reach.Revoke(ctx, req.CredentialID)
		switch {
		case errors.Is(err, connector.ErrNotConnected):
			return nil, http.StatusConflict, err
		case err != nil:
			return nil, http.StatusBadGateway, err
		}
		return admin.RevokeReply{Revoked: req.CredentialID}, 0, nil
	})
}

// decodeAdmin reads a small JSON request body strictly.
func decodeAdmin(r *http.Request, v any) error {
	if err := strictjson.DecodeReader(r.Body, 4096, v); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

// registerReachMetrics exposes the connector's state at scrape time.
func registerReachMetrics(m *metrics.Front, c *connector.Connector) {
	m.GaugeFunc("securelink_reach_connected", "1 while the connector is registered with its broker.", nil, func() float64 {
		if c.Status().State == connector.StateConnected {
			return 1
		}
		return 0
	})
	m.GaugeFunc("securelink_reach_streams_active", "Broker streams being served.", nil, func() float64 {
		return float64(c.Status().ActiveStreams)
	})
	m.CounterFunc("securelink_reach_streams_completed_total", "Broker streams served to completion.", nil, func() float64 {
		return float64(c.Status().CompletedStreams)
	})
	m.CounterFunc("securelink_reach_attempts_total", "Registration attempts with the broker.", nil, func() float64 {
		return float64(c.Status().Attempts)
	})
	m.GaugeFunc("securelink_reach_permanent_error", "1 while the broker's last answer was a permanent refusal (unauthorized, revoked): retries wait 10 minutes.", nil, func() float64 {
		if c.Status().PermanentError != "" {
			return 1
		}
		return 0
	})
	m.GaugeFunc("securelink_reach_credit", "1 while the registration uses the credit flow-control extension.", nil, func() float64 {
		if c.Status().Credit {
			return 1
		}
		return 0
	})
}

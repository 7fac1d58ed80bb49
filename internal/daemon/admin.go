package daemon

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/pairing"
)

func (d *daemon) registerAdmin() {
	d.admin.HandleJSON("GET "+admin.PathStatus, func(r *http.Request) (any, int, error) {
		return d.status(r.Context()), 0, nil
	})
	d.admin.HandleJSON("GET "+admin.PathIdentity, func(r *http.Request) (any, int, error) {
		d.mu.Lock()
		a := d.authority
		d.mu.Unlock()
		id := d.front.Identity().Current()
		if id.Leaf == nil {
			return nil, http.StatusServiceUnavailable, errors.New("no certificate yet (tls.mode acme is waiting for the first one; see `securelink status`): nothing to pair with")
		}
		return admin.Identity{
			Authority: a.String(),
			URL:       a.URL(),
			PinSHA256: id.Pin,
			CertDER:   id.CertDERBase64(),
			Candidate: pairing.NewPluginProxyCandidate(a, id),
		}, 0, nil
	})
}

func (d *daemon) status(ctx context.Context) admin.Status {
	d.mu.Lock()
	e, a := d.env, d.authority
	d.mu.Unlock()
	id := d.front.Identity().Current()
	avail := d.front.Availability(ctx)
	return admin.Status{
		Version:           d.opts.Version,
		StartedAt:         d.started.Format(time.RFC3339),
		ConfigFile:        e.Cfg.File,
		StateDir:          e.StateDir,
		Authority:         a.String(),
		PinSHA256:         id.Pin,
		IdentityChangedAt: id.ChangedAt.UTC().Format(time.RFC3339),
		Upstreams: map[string]admin.Availability{
			"relay":     {Available: avail.Relay},
			"api":       {Available: avail.API},
			"dashboard": {Available: avail.Dashboard},
		},
		Reach:            d.reachStatus(),
		ActiveWebSockets: d.front.Bridge().Active() + d.front.ActiveUpgrades(),
		SNIRejected:      d.front.SNIRejected(),
		TLS:              d.tlsStatus(e.Cfg.TLS.Mode, id),
	}
}

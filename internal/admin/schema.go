package admin

import (
	"context"
	"net/http"

	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/internal/pairing"
)

// The admin API: one route constant and one Go type per request and reply,
// used by the daemon that serves them and by every command and check that
// asks. Field names are the JSON the operations spec documents.
const (
	PathStatus    = "/status"
	PathIdentity  = "/identity"
	PathBootstrap = "/reach/bootstrap"
	PathRevoke    = "/reach/revoke"
)

// Status is GET /status: what the running daemon serves.
type Status struct {
	Version           string                  `json:"version"`
	StartedAt         string                  `json:"started_at"`
	ConfigFile        string                  `json:"config_file"`
	StateDir          string                  `json:"state_dir"`
	Authority         string                  `json:"authority"`
	PinSHA256         string                  `json:"pin_sha256"`
	IdentityChangedAt string                  `json:"identity_changed_at"`
	Upstreams         map[string]Availability `json:"upstreams"`
	Reach             connector.Status        `json:"reach"`
	ActiveWebSockets  int                     `json:"active_websockets"`
	SNIRejected       uint64                  `json:"sni_rejected"`
}

// Availability is one upstream's probe result in Status.
type Availability struct {
	Available bool `json:"available"`
}

// Identity is GET /identity: the identity the daemon serves right now and
// the plugin_proxy candidate built from it.
type Identity struct {
	Authority string                       `json:"authority"`
	URL       string                       `json:"url"`
	PinSHA256 string                       `json:"pin_sha256"`
	CertDER   string                       `json:"cert_der"`
	Candidate pairing.PluginProxyCandidate `json:"candidate"`
}

// BootstrapRequest is POST /reach/bootstrap's body; 0 means
// wire.DefaultBootstrapTTL.
type BootstrapRequest struct {
	TTLSeconds int64 `json:"ttl_seconds"`
}

// BootstrapReply is POST /reach/bootstrap's answer: the one-use credential
// the pairing payload's outbound_broker route carries.
type BootstrapReply = pairing.BrokerBootstrap

// RevokeRequest is POST /reach/revoke's body.
type RevokeRequest struct {
	CredentialID string `json:"credential_id"`
}

// RevokeReply is POST /reach/revoke's answer.
type RevokeReply struct {
	Revoked string `json:"revoked"`
}

// Status asks GET /status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	_, err := c.Do(ctx, http.MethodGet, PathStatus, nil, &st)
	return st, err
}

// Identity asks GET /identity.
func (c *Client) Identity(ctx context.Context) (Identity, error) {
	var id Identity
	_, err := c.Do(ctx, http.MethodGet, PathIdentity, nil, &id)
	return id, err
}

// Bootstrap asks POST /reach/bootstrap. The HTTP status is returned so a
// caller can tell 409 (not connected to the broker) from other failures.
func (c *Client) Bootstrap(ctx context.Context, req BootstrapRequest) (BootstrapReply, int, error) {
	var b BootstrapReply
	code, err := c.Do(ctx, http.MethodPost, PathBootstrap, req, &b)
	return b, code, err
}

// Revoke asks POST /reach/revoke.
func (c *Client) Revoke(ctx context.Context, credentialID string) (RevokeReply, error) {
	var r RevokeReply
	_, err := c.Do(ctx, http.MethodPost, PathRevoke, RevokeRequest{CredentialID: credentialID}, &r)
	return r, err
}

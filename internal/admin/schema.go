package admin

import (
	"context"
	"net/http"
	"time"

	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/internal/acme"
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
	TLS               TLSStatus               `json:"tls"`
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

// TLSStatus is where the served certificate comes from and how it stands.
// Times are RFC 3339; empty when not known. No key material, no
// credentials.
type TLSStatus struct {
	Mode string `json:"mode"` // self_signed | files | acme
	// State: valid, or in acme mode waiting_first_certificate (every
	// handshake fails with an alert until it exists) or renewal_failed.
	State       string `json:"state"`
	Issuer      string `json:"issuer,omitempty"`
	NotAfter    string `json:"not_after,omitempty"`
	NextRenewal string `json:"next_renewal,omitempty"`
	LastError   string `json:"last_error,omitempty"`
	NextAttempt string `json:"next_attempt,omitempty"`
	// Problem classifies LastError (acme.Problem: challenge_port_unreachable,
	// dns, rate_limited, ca_unreachable, rejected, key_mismatch, other).
	Problem string `json:"problem,omitempty"`
	// Needs says what the chosen challenge needs (acme mode).
	Needs string `json:"needs,omitempty"`
	// Rotation is set when the identity key changed under the stored
	// certificates: every client must re-pair.
	Rotation *Rotation `json:"rotation,omitempty"`
}

// Rotation reports an identity key change.
type Rotation struct {
	OldPin  string `json:"old_pin_sha256"`
	NewPin  string `json:"new_pin_sha256"`
	At      string `json:"at"`
	Message string `json:"message"`
}

// RotationMessage is what every report of a key change says.
const RotationMessage = "the identity key changed: this is a rotation, every paired client must re-pair (run `securelink pair`)"

// ACMETLSStatus is the TLSStatus of an ACME manager's (or the storage's)
// status; needs is what the challenge needs (acme.Settings.Needs).
func ACMETLSStatus(st acme.Status, needs string) TLSStatus {
	ts := TLSStatus{Mode: "acme", State: string(st.State), Issuer: st.Issuer, LastError: st.LastError,
		Problem: string(st.Problem), Needs: needs,
		NotAfter: rfc3339(st.NotAfter), NextRenewal: rfc3339(st.NextRenewal), NextAttempt: rfc3339(st.NextAttempt)}
	if kc := st.KeyChange; kc != nil {
		ts.Rotation = &Rotation{OldPin: kc.OldPin, NewPin: kc.NewPin, At: rfc3339(kc.At), Message: RotationMessage}
	}
	return ts
}

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

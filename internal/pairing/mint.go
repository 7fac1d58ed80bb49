package pairing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// MintOptions bounds the call to the Relay.
type MintOptions struct {
	// Timeout covers the whole request, connect to last body byte.
	// Default 10 s; the Relay may publish a broker credential first.
	Timeout time.Duration
	// MaxResponseBytes bounds the response body. Default 256 KiB.
	MaxResponseBytes int64
}

// DefaultMintOptions returns the defaults.
func DefaultMintOptions() MintOptions {
	return MintOptions{Timeout: 10 * time.Second, MaxResponseBytes: 256 << 10}
}

// Validate checks the options.
func (o MintOptions) Validate() error {
	if o.Timeout <= 0 {
		return errors.New("mint timeout must be positive")
	}
	if o.MaxResponseBytes < 1024 {
		return errors.New("mint response limit must be at least 1 KiB")
	}
	return nil
}

// MintRequest is the body of POST /pairing/mint. The Relay reads its own API
// key, relay URL and QR secret; we send only what the operator chose.
type MintRequest struct {
	// Endpoints are our candidates, in order (BuildEndpoints).
	Endpoints []Endpoint
	// TTLSeconds is the session lifetime (0 = never); nil leaves the Relay's
	// default.
	TTLSeconds *int64
	// Grants are per-channel lifetimes in seconds; nil sends none.
	Grants map[string]int64
	// DashboardURL is copied into the payload when set.
	DashboardURL string
}

// body is the canonical JSON of the request: deterministic, and free of Go's
// HTML escaping, so the Relay reads exactly our values.
func (r MintRequest) body() ([]byte, error) {
	if len(r.Endpoints) == 0 {
		return nil, errors.New("mint request has no endpoints")
	}
	m := map[string]any{"endpoints": r.Endpoints}
	if r.TTLSeconds != nil {
		if *r.TTLSeconds < 0 || *r.TTLSeconds > MaxDurationSeconds {
			return nil, errors.New("ttl_seconds out of range")
		}
		m["ttl_seconds"] = IntOf(*r.TTLSeconds)
	}
	if r.Grants != nil {
		g := make(map[string]any, len(r.Grants))
		for k, v := range r.Grants {
			if !grantName.MatchString(k) || v < 0 || v > MaxDurationSeconds {
				return nil, fmt.Errorf("grant %q out of range", k)
			}
			g[k] = IntOf(v)
		}
		m["grants"] = g
	}
	if r.DashboardURL != "" {
		if err := checkDashboardURL(r.DashboardURL); err != nil {
			return nil, err
		}
		m["dashboard_url"] = r.DashboardURL
	}
	return Canonical(m)
}

// checkDashboardURL accepts an absolute http(s) URL without user info or
// fragment and without a trailing slash (the Relay strips trailing slashes,
// which would make the echoed value differ from ours).
func checkDashboardURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil ||
		u.Fragment != "" || u.Opaque != "" || strings.HasSuffix(s, "/") || len(s) > 2048 {
		return errors.New("--dashboard-url must be an absolute http(s) URL without user info, fragment or trailing slash")
	}
	return nil
}

// MintResponse is the Relay's answer. Code and Payload are secrets (the
// pairing code, the API key, a broker token); String leaves them out.
type MintResponse struct {
	// Code is the one-use pairing code (6 characters, 10 minutes).
	Code string
	// QRPayload is the signed payload exactly as the Relay wrote it: the
	// QR content.
	QRPayload []byte
	// PairingURL is the invite URL; it decodes to QRPayload.
	PairingURL string
	// ExpiresAt is when the code expires (Unix seconds).
	ExpiresAt int64
	// Payload is QRPayload parsed.
	Payload *Payload
}

// String describes the response without secrets.
func (r MintResponse) String() string {
	return fmt.Sprintf("pairing minted (code expires %d, %s)", r.ExpiresAt, r.Payload)
}

// GoString keeps %#v from printing secrets.
func (r MintResponse) GoString() string { return r.String() }

// ErrRelayUnreachable wraps failures to reach the Relay at all.
var ErrRelayUnreachable = errors.New("the Relay is not reachable")

// RelayRefusedError is a non-success answer of the Relay.
type RelayRefusedError struct {
	Status int
	// Message is the Relay's error text, sanitized and with any of our
	// tokens removed.
	Message string
}

func (e *RelayRefusedError) Error() string {
	hint := ""
	switch e.Status {
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		hint = " (this hermes-relay has no /pairing/mint: upgrade it)"
	case http.StatusForbidden:
		hint = " (the Relay only mints for loopback callers)"
	}
	if e.Message != "" {
		return fmt.Sprintf("the Relay refused to mint a pairing (HTTP %d): %s%s", e.Status, e.Message, hint)
	}
	return fmt.Sprintf("the Relay refused to mint a pairing (HTTP %d)%s", e.Status, hint)
}

// CheckRelayBase accepts only a plain http URL on a loopback address (or
// localhost): the mint response carries the API key and the pairing code,
// and the Relay refuses non-loopback callers anyway.
func CheckRelayBase(u *url.URL) error {
	if u == nil {
		return errors.New("no Relay URL")
	}
	if u.Scheme != "http" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.ForceQuery ||
		u.Fragment != "" || u.Opaque != "" {
		return fmt.Errorf("Relay URL %q: want http://127.0.0.1:PORT (loopback http, no user info, query or fragment)", u.Redacted())
	}
	h := u.Hostname()
	if h == "localhost" {
		return nil
	}
	a, err := netip.ParseAddr(h)
	if err != nil || !a.Unmap().IsLoopback() || a.Zone() != "" {
		return fmt.Errorf("Relay URL %q: the host must be a loopback address", u.Redacted())
	}
	return nil
}

// Mint asks the Relay to mint a pairing code and sign a payload carrying
// req.Endpoints, with the default options.
func Mint(ctx context.Context, relayBase *url.URL, req MintRequest) (MintResponse, error) {
	return MintWithOptions(ctx, relayBase, req, DefaultMintOptions())
}

// MintWithOptions is Mint with explicit bounds. It never follows redirects,
// never uses a proxy from the environment and connects to loopback
// addresses only (checked on the resolved address, so "localhost" cannot be
// pointed elsewhere). The response is checked for shape and consistency
// (the invite URL decodes to the payload, the payload's code is the minted
// code); CheckEndpoints is the caller's next step.
func MintWithOptions(ctx context.Context, relayBase *url.URL, req MintRequest, o MintOptions) (MintResponse, error) {
	if err := o.Validate(); err != nil {
		return MintResponse{}, err
	}
	if err := CheckRelayBase(relayBase); err != nil {
		return MintResponse{}, err
	}
	body, err := req.body()
	if err != nil {
		return MintResponse{}, err
	}
	target := *relayBase
	target.Path = strings.TrimSuffix(target.Path, "/") + "/pairing/mint"
	target.RawPath = ""

	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	dialer := &net.Dialer{Control: loopbackOnly}
	tr := &http.Transport{
		Proxy:             nil,
		DialContext:       dialer.DialContext,
		DisableKeepAlives: true,
		// Bounded like the body: a Relay answer has a handful of headers.
		MaxResponseHeaderBytes: 64 << 10,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		return MintResponse{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	resp, err := client.Do(hreq)
	if err != nil {
		// url.Error repeats the URL, which holds no secret; the body is not
		// part of it.
		return MintResponse{}, fmt.Errorf("%w at %s: %v", ErrRelayUnreachable, relayBase.Redacted(), unwrapURLError(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, o.MaxResponseBytes+1))
	if err != nil {
		return MintResponse{}, fmt.Errorf("%w: reading the answer: %v", ErrRelayUnreachable, unwrapURLError(err))
	}
	if int64(len(data)) > o.MaxResponseBytes {
		return MintResponse{}, fmt.Errorf("the Relay's answer exceeds %d bytes", o.MaxResponseBytes)
	}
	if resp.StatusCode != http.StatusOK {
		return MintResponse{}, &RelayRefusedError{Status: resp.StatusCode, Message: relayErrorText(data, secretsOf(req))}
	}
	return parseMintResponse(data, secretsOf(req))
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// loopbackOnly refuses a connection to anything but a loopback address,
// after name resolution.
func loopbackOnly(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !ap.Addr().Unmap().IsLoopback() {
		return fmt.Errorf("refusing to send a pairing request to %s: not a loopback address", address)
	}
	return nil
}

// secretsOf collects the strings of our request that must never be echoed
// into an error (broker tokens).
func secretsOf(req MintRequest) []string {
	var out []string
	for _, e := range req.Endpoints {
		if b, ok := e["broker"].(map[string]any); ok {
			if t, ok := b["token"].(string); ok && t != "" {
				out = append(out, t)
			}
		}
	}
	return out
}

// relayErrorText extracts {"error": "..."} from a refusal, keeping printable
// ASCII only, at most 200 characters, with our secrets removed.
func relayErrorText(data []byte, secrets []string) string {
	m, err := ParseObject(data)
	if err != nil {
		return ""
	}
	s, _ := m["error"].(string)
	for _, sec := range secrets {
		s = strings.ReplaceAll(s, sec, "[redacted]")
	}
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= 200 {
			b.WriteString("...")
			break
		}
		if r >= 0x20 && r < 0x7f {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// parseMintResponse checks the Relay's answer. Errors name members, never
// values.
func parseMintResponse(data []byte, secrets []string) (MintResponse, error) {
	m, err := ParseObject(data)
	if err != nil {
		return MintResponse{}, fmt.Errorf("the Relay's answer: %w", err)
	}
	if ok, _ := m["ok"].(bool); !ok {
		return MintResponse{}, &RelayRefusedError{Status: http.StatusOK, Message: relayErrorText(data, secrets)}
	}
	var r MintResponse
	var isStr bool
	if r.Code, isStr = m["code"].(string); !isStr || !codePattern.MatchString(r.Code) {
		return MintResponse{}, errors.New("the Relay's answer has no valid code (6 characters A-Z0-9)")
	}
	qr, isStr := m["qr_payload"].(string)
	if !isStr || qr == "" {
		return MintResponse{}, errors.New("the Relay's answer has no qr_payload string")
	}
	r.QRPayload = []byte(qr)
	if r.PairingURL, isStr = m["pairing_url"].(string); !isStr {
		return MintResponse{}, errors.New("the Relay's answer has no pairing_url string")
	}
	exp, isInt := m["expires_at"].(Int)
	if !isInt {
		return MintResponse{}, errors.New("the Relay's answer has no integer expires_at")
	}
	if r.ExpiresAt, isInt = exp.Int64(); !isInt || r.ExpiresAt <= 0 {
		return MintResponse{}, errors.New("the Relay's answer has an out-of-range expires_at")
	}
	fromURL, err := ParseInviteURL(r.PairingURL)
	if err != nil {
		return MintResponse{}, fmt.Errorf("the Relay's pairing_url: %w", err)
	}
	if !bytes.Equal(fromURL, r.QRPayload) {
		return MintResponse{}, errors.New("the Relay's pairing_url does not carry its qr_payload")
	}
	if r.Payload, err = ParsePayload(r.QRPayload); err != nil {
		return MintResponse{}, fmt.Errorf("the Relay's qr_payload: %w", err)
	}
	if r.Payload.Relay == nil || r.Payload.Relay.Code != r.Code {
		return MintResponse{}, errors.New("the Relay's qr_payload does not carry the minted code in relay.code")
	}
	return r, nil
}

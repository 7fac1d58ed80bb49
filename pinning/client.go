package pinning

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"
)

// PinnedTLSConfig is how Hermes clients (and this binary's own client code)
// verify the front: the certificate chain is not verified at all — the pin
// replaces the CA — but VerifyConnection checks, on every handshake
// including resumed sessions, that the leaf's key is the pinned one and that
// the leaf names serverName. VerifyPeerCertificate would be skipped on
// resumption, so it is not used. For an IP serverName Go sends no SNI, as
// the front expects.
func PinnedTLSConfig(serverName, pin string) (*tls.Config, error) {
	want, err := ParsePin(pin)
	if err != nil {
		return nil, err
	}
	host, err := NormalizeHost(serverName)
	if err != nil {
		return nil, fmt.Errorf("server name: %w", err)
	}
	return &tls.Config{
		ServerName: host,
		// The chain is checked by pin in VerifyConnection, which also runs
		// on resumed sessions, regardless of this setting.
		InsecureSkipVerify: true,
		MinVersion:         tls.VersionTLS12,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPinned(cs, host, want)
		},
	}, nil
}

func verifyPinned(cs tls.ConnectionState, host string, want [32]byte) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%w: %s presented no certificate", ErrPinMismatch, host)
	}
	leaf := cs.PeerCertificates[0]
	got := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return fmt.Errorf("%w: %s presented %s; if the host rotated its identity, pair again", ErrPinMismatch, host, pinOf(leaf.RawSubjectPublicKeyInfo))
	}
	if err := leaf.VerifyHostname(host); err != nil {
		return fmt.Errorf("pinned certificate does not name %s: %w", host, err)
	}
	return nil
}

// DialPinned connects to addr (host:port) and completes a TLS handshake that
// succeeds only when the endpoint holds the pinned key and its certificate
// names serverName. ctx bounds connect and handshake.
func DialPinned(ctx context.Context, addr, serverName, pin string) (*tls.Conn, error) {
	cfg, err := PinnedTLSConfig(serverName, pin)
	if err != nil {
		return nil, err
	}
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*tls.Conn), nil
}

// RemoteInfo is what an endpoint presents, for diagnosis.
type RemoteInfo struct {
	Pin        string
	CertSHA256 string
	SANs       []string
	NotBefore  time.Time
	NotAfter   time.Time
	Subject    string
}

// CheckPin compares the presented key with an expected pin; ErrBadPin when
// the expectation is malformed, ErrPinMismatch when it differs.
func (r *RemoteInfo) CheckPin(expected string) error {
	want, err := ParsePin(expected)
	if err != nil {
		return err
	}
	got, err := ParsePin(r.Pin)
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return fmt.Errorf("%w: the endpoint presents %s, expected %s", ErrPinMismatch, r.Pin, expected)
	}
	return nil
}

// InspectRemote connects to rawURL (https://host[:port], path ignored)
// without trusting anything and reports the leaf certificate the endpoint
// presents. It sends the host as SNI unless it is an IP, like the clients.
// ctx bounds connect and handshake; callers set a deadline.
func InspectRemote(ctx context.Context, rawURL string) (*RemoteInfo, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("remote URL: %w", err)
	}
	if u.Scheme != "https" || u.Host == "" || u.User != nil {
		return nil, errors.New("remote URL: want https://HOST:PORT")
	}
	host, err := NormalizeHost(u.Hostname())
	if err != nil {
		return nil, fmt.Errorf("remote URL: %w", err)
	}
	port := 443
	if p := u.Port(); p != "" {
		if port, err = parsePort(p); err != nil {
			return nil, fmt.Errorf("remote URL: %w", err)
		}
	}
	d := tls.Dialer{Config: &tls.Config{
		ServerName: host,
		// Deliberately unverified: the point is to show what is presented.
		InsecureSkipVerify: true,
		MinVersion:         tls.VersionTLS12,
	}}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cs := c.(*tls.Conn).ConnectionState()
	if len(cs.PeerCertificates) == 0 {
		return nil, errors.New("the endpoint presented no certificate")
	}
	leaf := cs.PeerCertificates[0]
	return &RemoteInfo{
		Pin:        SPKIPin(leaf),
		CertSHA256: CertSHA256Hex(leaf.Raw),
		SANs:       SANs(leaf),
		NotBefore:  leaf.NotBefore,
		NotAfter:   leaf.NotAfter,
		Subject:    leaf.Subject.String(),
	}, nil
}

// Package client is the client side of Reach (spec/reach.md): it dials the
// rendezvous broker over wss://, registers as a client with a bootstrap or
// route credential, and turns the matched stream into a net.Conn carrying
// the raw bytes of an inner TLS connection to the host's Secure Link front.
//
// The broker is not trusted with anything but routing: the inner TLS is
// checked against the QR pin (DialTLS), so a broker that misroutes or
// tampers makes the handshake fail before a single application byte is
// sent. Nothing here ever falls back to plaintext: the broker URL must be
// wss://, redirects are refused and the HTTP transport cannot dial a
// plaintext connection at all.
//
// Forward is `securelink connect`: a loopback listener whose every accepted
// TCP connection becomes one broker stream, so tools such as curl can do
// the pinned TLS themselves.
package client

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// Defaults of Config.
const (
	DefaultDialTimeout     = 10 * time.Second
	DefaultRegisterTimeout = wire.RegisterTimeout
)

// readQueueMessages bounds the chunks of received bytes (readChunk, 64 KiB
// each, whatever the frame's size) a Conn holds that the caller has not
// read yet: with the one Read is draining and the one the reader waits to
// queue, at most 640 KiB per stream. The queue exists so that pings are
// answered while the caller is busy elsewhere.
const readQueueMessages = 8

// writeQueueBytes bounds the bytes a Conn's Write queues for its writer;
// they leave as one message. 128 KiB rather than the 1 MiB message limit:
// on an upload through the broker, 64 and 128 KiB messages cost the front
// (connector and inner TLS) 0.5-1 ms less per MiB than 256 KiB ones (the
// bytes stay in cache), and a full 1 MiB message is forwarded to the host
// as two DATA frames (1 MiB − 20 bytes and 20 bytes). The client's own CPU
// per MiB is the same from 64 KiB up (docs/decisions.md).
const writeQueueBytes = 128 << 10

// directWriteBytes is the largest Write sent by the caller itself when
// nothing is queued or being sent; larger ones (an inner TLS record of
// a bulk transfer) go through the queue, where they coalesce.
const directWriteBytes = 4 << 10

// closeFlushTimeout bounds how long Close waits for queued bytes to leave
// (a broker that stopped reading); then the stream is cut.
const closeFlushTimeout = 5 * time.Second

// Config says how to reach one host through a broker with one credential.
type Config struct {
	// BrokerURL is exactly wss://host[:port]/v1/connect (wire.ParseBrokerURL).
	// ws:// is refused: nothing ever downgrades to plaintext.
	BrokerURL string
	// HostID is the canonical 22-character host_id.
	HostID string
	// CredentialKind is "bootstrap" (one stream, ever) or "route".
	CredentialKind string
	// Token is the raw credential; it travels only inside the register
	// message, never in the URL or a header.
	Token wire.Secret
	// RootCAs verifies the broker's certificate; nil means the system roots.
	RootCAs *x509.CertPool
	// DialTimeout bounds TCP connect, outer TLS and the WebSocket upgrade,
	// and in DialTLS also the inner TLS handshake. Zero means 10 s.
	DialTimeout time.Duration
	// RegisterTimeout bounds the wait for `matched` after the register
	// message was sent. Zero means 10 s.
	RegisterTimeout time.Duration
	// PingInterval and PongTimeout are the client's keepalive: a ping every
	// PingInterval, and the stream is dropped when no pong arrived within
	// PongTimeout while the socket was being read and written freely.
	// PongTimeout also bounds a write to the broker by progress: the
	// stream is dropped (ErrConnectionLost) when the broker's socket took
	// no fragment (64 KiB at most) of a message for that long, a stalled
	// or half-open path, however long a slow upload takes in all.
	// Zero means 15 s and 45 s (the protocol's values).
	PingInterval time.Duration
	PongTimeout  time.Duration
	// Log receives diagnostics; it never sees the token. The zero value
	// discards everything.
	Log zerolog.Logger
	// WrapOuter, when set, wraps the outer connection right after the outer
	// TLS handshake, so it sees the bytes exactly as the broker does
	// (HTTP upgrade, masked WebSocket frames). It is for tests and
	// diagnostics, e.g. a test recorder (internal/testfake.Recorder).
	WrapOuter func(net.Conn) net.Conn
}

// withDefaults fills zero durations with the protocol's values.
func (c Config) withDefaults() Config {
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.RegisterTimeout == 0 {
		c.RegisterTimeout = DefaultRegisterTimeout
	}
	if c.PingInterval == 0 {
		c.PingInterval = wire.PingInterval
	}
	if c.PongTimeout == 0 {
		c.PongTimeout = wire.PongTimeout
	}
	return c
}

// Validate checks everything that can be checked without the network, so a
// bad candidate or flag fails before any connection is made. Errors never
// contain the token.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if err := wire.CheckClientCredential(c.BrokerURL, c.HostID, c.CredentialKind, c.Token); err != nil {
		errs = append(errs, err)
	}
	durs := []struct {
		name string
		v    time.Duration
	}{
		{"dial timeout", c.DialTimeout},
		{"register timeout", c.RegisterTimeout},
		{"ping interval", c.PingInterval},
		{"pong timeout", c.PongTimeout},
	}
	for _, d := range durs {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("reach %s must not be negative", d.name))
		}
	}
	if c.PongTimeout <= c.PingInterval {
		errs = append(errs, errors.New("reach pong timeout must be longer than the ping interval"))
	}
	return errors.Join(errs...)
}

package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/pinning"
)

// maxUpgradeHeaderBytes bounds the broker's upgrade response headers.
const maxUpgradeHeaderBytes = 16 << 10

// errPlaintext is what the HTTP transport answers if anything ever asks it
// for a non-TLS connection (a redirect to http://, a bug): the transport
// is built so that plaintext is impossible, not merely unlikely.
var errPlaintext = errors.New("reach: plaintext connections to a broker are refused")

// Dial connects to the broker, registers as a client with a fresh
// connection_id and waits for `matched`. The result carries the raw bytes of
// the stream; see Conn for its semantics. A broker `error` is returned as a
// *wire.Error, so errors.Is(err, wire.ErrReplayed) and friends work.
func Dial(ctx context.Context, cfg Config) (net.Conn, error) {
	c, err := dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// DialTLS dials like Dial and runs the inner TLS handshake over the stream,
// pinned with pinning.PinnedTLSConfig: the handshake fails — before any
// application byte is written — when the peer's key is not pin or its
// certificate does not name serverName. DialTimeout bounds the handshake.
func DialTLS(ctx context.Context, cfg Config, serverName, pin string) (*tls.Conn, error) {
	tcfg, err := pinning.PinnedTLSConfig(serverName, pin)
	if err != nil {
		return nil, fmt.Errorf("reach: %w", err)
	}
	c, err := dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, cfg.withDefaults().DialTimeout)
	defer cancel()
	tc := tls.Client(c, tcfg)
	if err := tc.HandshakeContext(hctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("reach: inner TLS handshake with %s: %w", serverName, err)
	}
	return tc, nil
}

func dial(ctx context.Context, cfg Config) (*Conn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	u, _ := wire.ParseBrokerURL(cfg.BrokerURL)
	hostID, _ := wire.ParseID(cfg.HostID)
	connID := wire.NewID()
	reg, err := wire.Marshal(wire.Register{
		Role: wire.RoleClient, HostID: hostID, ConnectionID: connID,
		CredentialKind: wire.Kind(cfg.CredentialKind), Token: cfg.Token,
	})
	if err != nil {
		return nil, err
	}
	log := cfg.Log.With().Str("broker", u.Host).Str("connection_id", connID.String()).Logger()

	var local, remote net.Addr
	var batch *msgconn.BatchConn // under the socket's TLS, then the one above it
	dialer := &net.Dialer{KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy: nil, // a proxy would see the upgrade; Reach dials directly
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return nil, errPlaintext
		},
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			raw, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			batch = msgconn.NewBatchConn(raw)
			tc := tls.Client(batch, &tls.Config{
				ServerName: u.Hostname(),
				RootCAs:    cfg.RootCAs,
				MinVersion: tls.VersionTLS12,
				NextProtos: []string{"http/1.1"}, // WebSocket upgrades are HTTP/1.1
			})
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			local, remote = raw.LocalAddr(), raw.RemoteAddr()
			var outer net.Conn = tc
			if cfg.WrapOuter != nil {
				outer = cfg.WrapOuter(tc)
			}
			// The library writes a client's frames through a 4 KiB
			// buffer, each 4 KiB its own TLS record: gathered above
			// TLS, a message leaves in 16 KiB records, and those in one
			// write(2) through the BatchConn under TLS.
			batch = msgconn.NewBatchConnAbove(outer, batch)
			return batch, nil
		},
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxUpgradeHeaderBytes,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{
		Transport: tr,
		// A redirect could lead anywhere, including to plaintext; the
		// broker URL is exact, so there is nothing legitimate to follow.
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return errors.New("reach: the broker answered with a redirect, which is refused")
		},
	}

	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	// msgconn.Dial answers the broker's pings itself: never the library's
	// pong, which ends the reader after 5 s behind a long frame write (a
	// batch flushed to a slow uplink), and never a pong per ping grown
	// into a batch the broker does not read.
	conn, resp, err := msgconn.Dial(dctx, u.String(), &websocket.DialOptions{
		HTTPClient:      hc,
		CompressionMode: websocket.CompressionDisabled,
	}, u.Host)
	cancel()
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, fmt.Errorf("reach: broker %s refused the WebSocket upgrade: HTTP %d", u.Host, resp.StatusCode)
		}
		return nil, fmt.Errorf("reach: connect to broker %s: %w", u.Host, err)
	}
	if batch != nil {
		conn.SetBatch(batch)
	}
	// Text messages are at most 4096 bytes, stream messages at most 1 MiB.
	conn.SetReadLimit(wire.MaxClientFrame)

	rctx, cancel := context.WithTimeout(ctx, cfg.RegisterTimeout)
	defer cancel()
	sid, err := register(rctx, conn, reg)
	if err != nil {
		conn.CloseNow()
		var we *wire.Error
		if errors.As(err, &we) {
			log.Debug().Str("code", string(we.Code)).Msg("broker refused the client registration")
		}
		return nil, err
	}
	log.Debug().Str("stream_id", sid.String()).Msg("matched")
	return newConn(conn, sid, local, remote, cfg, log), nil
}

// register sends the register message and reads the broker's answer, which
// must be `matched` or `error`.
func register(ctx context.Context, ws msgconn.Conn, reg []byte) (wire.ID, error) {
	if err := ws.Write(ctx, msgconn.Text, reg); err != nil {
		return wire.ID{}, fmt.Errorf("reach: send registration: %w", err)
	}
	typ, data, err := ws.Read(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return wire.ID{}, errors.New("reach: the broker did not answer the registration in time")
		}
		if st := msgconn.CloseStatus(err); st != -1 {
			return wire.ID{}, closeError(err)
		}
		return wire.ID{}, fmt.Errorf("reach: wait for the broker's answer: %w", err)
	}
	if typ != msgconn.Text {
		return wire.ID{}, errors.New("reach: the broker sent stream bytes before `matched`")
	}
	m, err := wire.ParseBrokerMessage(data)
	if err != nil {
		return wire.ID{}, fmt.Errorf("reach: the broker's answer breaks the protocol: %w", err)
	}
	switch m := m.(type) {
	case wire.Matched:
		return m.StreamID, nil
	case wire.ErrorMsg:
		return wire.ID{}, &wire.Error{Code: m.Code, Detail: "the broker refused the registration"}
	default:
		return wire.ID{}, fmt.Errorf("reach: the broker answered the registration with %q", m.Type())
	}
}

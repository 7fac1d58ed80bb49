// Reach figures of `make bench`: the same transfers as a client of a
// rendezvous broker makes them (outer wss:// to the broker, inner pinned TLS
// to the front carried in the stream), and directly, for the ratio.
//
// Credentials travel between the script and this tool only in 0600 files
// (-reach FILE); nothing here prints or logs a token.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/pinning"
)

// Bounds of the Reach subcommands.
const (
	maxCredFile      = 64 << 10
	maxCAFile        = 1 << 20
	maxIdleHosts     = 1 << 16 // the hosts file's own bound (store.MaxHostsEntries)
	maxStreamsPerHst = 64
	xferChunk        = 256 << 10 // one Write of the upload body / one Read of the download
	maxXferSize      = 16 << 20  // the front's request body limit
	transferTimeout  = time.Minute
	frontServerName  = "127.0.0.1" // the bench front's authority (advertise: 127.0.0.1)
)

// reachCred is what the script hands to the load side: where to register
// and with which credential. The token is a wire.Secret, so an accidental
// %v or json.Marshal of the struct redacts it.
type reachCred struct {
	BrokerURL string      `json:"broker_url"`
	HostID    string      `json:"host_id"`
	Kind      string      `json:"credential_kind"`
	Token     wire.Secret `json:"token"`
}

// credFile is the on-disk form; only writeCred and loadCred see the raw token.
type credFile struct {
	BrokerURL string `json:"broker_url"`
	HostID    string `json:"host_id"`
	Kind      string `json:"credential_kind"`
	Token     string `json:"token"`
}

func writeCred(path string, c reachCred) error {
	b, err := json.Marshal(credFile{c.BrokerURL, c.HostID, c.Kind, string(c.Token)})
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func loadCred(path string) (reachCred, error) {
	b, err := readBounded(path, maxCredFile)
	if err != nil {
		return reachCred{}, err
	}
	var f credFile
	if err := json.Unmarshal(b, &f); err != nil {
		return reachCred{}, fmt.Errorf("%s: not a credential file", path)
	}
	c := reachCred{f.BrokerURL, f.HostID, f.Kind, wire.Secret(f.Token)}
	if err := brokerLoopback(c.BrokerURL); err != nil {
		return reachCred{}, err
	}
	return c, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// brokerLoopback refuses a broker that is not on a loopback IP literal: the
// bench never sends traffic off the machine.
func brokerLoopback(raw string) error {
	u, err := wire.ParseBrokerURL(raw)
	if err != nil {
		return err
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	return loopbackOnly(net.JoinHostPort(u.Hostname(), port))
}

// loadPool trusts exactly the PEM certificates in file (the bench broker's
// self-signed certificate), not the system roots.
func loadPool(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, errors.New("need -ca-file (the broker's certificate)")
	}
	b, err := readBounded(file, maxCAFile)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", file)
	}
	return p, nil
}

func (c reachCred) config(pool *x509.CertPool) client.Config {
	return client.Config{
		BrokerURL: c.BrokerURL, HostID: c.HostID, CredentialKind: c.Kind,
		Token: c.Token, RootCAs: pool, Log: zerolog.Nop(),
	}
}

// frontDialer opens one pinned TLS connection to the front: directly over
// TCP, or as the inner TLS of a broker stream. Both use the client
// library's pinned configuration, so the two paths differ only in the
// transport under the inner TLS.
type frontDialer struct {
	addr  string         // the front's host:port; also the Host of requests
	pin   string         // sha256/<b64>
	reach *client.Config // nil: direct
	dials atomic.Int64
}

func newFrontDialer(addr, pin, credPath, caFile string) (*frontDialer, error) {
	if err := loopbackOnly(addr); err != nil {
		return nil, err
	}
	if _, err := decodePin(pin); err != nil {
		return nil, err
	}
	d := &frontDialer{addr: addr, pin: pin}
	if credPath == "" {
		return d, nil
	}
	cred, err := loadCred(credPath)
	if err != nil {
		return nil, err
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	cfg := cred.config(pool)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d.reach = &cfg
	return d, nil
}

func (d *frontDialer) via() string {
	if d.reach != nil {
		return "broker"
	}
	return "direct"
}

func (d *frontDialer) dial(ctx context.Context) (*tls.Conn, error) {
	d.dials.Add(1)
	ctx, cancel := context.WithTimeout(ctx, 2*dialTimeout)
	defer cancel()
	if d.reach != nil {
		return client.DialTLS(ctx, *d.reach, frontServerName, d.pin)
	}
	return pinning.DialPinned(ctx, d.addr, frontServerName, d.pin)
}

// dialWSVia runs a WebSocket upgrade over connections from dial, so the
// same echo code measures a direct connection and a broker stream.
func dialWSVia(ctx context.Context, wsURL string, dial func(context.Context) (*tls.Conn, error)) (*websocket.Conn, error) {
	tr := &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("plaintext refused")
		},
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		DisableCompression: true,
		MaxIdleConns:       -1,
	}
	c, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{
		HTTPClient:      &http.Client{Transport: tr, Timeout: 2 * dialTimeout},
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("%w (HTTP %d)", err, resp.StatusCode)
		}
		return nil, err
	}
	c.SetReadLimit(maxMessage)
	return c, nil
}

// ---------------------------------------------------------------- reach-idle

// Command loadgen is the measuring half of `make bench`: a fast loopback
// upstream that looks like the Hermes services to both fronts under test, and
// the load generators wrk cannot be (fresh TLS handshakes, WebSocket echo and
// idle WebSockets). bench/run.sh starts every process and prints the table;
// this tool only measures and prints `key=value` lines for the script.
//
// Server CPU is read from /proc (utime+stime of the server process and all
// its descendants, e.g. nginx master + worker) at the edges of the measured
// window, so connection set-up and warm-up are not counted.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// Bounds that keep every loop and buffer of the tool finite.
const (
	maxConns      = 20000   // per run, WebSocket or handshake workers
	maxSamples    = 5000000 // RTT samples kept (one connection cannot exceed this in minutes)
	maxDuration   = 10 * time.Minute
	maxMessage    = 1 << 20 // upstream and client read limit per WebSocket message
	smallBodySize = 100
	bigBodySize   = 8 << 20
	maxBulkCopies = 8 // /bulk?n=N: at most 8 × bigBodySize
	dialTimeout   = 10 * time.Second
	clkTck        = 100 // USER_HZ on Linux; /proc/<pid>/stat times are in these ticks
)

// command is one subcommand: its name, its usage lines and its entry point.
type command struct {
	name, usage string
	run         func(args []string) error
}

// commands is a function, not a variable: usage refers to it, and main's
// dispatch refers to usage.
func commands() []command {
	return []command{
		{"upstream", "-listen ADDR            fake Relay/API upstream: /small /big /sink /health /ws", cmdUpstream},
		{"proc", "-pids P[,P]             print cpu_us and rss_kib of the processes and descendants", cmdProc},
		{"freeports", "-n N                    print N free loopback TCP ports", cmdFreePorts},
		{"waitport", "-addr ADDR -timeout D   wait until ADDR accepts TCP", cmdWaitPort},
		{"get", "-url HTTPS -pin PIN     one pinned GET: print status and body length", cmdGet},
		{"handshakes", "-addr ADDR -pin PIN     fresh TLS handshakes per second", cmdHandshakes},
		{"h3", "-url HTTPS -pin PIN -conns N -size B   GET loop over HTTP/3 (QUIC): rate, MB/s, server CPU", cmdH3},
		{"h3get", "-url HTTPS -pin PIN     one pinned GET over HTTP/3: print status and body length", cmdH3Get},
		{"echo", "-url WSS -pin PIN       WebSocket echo round trips\n" +
			"             (-reach CRED -ca-file PEM: the WebSocket goes through the broker)", cmdEcho},
		{"idle", "-url WSS -pin PIN       RSS increase for idle WebSockets", cmdIdle},
		{"xfer", "-mode download|upload -addr ADDR -pin PIN [-reach CRED -ca-file PEM]\n" +
			"                                     single-stream MB/s, direct or through a broker", cmdXfer},
		{"reach-route", "-admin SOCK -addr ADDR -pin PIN -ca-file PEM -out CRED\n" +
			"                                     bootstrap -> /relay/ws via broker -> route credential", cmdReachRoute},
		{"soak", "-addr ADDR -pin PIN -metrics ADDR [-broker-metrics ADDR -reach CRED,... -ca-file PEM]\n" +
			"                                     steady mixed load; fails on client errors or resource growth", cmdSoak},
		{"reach-idle", "-broker-url WSS -ca-file PEM -hosts JSONL -pids BROKER [-metrics ADDR -hold DUR]\n" +
			"                                     broker RSS and goroutines per idle host and per idle stream", cmdReachIdle},
		{"reach-bulk", "-mode upload|download -broker-url WSS -ca-file PEM -host JSON -pids BROKER\n" +
			"                                     broker CPU per GB, one stream of 1 MiB client messages, raw bytes", cmdReachBulk},
		{"aead-floor", "-duration D             CPU per GB of two AES-128-GCM passes (the broker's floor), run on its core", cmdAEADFloor},
		{"reach-hosts", "-n N -hosts-file FILE -out JSONL   a broker hosts file with N fresh hosts, in one write", cmdReachHosts},
		{"reach-scale", "-broker-url WSS -ca-file PEM -hosts JSONL -pids BROKER -metrics ADDR -levels S,S\n" +
			"                                     broker CPU per registration and per match at each stream-table size,\n" +
			"                                     RSS and goroutines per idle socket, keepalive CPU", cmdReachScale},
		{"keepalive-server", "-listen ADDR -cert PEM -key PEM   a bare TLS server that pings and answers pings (the keepalive floor)", cmdKeepaliveServer},
		{"keepalive-floor", "-addr ADDR -ca-file PEM -n N -pids SERVER [-window DUR]\n" +
			"                                     that server's CPU per idle socket and ping interval", cmdKeepaliveFloor},
	}
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	for _, c := range commands() {
		if c.name != os.Args[1] {
			continue
		}
		if err := c.run(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "loadgen %s: %v\n", c.name, err)
			os.Exit(1)
		}
		return
	}
	usage()
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: loadgen <command> [flags]")
	for _, c := range commands() {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", c.name, c.usage)
	}
	os.Exit(2)
}

// ---------------------------------------------------------------- small helpers

// loopbackURL accepts only https:// URLs on a loopback IP address.
func loopbackURL(u string) error { return schemeLoopback(u, "https") }

// schemeLoopback accepts only scheme:// URLs on a loopback IP address.
func schemeLoopback(u, scheme string) error {
	rest, ok := strings.CutPrefix(u, scheme+"://")
	if !ok {
		return errors.New("-url must be " + scheme + "://127.0.0.1:PORT/path")
	}
	hostport, _, _ := strings.Cut(rest, "/")
	return loopbackOnly(hostport)
}

// loopbackOnly refuses any target that is not a loopback IP literal: the bench
// must never send traffic off the machine.
func loopbackOnly(hostport string) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return err
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s: only loopback IP addresses are allowed", hostport)
	}
	return nil
}

// ---------------------------------------------------------------- TLS client

// clientTLS is the client side the issue prescribes: X25519 only, no session
// resumption (every handshake is a full one), and trust by pin, not by CA.
func clientTLS(pin string, alpn []string) (*tls.Config, error) {
	want, err := decodePin(pin)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:             tls.VersionTLS12,
		CurvePreferences:       []tls.CurveID{tls.X25519},
		SessionTicketsDisabled: true,
		ClientSessionCache:     nil,
		NextProtos:             alpn,
		InsecureSkipVerify:     true, // replaced by the pin check below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no peer certificate")
			}
			got := sha256.Sum256(cs.PeerCertificates[0].RawSubjectPublicKeyInfo)
			if got != want {
				return errors.New("spki pin mismatch")
			}
			return nil
		},
	}, nil
}

func decodePin(pin string) ([32]byte, error) {
	var out [32]byte
	b64, ok := strings.CutPrefix(pin, "sha256/")
	if !ok {
		return out, errors.New("pin must look like sha256/<base64>")
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != 32 {
		return out, errors.New("pin must hold 32 base64 bytes")
	}
	copy(out[:], raw)
	return out, nil
}

// ---------------------------------------------------------------- WebSocket

func dialWS(ctx context.Context, url string, cfg *tls.Config) (*websocket.Conn, error) {
	tr := &http.Transport{
		TLSClientConfig:     cfg,
		DisableCompression:  true,
		MaxIdleConnsPerHost: -1,
		TLSHandshakeTimeout: dialTimeout,
	}
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient:      &http.Client{Transport: tr, Timeout: dialTimeout},
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

// relayAuth sends the Relay's first frame and waits for auth.ok, as a real
// client of /relay/ws does before it can exchange messages.
func relayAuth(ctx context.Context, c *websocket.Conn, id int) error {
	frame := fmt.Sprintf(`{"channel":"system","type":"auth","id":"%d","payload":{"session_token":"x"}}`, id)
	if err := c.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
		return err
	}
	_, b, err := c.Read(ctx)
	if err != nil {
		return err
	}
	if !bytes.Contains(b, []byte(`"type":"auth.ok"`)) {
		return fmt.Errorf("unexpected first reply %.80q", b)
	}
	return nil
}

// wsTarget accepts only wss:// URLs on a loopback IP address.
func wsTarget(url string) error { return schemeLoopback(url, "wss") }

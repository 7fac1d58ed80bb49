package main

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/internal/pairing"
)

func pairCommand() *cli.Command {
	return &cli.Command{
		Name:  "pair",
		Usage: "produce a pairing QR carrying the running daemon's pin (asks the loopback Relay to mint and sign it)",
		Flags: []cli.Flag{
			configFlag,
			&cli.StringFlag{Name: "relay", Usage: "the Relay's loopback base `URL` (default: upstreams.relay)"},
			&cli.StringFlag{Name: "ttl", Usage: "session lifetime `DURATION`: seconds, or units s m h d w (30d, 1d12h); 0 or never = no expiry (default: the Relay's)"},
			&cli.StringFlag{Name: "grants", Usage: "per-channel lifetimes `SPEC`, e.g. terminal=7d,bridge=1d (sent to the Relay as seconds)"},
			&cli.BoolFlag{Name: "no-reach", Usage: "leave the Reach (broker) route out of the QR"},
			&cli.StringSliceFlag{Name: "lan", Usage: "add a plain (no TLS) LAN route `HOST[:API_PORT[:RELAY_PORT]]`, ports defaulting to 8642 and 8767 (repeatable)"},
			&cli.StringFlag{Name: "dashboard-url", Usage: "Dashboard `URL` to put in the payload"},
			&cli.BoolFlag{Name: "json", Usage: "print {payload, invite_url, code_expires_at, routes} as JSON"},
			&cli.StringFlag{Name: "png", Usage: "also write the QR as a PNG to `FILE`"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			return runPair(c)
		},
	}
}

func runPair(c *cli.Context) error {
	ctx := c.Context
	e, err := loadEnv(c.String("config"), false)
	if err != nil {
		return err
	}
	// Everything the operator asked for is parsed before anything is minted.
	var lans []pairing.LANRoute
	for _, l := range c.StringSlice("lan") {
		r, err := pairing.ParseLAN(l)
		if err != nil {
			return fmt.Errorf("--lan %q: %w", l, err)
		}
		lans = append(lans, r)
	}
	req := pairing.MintRequest{DashboardURL: c.String("dashboard-url")}
	if s := c.String("ttl"); s != "" {
		ttl, err := pairing.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("--ttl: %w", err)
		}
		req.TTLSeconds = &ttl
	}
	if s := c.String("grants"); s != "" {
		g, err := pairing.ParseGrants(s)
		if err != nil {
			return fmt.Errorf("--grants: %w", err)
		}
		req.Grants = g
	}
	relayRaw := c.String("relay")
	if relayRaw == "" {
		relayRaw = e.Cfg.Upstreams.Relay
	}
	relayBase, err := config.ParseUpstream(relayRaw, false)
	if err != nil {
		return fmt.Errorf("--relay: %w", err)
	}

	// 1. The identity the daemon serves right now — never a file it may not use.
	cl := adminClient(e)
	ident, err := cl.Identity(ctx)
	if err != nil {
		if errors.Is(err, admin.ErrNoDaemon) {
			return fmt.Errorf("%w; start it (systemctl start securelink) before pairing", err)
		}
		return err
	}
	cand := ident.Candidate
	if err := cand.Validate(); err != nil {
		return fmt.Errorf("the daemon's candidate is not one clients accept: %w", err)
	}
	// Reach as the daemon runs it, not as the file says now: the file may
	// have changed since the daemon last loaded it.
	st, err := cl.Status(ctx)
	if err != nil {
		return err
	}
	if st.Reach.Enabled != e.Cfg.Reach.Enabled {
		fmt.Fprintf(os.Stderr, "note: %s says reach.enabled: %t but the running daemon has Reach %s; pairing with what it runs (a Reach change needs a restart: systemctl restart securelink)\n",
			e.Cfg.File, e.Cfg.Reach.Enabled, map[bool]string{true: "on", false: "off"}[st.Reach.Enabled])
	}
	var broker *pairing.BrokerBootstrap
	if st.Reach.Enabled && !c.Bool("no-reach") {
		// TTL 0: wire.DefaultBootstrapTTL, the pairing code's 10-minute life.
		b, code, err := cl.Bootstrap(ctx, admin.BootstrapRequest{})
		switch {
		case code == http.StatusConflict:
			return errors.New("Reach is enabled but the daemon is not connected to its broker; fix that (securelink status) or pair without it: securelink pair --no-reach")
		case err != nil:
			return fmt.Errorf("Reach bootstrap: %w (or pair without Reach: --no-reach)", err)
		}
		broker = &b
	}

	// 2. Our endpoints, in order.
	eps, err := pairing.BuildEndpoints(cand, lans, broker)
	if err != nil {
		return err
	}
	req.Endpoints = eps

	// 3. The Relay mints the code and signs.
	resp, err := pairing.Mint(ctx, relayBase, req)
	if err != nil {
		return fmt.Errorf("%w (is the Hermes Relay running at %s?)", err, relayBase.Redacted())
	}

	// 4. What it signed must hold exactly our routes and no foreign pin.
	if err := resp.Payload.CheckEndpoints(eps); err != nil {
		return fmt.Errorf("refusing the Relay's payload: %w", err)
	}
	key, keyPath, err := verifyWithQRSecret(resp.Payload)
	if err != nil {
		return err
	}
	// The Android app reads ttl_seconds and grants (and a few more) as
	// integers; the Relay writes our seconds as floats.
	norm, changed, err := pairing.NormalizeAppIntegers(resp.Payload.Tree())
	if err != nil {
		return fmt.Errorf("refusing the Relay's payload: the Android app would reject it: %w", err)
	}
	if len(changed) > 0 {
		if key == nil {
			return fmt.Errorf("the Relay wrote %s as floats, which the Android app rejects (it then imports the Dashboard only, without the pin); "+
				"pair turns them into integers and re-signs with the Relay's QR secret, but cannot read %s: "+
				"run pair as root with the Hermes user's HERMES_HOME (sudo HERMES_HOME=... securelink pair), or as the Hermes user "+
				"when the daemon runs as that user (the admin socket admits only the daemon's user and root), or drop --ttl/--grants",
				strings.Join(changed, ", "), keyPath)
		}
		if resp, err = resp.Resigned(key, norm); err != nil {
			return fmt.Errorf("re-signing the Relay's payload with integers: %w", err)
		}
		if err := resp.Payload.CheckEndpoints(eps); err != nil {
			return fmt.Errorf("refusing the re-signed payload: %w", err)
		}
		fmt.Fprintf(os.Stderr, "note: the Relay wrote %s as floats; re-signed with integers so the Android app accepts the QR\n", strings.Join(changed, ", "))
	}
	notes := pairNotes(cand, broker)

	routes := make([]string, 0, len(eps))
	for _, ep := range eps {
		routes = append(routes, pairing.RouteSummary(ep))
	}
	invite := pairing.InviteURL(resp.QRPayload)
	_, qrErr := pairing.TerminalColumns(resp.QRPayload)
	tooLarge := errors.Is(qrErr, pairing.ErrTooLargeForQR)

	if c.Bool("json") {
		out := struct {
			Payload       json.RawMessage      `json:"payload"`
			InviteURL     string               `json:"invite_url"`
			CodeExpiresAt int64                `json:"code_expires_at"`
			Routes        []string             `json:"routes"`
			ClientNotes   []pairing.ClientNote `json:"client_notes"`
		}{json.RawMessage(resp.QRPayload), invite, resp.ExpiresAt, routes, notes}
		if err := printJSON(out); err != nil {
			return err
		}
	} else {
		fmt.Printf("Hermes Secure Link pairing\n  authority   %s\n  pin         %s\n  code        expires %s (in %s)\n  routes\n",
			ident.Authority, ident.PinSHA256, time.Unix(resp.ExpiresAt, 0).UTC().Format(time.RFC3339),
			time.Until(time.Unix(resp.ExpiresAt, 0)).Round(time.Second))
		for _, r := range routes {
			fmt.Printf("    - %s\n", r)
		}
		fmt.Print(formatClientNotes(notes))
		fmt.Printf("  re-pair     %s\n", pairing.DesktopForgetHint(cand.Proxy.URL))
		fmt.Printf("\nInvite URL (for devices that cannot scan):\n%s\n\n", invite)
	}
	if tooLarge {
		return qrErr
	}
	if p := c.String("png"); p != "" {
		if err := pairing.WritePNG(p, resp.QRPayload); err != nil {
			return fmt.Errorf("--png: %w", err)
		}
		fmt.Fprintf(os.Stderr, "QR written to %s\n", p)
	}
	if !c.Bool("json") {
		cols := terminalColumns()
		qr, err := pairing.RenderTerminal(resp.QRPayload, cols)
		switch {
		case err == nil:
			fmt.Print(qr)
			fmt.Println("Scan with the Hermes app. The code is single-use.")
		case errors.Is(err, pairing.ErrQRTooWide):
			fmt.Printf("The QR needs a wider terminal than %d columns: widen it, use --png FILE, or use the invite URL above.\n", cols)
		default:
			return err
		}
	}
	return nil
}

// verifyWithQRSecret checks the Relay's signature with its QR secret when
// that is readable (pairing.md step 4) and returns the secret for
// re-signing; nil when it cannot be read (a warning, not a failure).
func verifyWithQRSecret(p *pairing.Payload) (key []byte, path string, err error) {
	path, err = pairing.DefaultQRSecretPath()
	if err != nil {
		return nil, "$HERMES_HOME/" + pairing.QRSecretFileName, nil
	}
	key, err = pairing.LoadQRSecret(path)
	var loose *pairing.LooseModeError
	switch {
	case errors.As(err, &loose):
		fmt.Fprintln(os.Stderr, "warning:", err)
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission):
		fmt.Fprintf(os.Stderr, "warning: cannot read the QR secret %s to verify the signature (run as root with the Hermes user's HERMES_HOME to check it)\n", path)
		return nil, path, nil
	case err != nil:
		return nil, path, err
	}
	if verr := pairing.Verify(key, p.Tree()); verr != nil {
		return nil, path, fmt.Errorf("the Relay's signature does not verify with %s: %w", path, verr)
	}
	return key, path, nil
}

// pairNotes says what each shipped client cannot do with this pairing.
func pairNotes(cand pairing.PluginProxyCandidate, broker *pairing.BrokerBootstrap) []pairing.ClientNote {
	var f pairing.ClientFacts
	if u, err := url.Parse(cand.Proxy.URL); err == nil {
		f.AuthorityHost = u.Hostname()
	}
	if der, err := base64.StdEncoding.DecodeString(cand.Proxy.CertDER); err == nil {
		if leaf, err := x509.ParseCertificate(der); err == nil {
			f = pairing.IdentityFacts(f.AuthorityHost, leaf)
		}
	}
	if broker != nil {
		f.Reach = true
		if u, err := url.Parse(broker.BrokerURL); err == nil {
			f.BrokerHost = u.Hostname()
		}
	}
	return pairing.ClientNotes(f)
}

// formatClientNotes renders notes as an indented "clients" block for the
// text output of pair and pin --rotate ("" when there are none).
func formatClientNotes(notes []pairing.ClientNote) string {
	if len(notes) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("  clients\n")
	for _, n := range notes {
		fmt.Fprintf(&b, "    - %s: %s\n      fix: %s\n", n.Client, n.Problem, n.Fix)
	}
	return b.String()
}

// terminalColumns is $COLUMNS, else 80.
func terminalColumns() int {
	if n, err := strconv.Atoi(strings.TrimSpace(os.Getenv("COLUMNS"))); err == nil && n > 0 {
		return n
	}
	return 80
}

// Package doctor diagnoses a Secure Link installation the way an operator
// would, one check at a time, and says how to fix each failure.
//
// It only reads: it never creates an identity, never writes the remembered
// authority, and never registers with a broker (which would displace the
// running daemon's registration).
package doctor

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
	"net/url"
	"os"
	"time"

	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/internal/pairing"
	"github.com/hermes-securelink/securelink/internal/probe"
	"github.com/hermes-securelink/securelink/internal/trust"
	"github.com/hermes-securelink/securelink/pinning"
)

// Status of one check.
type Status string

const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "FAIL"
)

// Result is one line of the report.
type Result struct {
	Check  string
	Status Status
	Detail string
	Fix    string
}

// Options tunes the checks; zero values get defaults.
type Options struct {
	// Timeout bounds each network check (3 s).
	Timeout time.Duration
	// MaxSkew is the largest tolerated clock difference with an upstream (60 s).
	MaxSkew time.Duration
	// ExpiryWarning is how close to expiry a certificate warns (30 days).
	ExpiryWarning time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.Timeout <= 0 {
		o.Timeout = 3 * time.Second
	}
	if o.MaxSkew <= 0 {
		o.MaxSkew = 60 * time.Second
	}
	if o.ExpiryWarning <= 0 {
		o.ExpiryWarning = 30 * 24 * time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Failed reports whether any result is a failure.
func Failed(rs []Result) bool {
	for _, r := range rs {
		if r.Status == Fail {
			return true
		}
	}
	return false
}

// Format renders results one line each, with the fix under each failure.
func Format(rs []Result) string {
	var b []byte
	for _, r := range rs {
		b = fmt.Appendf(b, "%-4s  %-18s %s\n", r.Status, r.Check, r.Detail)
		if r.Fix != "" && r.Status != OK {
			b = fmt.Appendf(b, "      %-18s fix: %s\n", "", r.Fix)
		}
	}
	return string(b)
}

// Run checks everything that can be checked for cfg and stateDir. cfg may be
// nil when the configuration failed to load; cfgErr then says why.
func Run(ctx context.Context, cfg *config.Config, cfgErr error, stateDir string, o Options) []Result {
	o.defaults()
	var rs []Result
	add := func(r Result) { rs = append(rs, r) }
	if cfgErr != nil {
		add(Result{"config", Fail, cfgErr.Error(), "correct the key named at file:line (see config.example.yaml)"})
		return rs
	}
	src := cfg.File
	if src == "" {
		src = "built-in defaults"
	}
	if err := cfg.CheckFiles(); err != nil {
		add(Result{"config", Fail, err.Error(), "fix the file named at file:line"})
	} else {
		add(Result{"config", OK, src, ""})
		// The warning serve logs for a host token its group may read.
		if cfg.Reach.Enabled {
			if fi, err := os.Stat(cfg.Reach.HostTokenFile); err == nil {
				if w := atomicfile.GroupWarning("reach.host_token_file", cfg.Reach.HostTokenFile, fi.Mode(), "the host token"); w != "" {
					add(Result{"config", Warn, w, "see the message"})
				}
			}
		}
	}

	idOK, auth := checkStateAndIdentity(cfg, stateDir, o, add)
	var localPin string
	if idOK != nil {
		localPin = idOK.Pin
	}
	checkUpstreams(ctx, cfg, o, add)
	st := checkDaemon(ctx, cfg, stateDir, localPin, o, add)
	if cfg.Reach.Enabled && st != nil {
		checkConnector(st.Reach, add)
	}
	if cfg.TLS.Mode == pinning.ModeACME {
		checkACME(cfg, stateDir, auth, idOK, st, o, add)
	}
	if cfg.HTTP3 {
		checkHTTP3(ctx, cfg, st, o, add)
	}
	if cfg.Reach.Enabled {
		checkBroker(ctx, cfg, o, add)
	} else {
		add(Result{"reach", OK, "disabled", ""})
	}
	return rs
}

// checkBroker looks the broker up, completes a TLS handshake with the trust
// the connector uses and reads GET /health. It never registers: a
// registration with the host's credentials would displace the daemon's.
func checkBroker(ctx context.Context, cfg *config.Config, o Options, add func(Result)) {
	u, err := wire.ParseBrokerURL(cfg.Reach.BrokerURL)
	if err != nil {
		add(Result{"reach broker", Fail, "reach.broker_url is not wss://host[:port]/v1/connect", "fix reach.broker_url"})
		return
	}
	host := u.Hostname()
	lctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	if _, err := net.DefaultResolver.LookupHost(lctx, host); err != nil {
		add(Result{"reach dns", Fail, fmt.Sprintf("%s does not resolve (%s)", host, errKind(err)), "check the broker's DNS name and this host's resolver"})
		return
	}
	add(Result{"reach dns", OK, host + " resolves", ""})
	pool, err := trust.BrokerRoots(cfg.Reach.CAFile)
	if err != nil {
		add(Result{"reach tls", Fail, err.Error(), "fix reach.ca_file"})
		return
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	hc := &http.Client{
		Timeout: o.Timeout,
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	health := &url.URL{Scheme: "https", Host: net.JoinHostPort(host, port), Path: "/health"}
	status, body, date, err := get(ctx, hc, health)
	if err != nil {
		var ce *tls.CertificateVerificationError
		if errors.As(err, &ce) {
			add(Result{"reach tls", Fail, "the broker's certificate is not trusted: " + ce.Err.Error(), "use a publicly trusted certificate on the broker, or set reach.ca_file to its CA"})
			return
		}
		add(Result{"reach broker", Fail, fmt.Sprintf("%s unreachable (%s)", health.Host, errKind(err)), "check that the broker runs and that outbound connections to it are allowed"})
		return
	}
	add(Result{"reach tls", OK, "certificate trusted for " + host, ""})
	var h struct {
		OK      bool   `json:"ok"`
		Service string `json:"service"`
		Version int    `json:"protocol_version"`
	}
	if status != http.StatusOK || json.Unmarshal(body, &h) != nil || !h.OK || h.Service != "hermes_reach" || h.Version != 1 {
		add(Result{"reach broker", Fail, fmt.Sprintf("%s/health is not a Reach v1 broker (status %d)", health.Host, status), "check reach.broker_url"})
	} else {
		add(Result{"reach broker", OK, health.Host + " answers as a Reach v1 broker", ""})
	}
	if !date.IsZero() {
		if skew := o.Now().Sub(date); skew > o.MaxSkew || -skew > o.MaxSkew {
			add(Result{"clock broker", Fail, fmt.Sprintf("the broker's clock differs from ours by %s", skew.Round(time.Second)),
				"synchronise clocks (e.g. systemd-timesyncd); credential expiry depends on them"})
		}
	}
}

func checkStateAndIdentity(cfg *config.Config, stateDir string, o Options, add func(Result)) (*pinning.Identity, pinning.Authority) {
	fi, err := os.Stat(stateDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		add(Result{"state_dir", Fail, stateDir + " does not exist", "start the daemon once (systemctl start securelink) or run `securelink pin` to create the identity"})
		return nil, pinning.Authority{}
	case err != nil:
		add(Result{"state_dir", Fail, err.Error(), "run doctor as the service user or root"})
		return nil, pinning.Authority{}
	case fi.Mode().Perm()&0o077 != 0:
		add(Result{"state_dir", Fail, fmt.Sprintf("%s has mode %04o", stateDir, fi.Mode().Perm()), "chmod 700 " + stateDir})
	default:
		add(Result{"state_dir", OK, stateDir, ""})
	}

	port := cfg.AdvertisePort
	if port == 0 {
		port, _ = config.ListenPort(cfg.Listen)
	}
	if port == 0 {
		add(Result{"authority", Fail, "listen has no fixed port", "set advertise_port"})
		return nil, pinning.Authority{}
	}
	if cfg.Advertise == "" {
		if _, err := os.Stat(pinning.AuthorityPath(stateDir)); err != nil {
			add(Result{"authority", Fail, "no authority detected yet", "start the daemon once, or set advertise in the configuration"})
			return nil, pinning.Authority{}
		}
	}
	ra, err := pinning.ResolveAuthority(pinning.ResolveOptions{StateDir: stateDir, Advertise: cfg.Advertise, Port: port})
	if err != nil {
		add(Result{"authority", Fail, err.Error(), "set advertise in the configuration"})
		return nil, pinning.Authority{}
	}
	if ra.Stale {
		add(Result{"authority", Fail, fmt.Sprintf("remembered address %s is no longer on this host", ra.Authority.Host),
			"set advertise: <this host's address> in the configuration, run `securelink pin --rotate --yes`, reload, and re-pair"})
	} else {
		add(Result{"authority", OK, fmt.Sprintf("%s (%s)", ra.Authority, ra.Source), ""})
	}

	id, err := pinning.Load(pinning.IdentityConfig{
		StateDir: stateDir, Mode: cfg.TLS.Mode, KeyType: cfg.TLS.KeyType,
		CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile,
		Authority: ra.Authority, ExtraNames: cfg.ExtraNames, Now: o.Now,
	})
	if err != nil {
		fix := "see the message; `securelink pin --rotate --yes` makes a new identity (clients must re-pair)"
		switch {
		case errors.Is(err, pinning.ErrSANMismatch):
			fix = "run `securelink pin --rotate --yes`, reload the daemon, and re-pair every client"
		case errors.Is(err, pinning.ErrNoIdentity):
			fix = "start the daemon once or run `securelink pin` to create it"
		}
		add(Result{"identity", Fail, err.Error(), fix})
		return nil, pinning.Authority{}
	}
	if cfg.TLS.Mode == pinning.ModeACME {
		// The key is the identity; checkACME judges its certificate.
		add(Result{"identity", OK, fmt.Sprintf("%s (the key in %s; certificates from ACME)", id.Pin, id.Source), ""})
		for _, w := range id.Warnings {
			add(Result{"identity", Warn, w, "see the message"})
		}
		checkClients(cfg, ra.Authority.Host, nil, add)
		return id, ra.Authority
	}
	now := o.Now()
	switch {
	case now.After(id.Leaf.NotAfter):
		add(Result{"identity", Fail, "certificate expired " + id.Leaf.NotAfter.UTC().Format(time.RFC3339), "install a renewed certificate (files mode) or rotate"})
	case id.Leaf.NotAfter.Sub(now) < o.ExpiryWarning:
		add(Result{"identity", Warn, "certificate expires " + id.Leaf.NotAfter.UTC().Format(time.RFC3339), "renew it before then, keeping the key so the pin survives"})
	default:
		add(Result{"identity", OK, fmt.Sprintf("%s, valid until %s", id.Pin, id.Leaf.NotAfter.UTC().Format("2006-01-02")), ""})
	}
	for _, w := range id.Warnings {
		add(Result{"identity", Warn, w, "see the message"})
	}
	checkClients(cfg, ra.Authority.Host, id.Leaf, add)
	return id, ra.Authority
}

// checkClients says what each shipped client cannot do with this front
// (pairing.md "What the shipped clients accept"): warnings, because the
// front itself is fine and other clients may be served.
func checkClients(cfg *config.Config, authorityHost string, leaf *x509.Certificate, add func(Result)) {
	f := pairing.IdentityFacts(authorityHost, leaf)
	if cfg.Reach.Enabled {
		f.Reach = true
		if u, err := wire.ParseBrokerURL(cfg.Reach.BrokerURL); err == nil {
			f.BrokerHost = u.Hostname()
		}
	}
	notes := pairing.ClientNotes(f)
	if len(notes) == 0 {
		add(Result{"clients", OK, "desktop and Android clients can use this front", ""})
		return
	}
	for _, n := range notes {
		check := "client " + n.Client
		if f.ProfileProblem != "" && n.Problem == f.ProfileProblem {
			check = "identity profile"
		}
		add(Result{check, Warn, n.Problem, n.Fix})
	}
}

func checkUpstreams(ctx context.Context, cfg *config.Config, o Options, add func(Result)) {
	hc := &http.Client{
		Timeout:       o.Timeout,
		Transport:     &http.Transport{Proxy: nil, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	type up struct{ name, raw, path, fix string }
	for _, u := range []up{
		{"relay", cfg.Upstreams.Relay, "/health", "start the Hermes Relay (expected at upstreams.relay)"},
		{"api", cfg.Upstreams.API, "/health", "start the Hermes API server (expected at upstreams.api)"},
		{"dashboard", cfg.Upstreams.Dashboard, "/api/health", "start the Hermes Dashboard (expected at upstreams.dashboard)"},
	} {
		base, err := config.ParseUpstream(u.raw, cfg.Upstreams.AllowRemote)
		if err != nil {
			add(Result{"upstream " + u.name, Fail, err.Error(), "fix upstreams." + u.name})
			continue
		}
		target := *base
		target.Path = base.Path + u.path
		status, body, date, err := get(ctx, hc, &target)
		check := "upstream " + u.name
		if err != nil {
			add(Result{check, Fail, fmt.Sprintf("%s unreachable (%s)", redact(base), errKind(err)), u.fix})
			continue
		}
		switch {
		case u.name == "dashboard" && !(status == http.StatusOK && probe.GateOn(body)):
			add(Result{check, Fail, fmt.Sprintf("%s answers, but its login gate is off (auth_required is not true): /dashboard answers 503", redact(base)),
				"turn on the Dashboard's own login, so its pages never embed a local operator token"})
		case status/100 != 2:
			add(Result{check, Fail, fmt.Sprintf("%s%s answered %d", redact(base), u.path, status), u.fix})
		default:
			add(Result{check, OK, redact(base) + " available", ""})
		}
		if !date.IsZero() {
			if skew := o.Now().Sub(date); skew > o.MaxSkew || -skew > o.MaxSkew {
				add(Result{"clock " + u.name, Fail, fmt.Sprintf("%s's clock differs from ours by %s", u.name, skew.Round(time.Second)),
					"synchronise clocks (e.g. systemd-timesyncd); expiry checks depend on them"})
			}
		}
	}
}

func get(ctx context.Context, hc *http.Client, u *url.URL) (int, []byte, time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, nil, time.Time{}, err
	}
	res, err := hc.Do(req)
	if err != nil {
		return 0, nil, time.Time{}, err
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	date, _ := http.ParseTime(res.Header.Get("Date"))
	return res.StatusCode, body, date, nil
}

// checkDaemon asks the daemon for its status; nil when it does not answer.
func checkDaemon(ctx context.Context, cfg *config.Config, stateDir, localPin string, o Options, add func(Result)) *admin.Status {
	sock := cfg.AdminSocket(stateDir)
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	st, err := admin.NewClient(sock).Status(ctx)
	if err != nil {
		fix := "start it: systemctl start securelink (or securelink serve)"
		switch {
		case errors.Is(err, admin.ErrUntrustedServer):
			fix = "another process holds the admin socket: stop it, remove the socket, then start securelink"
		case !errors.Is(err, admin.ErrNoDaemon):
			fix = "run doctor as the service user or root"
		}
		add(Result{"daemon", Fail, err.Error(), fix})
		return nil
	}
	if localPin != "" && st.PinSHA256 != localPin {
		add(Result{"daemon", Fail, fmt.Sprintf("serves %s but the identity on disk is %s", st.PinSHA256, localPin),
			"reload it (systemctl reload securelink), then re-pair clients with `securelink pair`"})
		return &st
	}
	add(Result{"daemon", OK, "running at " + st.Authority + ", admin socket " + sock, ""})
	return &st
}

// checkConnector reads the running connector's state from the daemon: the
// broker checks below only show that the broker answers, while a host it
// refuses (a wrong token or host id) waits ten minutes per attempt with
// every one of those checks passing.
func checkConnector(r connector.Status, add func(Result)) {
	const check = "reach connector"
	switch {
	case !r.Enabled:
		add(Result{check, Warn, "reach.enabled is true but the running daemon does not run Reach",
			"restart it (systemctl restart securelink): a reload does not apply reach.* changes"})
	case r.PermanentError != "":
		add(Result{check, Fail, "the broker refuses this host: " + r.PermanentError + " (the connector waits 10 minutes between attempts)",
			"check reach.host_id and reach.host_token_file against what `securelink broker add-host` printed for this host"})
	case !r.Ready:
		d := "not registered (" + r.State
		if r.LastError != "" {
			d += ", last error " + r.LastError
		}
		add(Result{check, Warn, d + ")", "see the reach checks below and `securelink status`"})
	default:
		add(Result{check, OK, "registered with the broker", ""})
	}
}

// redact shows an upstream as scheme://host:port only.
func redact(u *url.URL) string { return u.Scheme + "://" + u.Host }

func errKind(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return err.Error()
}

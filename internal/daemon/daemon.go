// Package daemon is the running front: it listens, serves the pinned-TLS
// front (and the Reach connector's streams through the same server), the
// admin socket and the metrics listener, reloads on request and drains on
// shutdown. cmd/securelink only turns flags into Options and prints.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/internal/metrics"
	"github.com/hermes-securelink/securelink/internal/sdnotify"
	"github.com/hermes-securelink/securelink/pinning"
	"github.com/hermes-securelink/securelink/proxy"
)

// ShutdownGrace bounds how long in-flight requests may run after SIGTERM.
const ShutdownGrace = 10 * time.Second

// Options is what the command line decides.
type Options struct {
	// ConfigFlag is --config ("" = $SECURELINK_CONFIG, the system file, or
	// built-in defaults; see config.ResolvePath).
	ConfigFlag string
	// Version is reported by GET /status.
	Version string
	// NewLogger builds the logger from the loaded configuration; nil logs
	// JSON lines to Stderr. The daemon applies log.level itself, through
	// zerolog's global level (set while Run runs), so a reload can change
	// it: the logger's own level is lifted to trace unless it is disabled.
	NewLogger func(*config.Config) zerolog.Logger
	// Stderr receives the configuration/state-directory announcement; nil
	// is os.Stderr.
	Stderr io.Writer
	// Reload: every value received re-reads configuration and identity
	// (the command wires SIGHUP here before anything is announced).
	Reload <-chan os.Signal
	// Ready is called once, when the front listens.
	Ready func(Ready)

	// ACMERenewalWindowRatio and ACMERenewCheckInterval shorten certmagic's
	// renewal schedule (acme.Options); for tests, zero in production.
	ACMERenewalWindowRatio float64
	ACMERenewCheckInterval time.Duration
	// ACMEDNSResolvers are asked for dns-01 records instead of the zone's
	// authoritative servers (acme.Options.DNSResolvers); for tests.
	ACMEDNSResolvers []string
}

// Ready is what the daemon serves once it listens.
type Ready struct {
	Addr        net.Addr
	Authority   pinning.Authority
	Pin         string
	AdminSocket string
	// SelfCheck is the watchdog's check (nil error = alive).
	SelfCheck func(context.Context) error
}

// daemon is the running front with what it needs to reload itself.
type daemon struct {
	opts       Options
	ctx        context.Context // Run's: managers started on reload stop with it
	log        zerolog.Logger
	front      *proxy.Server
	admin      *admin.Server
	started    time.Time
	listenAddr string
	boundPort  int
	http3      bool // serving HTTP/3 on the listen address's UDP port
	metrics    *metrics.Front
	metricsAt  string
	logFormat  string // log.format the logger was built with
	reach      *connector.Connector
	reachCfg   config.Reach

	mu        sync.Mutex
	env       *config.Env
	authority pinning.Authority
	acme      *acme.Manager // tls.mode acme: the running manager
	acmeSig   string        // what it was built from (buildACME)
	acmeNeeds string        // what its challenge needs (status, logs)
	// renewFailPrior counts the failed renewals of managers a reload
	// replaced, so the metric stays a counter.
	renewFailPrior uint64
}

// built is what a configuration turns into: front options, the identity to
// serve and, in acme mode, a new manager to start (nil when the running one
// is kept).
type built struct {
	opts proxy.Options
	id   *pinning.Identity
	auth pinning.Authority
	acme *acmeBuilt
}

func (d *daemon) loadEnv(createState bool) (*config.Env, error) {
	e, err := config.LoadEnv(d.opts.ConfigFlag, createState)
	if err != nil {
		return nil, err
	}
	e.Announce(d.opts.Stderr)
	return e, nil
}

// Run serves until ctx is done (then drains in-flight requests for up to
// 10 s) or a listener fails.
func Run(ctx context.Context, o Options) error {
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.NewLogger == nil {
		o.NewLogger = func(c *config.Config) zerolog.Logger {
			lvl, err := zerolog.ParseLevel(c.Log.Level)
			if err != nil {
				lvl = zerolog.InfoLevel
			}
			return zerolog.New(o.Stderr).Level(lvl).With().Timestamp().Logger()
		}
	}
	d := &daemon{opts: o, started: time.Now().UTC(), ctx: ctx}
	e, err := d.loadEnv(true)
	if err != nil {
		return err
	}
	// log.level is applied through zerolog's global level, which a reload
	// can change: the daemon's logger passes every level (setLogLevel).
	defer zerolog.SetGlobalLevel(zerolog.GlobalLevel())
	log := o.NewLogger(e.Cfg)
	if log.GetLevel() != zerolog.Disabled {
		log = log.Level(zerolog.TraceLevel)
	}
	setLogLevel(e.Cfg.Log.Level)
	// net/http's Transport logs through the global logger (with bytes an
	// upstream sent): into the structured log, truncated, at debug level.
	proxy.CaptureStandardLog(log)
	d.log, d.listenAddr, d.logFormat = log, e.Cfg.Listen, e.Cfg.Log.Format

	lc := net.ListenConfig{KeepAlive: proxy.DefaultLimits().TCPKeepAlive}
	ln, err := lc.Listen(ctx, "tcp", e.Cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", e.Cfg.Listen, err)
	}
	defer ln.Close()
	d.boundPort = ln.Addr().(*net.TCPAddr).Port

	if e.Cfg.Metrics.Listen != "" {
		d.metrics, d.metricsAt = metrics.NewFront(), e.Cfg.Metrics.Listen
	}
	// Kept whether or not Reach runs: a reload compares against it.
	d.reachCfg = e.Cfg.Reach
	if e.Cfg.Reach.Enabled {
		if d.reach, err = newConnector(e.Cfg.Reach, log); err != nil {
			return err
		}
	}
	b, err := d.build(e)
	if err != nil {
		return err
	}
	if err := b.acme.start(ctx); err != nil {
		b.acme.abandon()
		return err
	}
	opts, id, auth := b.opts, b.id, b.auth
	front, err := proxy.New(opts, id)
	if err != nil {
		b.acme.abandon()
		return err
	}
	d.commitACME(b.acme, e.Cfg.TLS.Mode == pinning.ModeACME, e.Cfg.TLS.ACME.Needs())
	defer d.closeACME()
	d.env, d.authority = e, auth
	d.front = front
	if d.metrics != nil {
		front.RegisterMetrics(d.metrics)
		d.registerTLSMetrics(d.metrics)
		if d.reach != nil {
			registerReachMetrics(d.metrics, d.reach)
		}
		ml, err := metrics.Listen(d.metricsAt, d.metrics.Registry())
		if err != nil {
			return fmt.Errorf("metrics.listen: %w", err)
		}
		go func() {
			if err := ml.Serve(); err != nil {
				log.Error().Err(err).Msg("metrics listener stopped")
			}
		}()
		defer ml.Shutdown(context.Background())
		log.Info().Str("event", "metrics").Str("listen", ml.Addr().String()).Msg("metrics at /metrics")
	}

	adm, err := admin.Listen(e.Cfg.AdminSocket(e.StateDir), log)
	if err != nil {
		return err
	}
	d.admin = adm
	d.registerAdmin()
	d.registerReachAdmin()
	go func() {
		if err := adm.Serve(); err != nil {
			log.Error().Err(err).Msg("admin socket stopped")
		}
	}()
	defer adm.Close()

	serveErr := make(chan error, 3)
	go func() { serveErr <- front.Serve(ln) }()
	if e.Cfg.HTTP3 {
		// The same address over UDP: the bound TCP address, so a
		// configured :0 gives both transports one port.
		pc, err := net.ListenPacket("udp", ln.Addr().String())
		if err != nil {
			return fmt.Errorf("http3: listen udp %s: %w", ln.Addr(), err)
		}
		defer pc.Close()
		d.http3 = true
		go func() { serveErr <- front.ServeQUIC(pc) }()
	}
	if d.reach != nil {
		// Broker streams are served in memory by the same front: one policy
		// path, and ServeReach marks them for the route-credential handoff.
		go func() { serveErr <- front.ServeReach(d.reach.Listener()) }()
		go func() {
			if err := d.reach.Run(ctx); err != nil && ctx.Err() == nil {
				log.Error().Err(err).Str("event", "reach_stopped").Msg("Reach connector stopped")
			}
		}()
	}
	notify := sdnotify.New(log)
	notify.Ready()
	notify.Status("serving %s, pin %s", auth, id.Pin)
	wdCtx, wdStop := context.WithCancel(ctx)
	defer wdStop()
	selfCheck := d.selfCheck(ln.Addr().(*net.TCPAddr))
	go notify.Watchdog(wdCtx, selfCheck)
	log.Info().Str("event", "listening").Str("listen", ln.Addr().String()).
		Str("authority", auth.String()).Str("pin_sha256", id.Pin).
		Str("admin_socket", adm.Path()).Bool("http3", d.http3).Msg("Secure Link front is up")
	if o.Ready != nil {
		o.Ready(Ready{Addr: ln.Addr(), Authority: auth, Pin: id.Pin, AdminSocket: adm.Path(), SelfCheck: selfCheck})
	}

	for {
		select {
		case <-o.Reload:
			notify.Reloading()
			d.reload()
			notify.Ready()
		case err := <-serveErr:
			return err
		case <-ctx.Done():
			notify.Stopping()
			wdStop()
			log.Info().Str("event", "stopping").Msg("draining in-flight requests")
			sctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
			err := front.Shutdown(sctx)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				log.Warn().Err(err).Msg("shutdown")
			}
			log.Info().Str("event", "stopped").Msg("stopped")
			return nil
		}
	}
}

// selfCheck completes a pinned TLS handshake with the front's own listener:
// the watchdog is fed only while the daemon really answers.
func (d *daemon) selfCheck(addr *net.TCPAddr) func(context.Context) error {
	target := *addr
	if target.IP == nil || target.IP.IsUnspecified() {
		target.IP = net.IPv4(127, 0, 0, 1)
		if addr.IP != nil && addr.IP.To4() == nil && !addr.IP.Equal(net.IPv6unspecified) {
			target.IP = net.IPv6loopback
		}
	}
	return func(ctx context.Context) error {
		d.mu.Lock()
		host := d.authority.Host
		d.mu.Unlock()
		c, err := pinning.DialPinned(ctx, target.String(), host, d.front.Identity().Pin)
		if err != nil {
			// Waiting for the first ACME certificate is alive: the front
			// answered, with the alert every handshake gets until then.
			if d.waitingForFirstCertificate() && answeredWithAlert(err) {
				return nil
			}
			return err
		}
		return c.Close()
	}
}

// build turns a configuration into front options and the identity to serve.
// It creates the identity (in acme mode: the key) only on first start;
// afterwards it only loads.
func (d *daemon) build(e *config.Env) (built, error) {
	ra, err := e.Authority(d.boundPort)
	if err != nil {
		return built{}, err
	}
	for _, w := range ra.Warnings {
		d.log.Warn().Str("event", "authority").Msg(w)
	}
	id, err := pinning.LoadOrCreate(e.IdentityConfig(ra.Authority))
	if err != nil {
		return built{}, err
	}
	for _, w := range id.Warnings {
		d.log.Warn().Str("event", "identity").Msg(w)
	}
	b := built{id: id, auth: ra.Authority}
	if e.Cfg.TLS.Mode == pinning.ModeACME {
		if b.id, b.acme, err = d.buildACME(e, ra.Authority, id); err != nil {
			return built{}, err
		}
	}
	opts, err := frontOptions(e.Cfg, ra.Authority, d.log)
	if err != nil {
		b.acme.abandon()
		return built{}, err
	}
	opts.Metrics = d.metrics
	if d.reach != nil {
		opts.Relay.Handoff = d.reach.Handoff()
		// Every broker stream is one "reach" source: it may hold as many
		// unauthenticated sessions as the connector serves streams.
		opts.Relay.MaxUnauthenticatedReach = d.reachCfg.MaxStreams
	}
	b.opts = opts
	return b, nil
}

// closeACME stops the running manager (graceful stop).
func (d *daemon) closeACME() {
	d.mu.Lock()
	m := d.acme
	d.mu.Unlock()
	if m != nil {
		m.Close()
	}
}

func frontOptions(cfg *config.Config, a pinning.Authority, log zerolog.Logger) (proxy.Options, error) {
	relayURL, err := config.ParseUpstream(cfg.Upstreams.Relay, cfg.Upstreams.AllowRemote)
	if err != nil {
		return proxy.Options{}, err
	}
	apiURL, err := config.ParseUpstream(cfg.Upstreams.API, cfg.Upstreams.AllowRemote)
	if err != nil {
		return proxy.Options{}, err
	}
	dashURL, err := config.ParseUpstream(cfg.Upstreams.Dashboard, cfg.Upstreams.AllowRemote)
	if err != nil {
		return proxy.Options{}, err
	}
	if cfg.Upstreams.AllowRemote {
		log.Warn().Str("event", "allow_remote").Msg("upstreams.allow_remote is on: upstreams may be private-network addresses")
	}
	var secret string
	if cfg.Relay.ProxySecretFile != "" {
		if secret, _, err = atomicfile.ReadSecret(cfg.Relay.ProxySecretFile); err != nil {
			return proxy.Options{}, fmt.Errorf("relay.proxy_secret_file: %w", err)
		}
	}
	return proxy.Options{
		AuthorityHost: a.Host,
		AuthorityPort: a.Port,
		ExtraNames:    cfg.ExtraNames,
		Upstreams:     proxy.Upstreams{Relay: relayURL, API: apiURL, Dashboard: dashURL},
		ProxySecret:   secret,
		Limits:        proxy.DefaultLimits(),
		Log:           log,
	}, nil
}

// reload re-reads the configuration and identity. Established connections
// are untouched; a change that cannot be applied live is reported and the
// rest of the old state stays in force (nothing is half-applied).
func (d *daemon) reload() {
	d.log.Info().Str("event", "reload").Msg("reloading configuration and identity")
	e, err := d.loadEnv(false)
	if err != nil {
		d.log.Error().Str("event", "reload_failed").Err(err).Msg("configuration not reloaded; the previous one stays in force")
		return
	}
	// What only a restart applies is reported; the running value stays.
	for _, k := range []struct {
		changed            bool
		key, what, keeping string
	}{
		{e.Cfg.Listen != d.listenAddr, "listen", "a new listen address", d.listenAddr},
		{e.Cfg.HTTP3 != d.http3, "http3", "turning http3 on or off", "the current setting"},
		{e.Cfg.Metrics.Listen != d.metricsAt, "metrics.listen", "a new metrics.listen", metricsAtOrNone(d.metricsAt)},
		{e.Cfg.Log.Format != d.logFormat, "log.format", "a new log.format", d.logFormat},
		{e.Cfg.AdminSocket(e.StateDir) != d.admin.Path(), "admin.socket", "a new admin.socket", d.admin.Path()},
	} {
		if k.changed {
			d.log.Warn().Str("event", "reload_partial").Str("key", k.key).
				Msg(k.what + " needs a restart; keeping " + k.keeping)
		}
	}
	if reachNeedsRestart(d.reachCfg, e.Cfg.Reach) {
		d.log.Warn().Str("event", "reload_partial").Str("key", "reach").Msg("reach settings changed; restart the daemon to apply them (the connector keeps its current settings)")
	}
	if e.StateDir != d.env.StateDir {
		d.log.Error().Str("event", "reload_failed").Msg("the state directory changed; restart the daemon to use it")
		return
	}
	// The running ACME manager keeps renewing until everything below has
	// succeeded; a failure abandons the new one instead.
	b, err := d.build(e)
	if err == nil {
		if err = b.acme.start(d.ctx); err == nil {
			err = d.front.Reload(b.opts, b.id)
		}
		if err != nil {
			b.acme.abandon()
		}
	}
	if err != nil {
		d.log.Error().Str("event", "reload_failed").Err(err).Msg("configuration not reloaded; the previous one stays in force")
		return
	}
	d.commitACME(b.acme, e.Cfg.TLS.Mode == pinning.ModeACME, e.Cfg.TLS.ACME.Needs())
	setLogLevel(e.Cfg.Log.Level)
	id, auth := b.id, b.auth
	d.mu.Lock()
	d.env, d.authority = e, auth
	d.mu.Unlock()
	d.log.Info().Str("event", "reloaded").Str("authority", auth.String()).Str("pin_sha256", id.Pin).
		Str("log_level", zerolog.GlobalLevel().String()).Msg("reloaded")
}

// setLogLevel applies log.level to every logger the daemon handed out:
// they pass every level and zerolog's global level, which each event checks
// anyway, drops what is below it. An empty or unknown level is info.
func setLogLevel(level string) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || lvl == zerolog.NoLevel {
		lvl = zerolog.InfoLevel
	}
	zerolog.SetGlobalLevel(lvl)
}

// reachNeedsRestart reports whether a reloaded reach section differs from
// the one the daemon started with in a way only a restart applies. While
// Reach stays disabled no setting of it is in use, so none is a change.
func reachNeedsRestart(running, loaded config.Reach) bool {
	if !running.Enabled && !loaded.Enabled {
		return false
	}
	return running != loaded
}

func metricsAtOrNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

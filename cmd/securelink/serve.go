package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/hermes-securelink/securelink/broker/connector"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/internal/metrics"
	"github.com/hermes-securelink/securelink/internal/sdnotify"
	"github.com/hermes-securelink/securelink/pinning"
	"github.com/hermes-securelink/securelink/proxy"
)

// shutdownGrace bounds how long in-flight requests may run after SIGTERM.
const shutdownGrace = 10 * time.Second

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "run the pinned-TLS front (default :9443; zero configuration works), plus the Reach connector when reach.enabled is true",
		Flags: []cli.Flag{configFlag},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			return runServe(c.Context, c.String("config"))
		},
	}
}

// daemon is the running front with what it needs to reload itself.
type daemon struct {
	flagConfig string
	log        zerolog.Logger
	front      *proxy.Server
	admin      *admin.Server
	started    time.Time
	listenAddr string
	boundPort  int
	metrics    *metrics.Front
	metricsAt  string
	reach      *connector.Connector
	reachCfg   config.Reach

	mu        sync.Mutex
	env       *env
	authority pinning.Authority
}

func runServe(ctx context.Context, flagConfig string) error {
	// Catch SIGHUP before anything is announced: its default action ends
	// the process, so a reload sent right after READY must not kill it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	e, err := loadEnv(flagConfig, true)
	if err != nil {
		return err
	}
	if err := e.cfg.Unsupported(); err != nil {
		return err
	}
	log := newLogger(e.cfg)
	d := &daemon{flagConfig: flagConfig, log: log, started: time.Now().UTC(), listenAddr: e.cfg.Listen}

	lc := net.ListenConfig{KeepAlive: proxy.DefaultLimits().TCPKeepAlive}
	ln, err := lc.Listen(ctx, "tcp", e.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", e.cfg.Listen, err)
	}
	defer ln.Close()
	d.boundPort = ln.Addr().(*net.TCPAddr).Port

	if e.cfg.Metrics.Listen != "" {
		d.metrics, d.metricsAt = metrics.NewFront(), e.cfg.Metrics.Listen
	}
	// Kept whether or not Reach runs: a reload compares against it.
	d.reachCfg = e.cfg.Reach
	if e.cfg.Reach.Enabled {
		if d.reach, err = newConnector(e.cfg.Reach, log); err != nil {
			return err
		}
	}
	opts, id, auth, err := d.build(e)
	if err != nil {
		return err
	}
	d.env, d.authority = e, auth
	front, err := proxy.New(opts, id)
	if err != nil {
		return err
	}
	d.front = front
	if d.metrics != nil {
		front.RegisterMetrics(d.metrics)
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

	adm, err := admin.Listen(e.cfg.AdminSocket(e.stateDir), log)
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

	serveErr := make(chan error, 2)
	go func() { serveErr <- front.Serve(ln) }()
	if d.reach != nil {
		// Broker streams are served in memory by the same front: one policy
		// path, and ConnContext marks them for the route-credential handoff.
		go func() { serveErr <- front.Serve(d.reach.Listener()) }()
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
	go notify.Watchdog(wdCtx, d.selfCheck(ln.Addr().(*net.TCPAddr)))
	log.Info().Str("event", "listening").Str("listen", ln.Addr().String()).
		Str("authority", auth.String()).Str("pin_sha256", id.Pin).
		Str("admin_socket", adm.Path()).Msg("Secure Link front is up")
	// The only line scripts and tests need to find the port and pin without
	// parsing logs: printed on stdout once the listener is up.
	fmt.Printf("listening %s authority %s pin %s\n", ln.Addr(), auth, id.Pin)

	for {
		select {
		case <-hup:
			notify.Reloading()
			d.reload()
			notify.Ready()
		case err := <-serveErr:
			return err
		case <-ctx.Done():
			notify.Stopping()
			wdStop()
			log.Info().Str("event", "stopping").Msg("draining in-flight requests")
			sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
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
			return err
		}
		return c.Close()
	}
}

// build turns a configuration into front options and the identity to serve.
// It creates the identity only on first start; afterwards it only loads.
func (d *daemon) build(e *env) (proxy.Options, *pinning.Identity, pinning.Authority, error) {
	ra, err := e.authority(d.boundPort)
	if err != nil {
		return proxy.Options{}, nil, pinning.Authority{}, err
	}
	for _, w := range ra.Warnings {
		d.log.Warn().Str("event", "authority").Msg(w)
	}
	id, err := pinning.LoadOrCreate(e.identityConfig(ra.Authority))
	if err != nil {
		return proxy.Options{}, nil, pinning.Authority{}, err
	}
	for _, w := range id.Warnings {
		d.log.Warn().Str("event", "identity").Msg(w)
	}
	opts, err := frontOptions(e.cfg, ra.Authority, d.log)
	if err != nil {
		return proxy.Options{}, nil, pinning.Authority{}, err
	}
	opts.Metrics = d.metrics
	if d.reach != nil {
		opts.Relay.Handoff = d.reach.Handoff()
		// Every broker stream is one "reach" source: it may hold as many
		// unauthenticated sessions as the connector serves streams.
		opts.Relay.MaxUnauthenticatedReach = d.reachCfg.MaxStreams
	}
	return opts, id, ra.Authority, nil
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
		if secret, err = readSecretFile(cfg.Relay.ProxySecretFile); err != nil {
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
	e, err := loadEnv(d.flagConfig, false)
	if err == nil {
		err = e.cfg.Unsupported()
	}
	if err != nil {
		d.log.Error().Str("event", "reload_failed").Err(err).Msg("configuration not reloaded; the previous one stays in force")
		return
	}
	if e.cfg.Listen != d.listenAddr {
		d.log.Warn().Str("event", "reload_partial").Str("listen", e.cfg.Listen).
			Msg("a new listen address needs a restart; keeping " + d.listenAddr)
	}
	if e.cfg.Metrics.Listen != d.metricsAt {
		d.log.Warn().Str("event", "reload_partial").Msg("a new metrics.listen needs a restart; keeping " + orNone(d.metricsAt))
	}
	if reachNeedsRestart(d.reachCfg, e.cfg.Reach) {
		d.log.Warn().Str("event", "reload_partial").Msg("reach settings changed; restart the daemon to apply them (the connector keeps its current settings)")
	}
	if e.stateDir != d.env.stateDir {
		d.log.Error().Str("event", "reload_failed").Msg("the state directory changed; restart the daemon to use it")
		return
	}
	opts, id, auth, err := d.build(e)
	if err == nil {
		err = d.front.Reload(opts, id)
	}
	if err != nil {
		d.log.Error().Str("event", "reload_failed").Err(err).Msg("configuration not reloaded; the previous one stays in force")
		return
	}
	d.mu.Lock()
	d.env, d.authority = e, auth
	d.mu.Unlock()
	d.log.Info().Str("event", "reloaded").Str("authority", auth.String()).Str("pin_sha256", id.Pin).Msg("reloaded")
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

func (d *daemon) registerAdmin() {
	d.admin.HandleJSON("GET /status", func(r *http.Request) (any, int, error) {
		return d.status(r.Context()), 0, nil
	})
	d.admin.HandleJSON("GET /identity", func(r *http.Request) (any, int, error) {
		d.mu.Lock()
		a := d.authority
		d.mu.Unlock()
		id := d.front.Identity()
		return identityJSON{
			Authority: a.String(),
			URL:       a.URL(),
			PinSHA256: id.Pin,
			CertDER:   id.CertDERBase64(),
			Candidate: pinning.PluginProxyCandidate(a, id),
		}, 0, nil
	})
}

type identityJSON struct {
	Authority string            `json:"authority"`
	URL       string            `json:"url"`
	PinSHA256 string            `json:"pin_sha256"`
	CertDER   string            `json:"cert_der"`
	Candidate pinning.Candidate `json:"candidate"`
}

type availabilityJSON struct {
	Available bool `json:"available"`
}

type statusJSON struct {
	Version           string                      `json:"version"`
	StartedAt         string                      `json:"started_at"`
	ConfigFile        string                      `json:"config_file"`
	StateDir          string                      `json:"state_dir"`
	Authority         string                      `json:"authority"`
	PinSHA256         string                      `json:"pin_sha256"`
	IdentityChangedAt string                      `json:"identity_changed_at"`
	Upstreams         map[string]availabilityJSON `json:"upstreams"`
	Reach             connector.Status            `json:"reach"`
	ActiveWebSockets  int                         `json:"active_websockets"`
	SNIRejected       uint64                      `json:"sni_rejected"`
}

func (d *daemon) status(ctx context.Context) statusJSON {
	d.mu.Lock()
	e, a := d.env, d.authority
	d.mu.Unlock()
	id := d.front.Identity()
	avail := d.front.Availability(ctx)
	return statusJSON{
		Version:           version,
		StartedAt:         d.started.Format(time.RFC3339),
		ConfigFile:        e.cfg.File,
		StateDir:          e.stateDir,
		Authority:         a.String(),
		PinSHA256:         id.Pin,
		IdentityChangedAt: id.ChangedAt.UTC().Format(time.RFC3339),
		Upstreams: map[string]availabilityJSON{
			"relay":     {avail.Relay},
			"api":       {avail.API},
			"dashboard": {avail.Dashboard},
		},
		Reach:            d.reachStatus(),
		ActiveWebSockets: d.front.Bridge().Active() + d.front.ActiveUpgrades(),
		SNIRejected:      d.front.SNIRejected(),
	}
}

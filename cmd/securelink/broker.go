package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/hermes-securelink/securelink/broker/cluster"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/internal/doctor"
	"github.com/hermes-securelink/securelink/internal/metrics"
	"github.com/hermes-securelink/securelink/internal/sdnotify"
)

var brokerConfigFlag = &cli.StringFlag{
	Name:     "config",
	Usage:    "broker configuration `FILE` (YAML; hosts_file and state_file are required)",
	Required: true,
}

func brokerCommand() *cli.Command {
	return &cli.Command{
		Name:  "broker",
		Usage: "run or administer a Reach rendezvous broker (experimental)",
		Subcommands: []*cli.Command{
			{
				Name:  "serve",
				Usage: "run a Reach broker",
				Description: "Serves wss://…/v1/connect for hosts and clients as the configuration says. " +
					"The Go garbage collector runs at GOGC=50 (less memory per idle socket for ~5% more CPU " +
					"per registration) unless the environment sets GOGC.",
				Flags: []cli.Flag{brokerConfigFlag},
				Action: func(c *cli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					return runBroker(c.Context, c.String("config"))
				},
			},
			{
				Name:  "doctor",
				Usage: "check the broker's configuration and the running broker's file descriptors (use vs its soft limit, and whether the limit covers max_hosts and the stream limits); non-zero exit on a problem",
				Flags: []cli.Flag{brokerConfigFlag},
				Action: func(c *cli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					cfg, err := server.LoadConfig(c.String("config"))
					rs := doctor.RunBroker(cfg, err, c.String("config"))
					fmt.Print(doctor.Format(rs))
					if doctor.Failed(rs) {
						return errors.New("doctor found problems (see the fix under each FAIL)")
					}
					return nil
				},
			},
			{
				Name:  "add-host",
				Usage: "create a host_id and host token; both are printed once, only the token's digest is stored",
				Flags: []cli.Flag{brokerConfigFlag, &cli.BoolFlag{Name: "json", Usage: "print {host_id, host_token} as JSON"}},
				Action: func(c *cli.Context) error {
					if err := noArgs(c); err != nil {
						return err
					}
					cfg, err := server.LoadConfig(c.String("config"))
					if err != nil {
						return err
					}
					fmt.Fprintf(os.Stderr, "securelink: broker config %s, hosts file %s\n", c.String("config"), cfg.HostsFile)
					id, tok, err := store.AddHost(cfg.HostsFile)
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return printJSON(map[string]string{"host_id": id, "host_token": string(tok)})
					}
					fmt.Printf("host_id     %s\nhost_token  %s\n\nGive both to the host operator: reach.host_id in the host's config, and the token in the file named by reach.host_token_file (mode 0600). The token is not shown again; only its digest is stored. Reload the broker (SIGHUP) to accept the host.\n", id, string(tok))
					return nil
				},
			},
			{
				Name:      "remove-host",
				Usage:     "remove a host; an online registration is closed with 'revoked' on the broker's next reload",
				ArgsUsage: "--host-id HOST_ID | -- HOST_ID",
				Flags:     []cli.Flag{brokerConfigFlag, &cli.StringFlag{Name: "host-id", Usage: "the `HOST_ID` to remove (ids may start with '-': use this flag or put the id after --)"}},
				Action: func(c *cli.Context) error {
					hostID, err := oneID(c, "host-id", "HOST_ID")
					if err != nil {
						return err
					}
					cfg, err := server.LoadConfig(c.String("config"))
					if err != nil {
						return err
					}
					fmt.Fprintf(os.Stderr, "securelink: broker config %s, hosts file %s\n", c.String("config"), cfg.HostsFile)
					if err := store.RemoveHost(cfg.HostsFile, hostID); err != nil {
						return err
					}
					fmt.Println("removed; reload the broker (SIGHUP) to close its registration")
					return nil
				},
			},
		},
	}
}

func runBroker(ctx context.Context, path string) error {
	cfg, err := server.LoadConfig(path)
	if err != nil {
		return err
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(server.GCPercent)
	}
	fmt.Fprintf(os.Stderr, "securelink: broker config %s, hosts file %s, state file %s\n", path, cfg.HostsFile, cfg.StateFile)
	log := buildLogger(cfg.LogLevel, cfg.LogFormat)
	var node *cluster.Node
	if cfg.Cluster.Enabled {
		if node, err = cluster.Start(ctx, cfg.Cluster); err != nil {
			return err
		}
		defer node.Close()
		node.Apply(cfg)
		fmt.Fprintf(os.Stderr, "securelink: cluster instance %s, peer listener %s\n", cfg.Cluster.InstanceID, cfg.Cluster.Peer.Listen)
		if !node.State.AtomicWrites() {
			log.Warn().Msg("cluster: the engine takes no atomic batches (nats-server before 2.12, or its stream setting could not be changed): a change of several state entries, such as a route replacement, is written entry by entry")
		}
	}
	b, err := server.New(*cfg, log)
	if err != nil {
		return err
	}
	if _, limit, err := metrics.FDUsage(); err == nil && limit < metrics.BrokerFDsNeeded(cfg.MaxHosts, cfg.MaxStreamsPerHost) {
		log.Warn().Int("fd_limit", limit).Int("max_hosts", cfg.MaxHosts).Int("max_streams_per_host", cfg.MaxStreamsPerHost).
			Msg("the open-file limit is below what max_hosts needs (a socket per host and per stream); raise LimitNOFILE")
	}
	fdCtx, fdStop := context.WithCancel(ctx)
	defer fdStop()
	go metrics.WatchFDs(fdCtx, log, 10*time.Second)
	if cfg.MetricsListen != "" {
		m := metrics.NewFront()
		m.RegisterFDUsage("broker")
		b.RegisterCertificateMetrics(m)
		m.Register(metrics.BrokerCollector(func() metrics.BrokerStats {
			st := b.Stats()
			return metrics.BrokerStats{HostsOnline: st.HostsOnline, ActiveStreams: st.ActiveStreams, QueuedBytes: st.QueuedBytes, Counts: st.Counts}
		}))
		ml, err := metrics.Listen(cfg.MetricsListen, m.Registry())
		if err != nil {
			b.Close()
			return fmt.Errorf("metrics.listen: %w", err)
		}
		go ml.Serve()
		defer ml.Shutdown(context.Background())
	}
	notify := sdnotify.New(log)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				notify.Reloading()
				if err := b.ReloadHosts(); err != nil {
					log.Error().Err(err).Str("event", "reload_failed").Msg("hosts file not reloaded; the previous one stays in force")
				} else {
					log.Info().Str("event", "reloaded").Msg("hosts file reloaded")
				}
				notify.Ready()
			}
		}
	}()
	// Bind and check the certificate here, so READY means "answering".
	switch {
	case cfg.ACME.On():
		for _, e := range cfg.ACME.CheckFiles() {
			b.Close()
			return fmt.Errorf("broker tls.acme.%s: %w", e.Key, e.Err)
		}
	case !cfg.InsecurePlaintext:
		if _, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
			b.Close()
			return fmt.Errorf("broker tls: %w", err)
		}
	}
	ln, err := server.Listen(ctx, cfg.Listen)
	if err != nil {
		b.Close()
		return fmt.Errorf("broker listen %s: %w", cfg.Listen, err)
	}
	errc := make(chan error, 1)
	go func() { errc <- b.ServeListener(ctx, ln) }()
	if node != nil {
		go node.Serve(ctx, b)
	}
	notify.Ready()
	fmt.Printf("broker listening %s\n", ln.Addr())
	err = <-errc
	notify.Stopping()
	return err
}

// oneID takes an identifier from --flag or as the single positional
// argument. Reach ids are base64url and may start with '-', which a flag
// parser would take for a flag, so both forms exist ("-- ID" also works).
func oneID(c *cli.Context, flag, what string) (string, error) {
	id := c.String(flag)
	switch {
	case id != "" && c.NArg() == 0:
		return id, nil
	case id == "" && c.NArg() == 1:
		return c.Args().First(), nil
	default:
		return "", fmt.Errorf("give exactly one %s, as --%s %s or after -- (flags go before it)", what, flag, what)
	}
}

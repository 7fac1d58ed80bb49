package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/hermes-securelink/securelink/broker/client"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/internal/loopback"
	"github.com/hermes-securelink/securelink/internal/trust"
)

func connectCommand() *cli.Command {
	return &cli.Command{
		Name:  "connect",
		Usage: "client side of Reach: each local TCP connection becomes one broker stream carrying raw bytes (the local client does TLS with the pin)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "candidate", Required: true, Usage: "`FILE` holding an outbound_broker candidate (JSON); a bootstrap credential serves exactly one connection"},
			&cli.StringFlag{Name: "listen", Required: true, Usage: "loopback `ADDR` to accept local connections on, e.g. 127.0.0.1:9555"},
			&cli.StringFlag{Name: "ca-file", Usage: "extra CA `FILE` for the broker's TLS (private brokers, tests)"},
			&cli.IntFlag{Name: "max-conns", Value: 4, Usage: "concurrent local connections `N` (a broker allows 4 streams per route credential by default)"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "`LEVEL`: debug | info | warn | error"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			switch c.String("log-level") {
			case "debug", "info", "warn", "error":
			default:
				return fmt.Errorf("--log-level %q is not one of debug, info, warn, error", c.String("log-level"))
			}
			// A candidate is at most 32 KiB (ParseCandidate's bound too).
			data, fi, err := atomicfile.ReadPrivate(c.String("candidate"), 32<<10, 0)
			if err != nil {
				return fmt.Errorf("--candidate: %w", err)
			}
			if p := fi.Mode().Perm(); p&0o077 != 0 {
				// Not refused: it is the user's own download; said, as the
				// credential in it lasts up to 90 days.
				fmt.Fprintf(os.Stderr, "warning: --candidate %s has mode %04o: other users can read the broker credential it holds; chmod 600 %s\n",
					c.String("candidate"), p, c.String("candidate"))
			}
			cand, err := client.ParseCandidate(data)
			if err != nil {
				return fmt.Errorf("--candidate: %w", err)
			}
			if err := loopback.CheckListen(c.String("listen")); err != nil {
				return fmt.Errorf("--listen: %w: raw broker streams must not be offered to the network", err)
			}
			pool, err := trust.BrokerRoots(c.String("ca-file"))
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return err
			}
			log := buildLogger(c.String("log-level"), "auto")
			host, port := cand.Authority()
			fmt.Printf("forwarding %s to %s via %s\nexample: curl -k --pinnedpubkey '%s' --connect-to %s:%d:%s https://%s/relay/health\n",
				ln.Addr(), net.JoinHostPort(host, fmt.Sprint(port)), cand.Broker.URL, cand.CurlPin(),
				hostForConnectTo(host), port, ln.Addr(), net.JoinHostPort(host, fmt.Sprint(port)))
			return client.Forward(c.Context, ln, client.ForwardOptions{
				Candidate: cand, MaxConns: c.Int("max-conns"), Log: log, RootCAs: pool,
			})
		},
	}
}

// hostForConnectTo brackets IPv6 hosts as curl's --connect-to expects.
func hostForConnectTo(h string) string {
	if a, err := netip.ParseAddr(h); err == nil && a.Is6() {
		return "[" + h + "]"
	}
	return h
}

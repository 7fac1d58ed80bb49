package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/hermes-securelink/securelink/internal/daemon"
)

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "run the pinned-TLS front (default :9443; zero configuration works), plus the Reach connector when reach.enabled is true",
		Flags: []cli.Flag{configFlag},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			// Catch SIGHUP before anything is announced: its default action
			// ends the process, so a reload sent right after READY must not
			// kill it.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			return daemon.Run(c.Context, daemon.Options{
				ConfigFlag: c.String("config"),
				Version:    version,
				NewLogger:  newLogger,
				Reload:     hup,
				Ready: func(r daemon.Ready) {
					// The only line scripts and tests need to find the port
					// and pin without parsing logs.
					fmt.Printf("listening %s authority %s pin %s\n", r.Addr, r.Authority, r.Pin)
				},
			})
		},
	}
}

func revokeCommand() *cli.Command {
	return &cli.Command{
		Name:      "revoke",
		Usage:     "revoke a Reach route credential at the broker (through the running daemon)",
		ArgsUsage: "--credential-id ID | -- CREDENTIAL_ID",
		Flags:     []cli.Flag{configFlag, &cli.StringFlag{Name: "credential-id", Usage: "the route credential `ID` (ids may start with '-': use this flag or put the id after --)"}},
		Action: func(c *cli.Context) error {
			credID, err := oneID(c, "credential-id", "CREDENTIAL_ID")
			if err != nil {
				return err
			}
			e, err := loadEnv(c.String("config"), false)
			if err != nil {
				return err
			}
			if _, err := adminClient(e).Revoke(c.Context, credID); err != nil {
				return err
			}
			fmt.Println("revoked", credID)
			return nil
		},
	}
}

// Command securelink is the Hermes Secure Link binary: the pinned-TLS front
// (`serve`), its identity (`pin`), and the operator commands around them.
// This package only wires flags to the library packages.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newApp().RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "securelink:", err)
		os.Exit(1)
	}
}

var configFlag = &cli.StringFlag{
	Name:    "config",
	Usage:   "configuration `FILE` (else $SECURELINK_CONFIG, else /etc/securelink/config.yaml when present, else built-in defaults)",
	EnvVars: []string{"SECURELINK_CONFIG"},
}

func newApp() *cli.App {
	return &cli.App{
		Name:                 "securelink",
		Usage:                "pinned-TLS front for a self-hosted Hermes host",
		Version:              version,
		HideHelpCommand:      true,
		EnableBashCompletion: false,
		// Errors are printed once by main, as one line.
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{
			serveCommand(),
			pinCommand(),
			statusCommand(),
			doctorCommand(),
			pairCommand(),
			brokerCommand(),
			connectCommand(),
			revokeCommand(),
			{
				Name:  "version",
				Usage: "print the version",
				Action: func(c *cli.Context) error {
					fmt.Println("securelink", version)
					return nil
				},
			},
		},
	}
}

// noArgs refuses stray positional arguments: urfave/cli v2 silently ignores
// flags written after them, which would run a command with settings the
// operator did not ask for.
func noArgs(c *cli.Context) error {
	if c.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags go before arguments; see --help)", c.Args().First())
	}
	return nil
}

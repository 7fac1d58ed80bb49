package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/hermes-securelink/securelink/config"
	"github.com/hermes-securelink/securelink/doctor"
)

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check configuration, identity, permissions, upstreams, the daemon and the clock; one line per check with its fix",
		Flags: []cli.Flag{configFlag},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			path := config.ResolvePath(c.String("config"))
			cfg, cfgErr := config.Load(path)
			stateDir := ""
			if cfgErr == nil {
				var err error
				if stateDir, err = cfg.ResolveStateDir(); err != nil {
					cfgErr = err
				}
			}
			shown := path
			if shown == "" {
				shown = "(built-in defaults)"
			}
			fmt.Fprintf(os.Stderr, "securelink: config %s, state directory %s\n", shown, stateDir)
			rs := doctor.Run(c.Context, cfg, cfgErr, stateDir, doctor.Options{})
			fmt.Print(doctor.Format(rs))
			if doctor.Failed(rs) {
				return errors.New("doctor found problems (see the fix under each FAIL)")
			}
			return nil
		},
	}
}

package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/internal/doctor"
)

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check configuration, identity, permissions, upstreams, the daemon, the clock and (with Reach) the broker without registering; one line per check with its fix, non-zero exit on a problem",
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
			config.Announce(os.Stderr, path, stateDir)
			rs := doctor.Run(c.Context, cfg, cfgErr, stateDir, doctor.Options{})
			fmt.Print(doctor.Format(rs))
			if doctor.Failed(rs) {
				return errors.New("doctor found problems (see the fix under each FAIL)")
			}
			return nil
		},
	}
}

package main

import (
	"encoding/json"
	"io"
	"os"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
)

// loadEnv resolves the configuration and state directory a command acts on
// and announces both on stderr.
func loadEnv(flag string, createState bool) (*config.Env, error) {
	e, err := config.LoadEnv(flag, createState)
	if err != nil {
		return nil, err
	}
	e.Announce(os.Stderr)
	return e, nil
}

// adminClient talks to the running daemon of e.
func adminClient(e *config.Env) *admin.Client {
	return admin.NewClient(e.Cfg.AdminSocket(e.StateDir))
}

// printJSON is every command's --json output: one object on one line, so
// repeated runs append as JSON lines (bench/reach.sh collects add-host
// output that way), with <, > and & left as they are so URLs read as
// printed.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func newLogger(cfg *config.Config) zerolog.Logger {
	return buildLogger(cfg.Log.Level, cfg.Log.Format)
}

// buildLogger writes to stderr: console on a TTY (or when asked), else JSON
// lines without timestamps under journald, which stamps every line itself.
func buildLogger(level, format string) zerolog.Logger {
	var w io.Writer = os.Stderr
	if format == "auto" {
		format = "json"
		if isatty.IsTerminal(os.Stderr.Fd()) {
			format = "console"
		}
	}
	if format == "console" {
		w = zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.RFC3339}
	}
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	ctx := zerolog.New(w).Level(lvl).With()
	// journald stamps every line itself.
	if os.Getenv("JOURNAL_STREAM") == "" {
		ctx = ctx.Timestamp()
	}
	return ctx.Logger()
}

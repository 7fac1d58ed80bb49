package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/pinning"
)

// env is what every command resolves first: which configuration file, which
// state directory. Both are printed so an operator never acts on an identity
// the daemon does not serve.
type env struct {
	cfg      *config.Config
	stateDir string
}

func loadEnv(flag string, createState bool) (*env, error) {
	path := config.ResolvePath(flag)
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	sd, err := cfg.ResolveStateDir()
	if err != nil {
		return nil, err
	}
	announce(path, sd)
	if createState {
		if err := atomicfile.MkdirPrivate(sd); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	return &env{cfg: cfg, stateDir: sd}, nil
}

// announce prints, on stderr, the configuration file and state directory a
// command acts on.
func announce(configPath, stateDir string) {
	if configPath == "" {
		configPath = "(built-in defaults)"
	}
	fmt.Fprintf(os.Stderr, "securelink: config %s, state directory %s\n", configPath, stateDir)
}

// authority resolves the advertised authority. listenPort is the bound port
// (it may differ from the configured one when the configuration says :0).
func (e *env) authority(listenPort int) (pinning.ResolvedAuthority, error) {
	port := e.cfg.AdvertisePort
	if port == 0 {
		port = listenPort
	}
	return pinning.ResolveAuthority(pinning.ResolveOptions{
		StateDir:  e.stateDir,
		Advertise: e.cfg.Advertise,
		Port:      port,
	})
}

func (e *env) identityConfig(a pinning.Authority) pinning.IdentityConfig {
	return pinning.IdentityConfig{
		StateDir:   e.stateDir,
		Mode:       e.cfg.TLS.Mode,
		KeyType:    e.cfg.TLS.KeyType,
		CertFile:   e.cfg.TLS.CertFile,
		KeyFile:    e.cfg.TLS.KeyFile,
		Authority:  a,
		ExtraNames: e.cfg.ExtraNames,
	}
}

// readSecretFile reads a small secret file, refusing one other users can
// access.
func readSecretFile(path string) (string, error) {
	b, _, err := atomicfile.ReadPrivate(path, 4096, 0o007)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
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

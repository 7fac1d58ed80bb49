package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/config"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
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
	shown := path
	if shown == "" {
		shown = "(built-in defaults)"
	}
	fmt.Fprintf(os.Stderr, "securelink: config %s, state directory %s\n", shown, sd)
	if createState {
		if err := atomicfile.MkdirPrivate(sd); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	return &env{cfg: cfg, stateDir: sd}, nil
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

// readSecretFile reads a small secret file, refusing one readable by others.
func readSecretFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if fi.Mode().Perm()&0o007 != 0 {
		return "", fmt.Errorf("%s is accessible by other users (mode %04o); chmod 600 it", path, fi.Mode().Perm())
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4097))
	if err != nil {
		return "", err
	}
	if len(b) > 4096 {
		return "", fmt.Errorf("%s is larger than 4096 bytes; it should hold one secret", path)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
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

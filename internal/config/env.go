package config

import (
	"crypto"
	"fmt"
	"io"
	"path/filepath"

	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/pinning"
)

// Env is what every command resolves first: which configuration file, which
// state directory. Both are announced so an operator never acts on an
// identity the daemon does not serve.
type Env struct {
	Cfg      *Config
	StateDir string
	path     string // the resolved configuration file, empty for defaults
}

// LoadEnv resolves the configuration (flag, else $SECURELINK_CONFIG, else
// the system file, else defaults) and its state directory, creating that
// directory (0700) when createState is set.
func LoadEnv(flag string, createState bool) (*Env, error) {
	path := ResolvePath(flag)
	cfg, err := Load(path)
	if err != nil {
		return nil, err
	}
	sd, err := cfg.ResolveStateDir()
	if err != nil {
		return nil, err
	}
	if createState {
		if err := atomicfile.MkdirPrivate(sd); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	return &Env{Cfg: cfg, StateDir: sd, path: path}, nil
}

// Announce writes the configuration file and state directory acted on.
func (e *Env) Announce(w io.Writer) { Announce(w, e.path, e.StateDir) }

// Announce writes the line every command starts with on stderr: the
// configuration file ("" = built-in defaults) and state directory.
func Announce(w io.Writer, configPath, stateDir string) {
	if configPath == "" {
		configPath = "(built-in defaults)"
	}
	fmt.Fprintf(w, "securelink: config %s, state directory %s\n", configPath, stateDir)
}

// Authority resolves the advertised authority. listenPort is the bound port
// (it may differ from the configured one when the configuration says :0).
func (e *Env) Authority(listenPort int) (pinning.ResolvedAuthority, error) {
	port := e.Cfg.AdvertisePort
	if port == 0 {
		port = listenPort
	}
	return pinning.ResolveAuthority(pinning.ResolveOptions{
		StateDir:  e.StateDir,
		Advertise: e.Cfg.Advertise,
		Port:      port,
	})
}

// IdentityConfig is the identity the configuration asks for at a.
func (e *Env) IdentityConfig(a pinning.Authority) pinning.IdentityConfig {
	return pinning.IdentityConfig{
		StateDir:   e.StateDir,
		Mode:       e.Cfg.TLS.Mode,
		KeyType:    e.Cfg.TLS.KeyType,
		CertFile:   e.Cfg.TLS.CertFile,
		KeyFile:    e.Cfg.TLS.KeyFile,
		Authority:  a,
		ExtraNames: e.Cfg.ExtraNames,
	}
}

// ACMEDir is the ACME storage under the state directory.
func ACMEDir(stateDir string) string { return filepath.Join(stateDir, "acme") }

// ACMEOptions is the certificate manager configuration of tls.mode acme:
// the tls.acme block, the authority and extra names, the identity key and
// the storage under the state directory. The daemon runs a manager with it;
// pin and doctor read the storage with it (acme.Stored).
func (e *Env) ACMEOptions(a pinning.Authority, key crypto.Signer) acme.Options {
	o := e.Cfg.TLS.ACME.Options()
	o.Names = append([]string{a.Host}, e.Cfg.ExtraNames...)
	o.Key = key
	o.StorageDir = ACMEDir(e.StateDir)
	return o
}

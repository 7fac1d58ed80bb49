package acme

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/pinning"
)

// errKeyMismatch: a certificate's key is not the identity key.
var errKeyMismatch = errors.New("certificate is for a key other than the identity key")

// ErrNoCertificate is returned by GetCertificate until a certificate for the
// identity key exists for the name: the handshake fails with an alert. It is
// never answered with a self-signed certificate, which would change the pin.
var ErrNoCertificate = errors.New("acme: no certificate yet")

// Manager obtains and renews the certificates and serves them.
type Manager struct {
	c      checked
	log    zerolog.Logger
	cache  *certmagic.Cache
	cfg    *certmagic.Config
	issuer *certmagic.ACMEIssuer

	mu        sync.Mutex
	certs     map[string]*tls.Certificate // name -> served certificate
	state     map[string]*CertStatus
	keyChange *KeyChange
	installed uint64
	renewFail uint64

	startOnce sync.Once
	ctx       context.Context
	cancel    context.CancelFunc
	closeOnce sync.Once
}

// fixedKey is certmagic's KeySource: every certificate, first or renewed, is
// requested for the identity key (certmagic's default is a new key per
// certificate, which would change the pin at each renewal).
type fixedKey struct{ key crypto.Signer }

func (f fixedKey) GenerateKey() (crypto.PrivateKey, error) { return f.key, nil }

// New checks opts, prepares the storage directory (0700) and builds the
// certmagic configuration. Nothing talks to the CA before Start.
func New(opts Options) (*Manager, error) {
	c, err := opts.check()
	if err != nil {
		return nil, err
	}
	if err := atomicfile.MkdirPrivate(c.StorageDir); err != nil {
		return nil, fmt.Errorf("acme storage: %w", err)
	}
	m := &Manager{
		c:     c,
		log:   c.Logger.With().Str("component", "acme").Logger(),
		certs: map[string]*tls.Certificate{},
		state: map[string]*CertStatus{},
	}
	for _, n := range c.Names {
		m.state[n] = &CertStatus{Name: n, State: StateWaiting}
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())

	zl := newZapLogger(c.Logger, m.observeLog)
	setLegoLogger(c.Logger)
	m.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert:   func(certmagic.Certificate) (*certmagic.Config, error) { return m.cfg, nil },
		RenewCheckInterval: c.RenewCheckInterval,
		Logger:             zl,
	})
	m.cfg = certmagic.New(m.cache, certmagic.Config{
		RenewalWindowRatio: c.RenewalWindowRatio,
		DisableARI:         c.RenewalWindowRatio != 0,
		OnEvent:            m.onEvent,
		DefaultServerName:  c.Names[0],
		KeySource:          fixedKey{c.key},
		Storage:            &certmagic.FileStorage{Path: c.StorageDir},
		Logger:             zl,
	})
	tmpl := certmagic.ACMEIssuer{
		CA:                        c.CA,
		TestCA:                    c.CA, // retries stay on the configured CA
		Email:                     c.Email,
		Agreed:                    true, // choosing tls.mode acme with this CA is the agreement; never prompt
		DisableDistributedSolvers: true,
		ListenHost:                c.ListenHost,
		AltHTTPPort:               c.HTTPPort,
		AltTLSALPNPort:            c.TLSALPNPort,
		Logger:                    zl,
	}
	switch c.Challenge {
	case ChallengeHTTP01:
		tmpl.DisableTLSALPNChallenge = true
	case ChallengeTLSALPN01:
		tmpl.DisableHTTPChallenge = true
	case ChallengeDNS01:
		creds, err := ReadCredentials(c.DNSCredentialsFile)
		if err != nil {
			return nil, err
		}
		p, err := newDNSProvider(c.DNSProvider, creds)
		if err != nil {
			return nil, err
		}
		setLegoResolvers(c.DNSResolvers)
		tmpl.DisableHTTPChallenge = true
		tmpl.DisableTLSALPNChallenge = true
		tmpl.DNS01Solver = newDNSSolver(p, c.DNSResolvers, c.DNSPropagationTimeout)
	}
	if c.CARootFile != "" {
		pool, err := readRoots(c.CARootFile)
		if err != nil {
			return nil, err
		}
		tmpl.TrustedRoots = pool
	}
	m.issuer = certmagic.NewACMEIssuer(m.cfg, tmpl)
	m.cfg.Issuers = []certmagic.Issuer{m.issuer}
	return m, nil
}

// Pin is the identity key's pin, which every served leaf has.
func (m *Manager) Pin() string { return m.c.pin }

// Names are the managed names, the authority first.
func (m *Manager) Names() []string { return append([]string(nil), m.c.Names...) }

// Start loads the stored certificates that are for the identity key, reports
// and discards those that are not (a rotation), and starts managed issuance
// and renewal in the background. It returns without waiting for the CA;
// cancelling ctx or calling Close stops everything.
func (m *Manager) Start(ctx context.Context) error {
	err := errors.New("acme: already started")
	m.startOnce.Do(func() {
		context.AfterFunc(ctx, m.cancel)
		if err = m.loadStored(m.ctx); err != nil {
			return
		}
		err = m.cfg.ManageAsync(m.ctx, m.c.Names)
	})
	return err
}

// loadStored installs each name's stored certificate when it is for the
// identity key. One for another key means the identity key changed: that is
// reported as a rotation and the certificate is deleted, so certmagic
// obtains a new one for the identity key instead of serving or renewing the
// old key.
func (m *Manager) loadStored(ctx context.Context) error {
	ik := m.issuer.IssuerKey()
	var rotated []string
	oldPin := ""
	for _, name := range m.c.Names {
		data, err := m.cfg.Storage.Load(ctx, certmagic.StorageKeys.SiteCert(ik, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("acme storage: %w", err)
		}
		chain, leaf, err := parseChain(data)
		if err != nil {
			m.log.Warn().Str("name", name).Err(err).Msg("stored certificate unreadable; obtaining a new one")
			continue
		}
		if !bytes.Equal(leaf.RawSubjectPublicKeyInfo, m.c.spki) {
			oldPin = pinning.SPKIPin(leaf)
			rotated = append(rotated, name)
			if err := m.cfg.Storage.Delete(ctx, certmagic.StorageKeys.CertsSitePrefix(ik, name)); err != nil {
				return fmt.Errorf("acme storage: removing the certificate for the old key: %w", err)
			}
			continue
		}
		m.install(name, chain, leaf, false)
	}
	if len(rotated) > 0 {
		kc := &KeyChange{OldPin: oldPin, NewPin: m.c.pin, At: time.Now(), Names: rotated}
		m.mu.Lock()
		m.keyChange = kc
		m.mu.Unlock()
		m.log.Warn().Str("old_pin", kc.OldPin).Str("new_pin", kc.NewPin).Strs("names", rotated).
			Msg("identity key changed: this is a rotation, every paired client must re-pair; obtaining certificates for the new key")
		m.emit(EventKeyChanged, rotated[0])
	}
	return nil
}

// GetCertificate is for tls.Config.GetCertificate. It serves the name's
// current certificate (leaf + intermediates) for the identity key; an empty
// SNI gets the authority's. Until one exists it returns ErrNoCertificate and
// the handshake fails with an alert.
func (m *Manager) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := m.c.Names[0]
	if hello != nil && hello.ServerName != "" {
		name = strings.ToLower(strings.TrimSuffix(hello.ServerName, "."))
	}
	m.mu.Lock()
	cert := m.certs[name]
	m.mu.Unlock()
	if cert == nil {
		return nil, ErrNoCertificate
	}
	return cert, nil
}

// Status is a snapshot of every name's state.
func (m *Manager) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := Status{Pin: m.c.pin, Installed: m.installed, RenewalFailures: m.renewFail}
	for _, n := range m.c.Names {
		cs := *m.state[n]
		cs.Chain = append([][]byte(nil), cs.Chain...)
		st.Certificates = append(st.Certificates, cs)
	}
	st.CertStatus = st.Certificates[0]
	if st.State == StateValid {
		for _, cs := range st.Certificates {
			if cs.State == StateRenewalFailed {
				st.State = StateRenewalFailed
			}
		}
	}
	if m.keyChange != nil {
		kc := *m.keyChange
		st.KeyChange = &kc
	}
	return st
}

// Close stops issuance, renewal and the solvers. Idempotent.
func (m *Manager) Close() error {
	m.closeOnce.Do(func() {
		m.cancel()
		m.cache.Stop()
	})
	return nil
}

// onEvent receives certmagic's events (config.go emit calls).
func (m *Manager) onEvent(ctx context.Context, event string, data map[string]any) error {
	name, _ := data["identifier"].(string)
	switch event {
	case "cert_obtained":
		renewal, _ := data["renewal"].(bool)
		m.obtained(ctx, name, renewal, data)
	case "cert_failed":
		renewal, _ := data["renewal"].(bool)
		err, _ := data["error"].(error)
		if err == nil {
			err = errors.New("unknown error")
		}
		m.failed(name, renewal, err)
	}
	return nil
}

// obtained checks a fresh certificate against the identity key, then serves
// it.
func (m *Manager) obtained(ctx context.Context, name string, renewal bool, data map[string]any) {
	if csrPEM, ok := data["csr_pem"].([]byte); ok {
		if b, _ := pem.Decode(csrPEM); b != nil {
			if csr, err := x509.ParseCertificateRequest(b.Bytes); err == nil &&
				!bytes.Equal(csr.RawSubjectPublicKeyInfo, m.c.spki) {
				m.failed(name, renewal, fmt.Errorf("%w (certmagic requested it)", errKeyMismatch))
				return
			}
		}
	}
	path, _ := data["certificate_path"].(string)
	pemData, err := m.cfg.Storage.Load(ctx, path)
	if err != nil {
		m.failed(name, renewal, fmt.Errorf("loading the new certificate: %w", err))
		return
	}
	chain, leaf, err := parseChain(pemData)
	if err != nil {
		m.failed(name, renewal, fmt.Errorf("the new certificate: %w", err))
		return
	}
	if !bytes.Equal(leaf.RawSubjectPublicKeyInfo, m.c.spki) {
		m.failed(name, renewal, errKeyMismatch)
		return
	}
	m.install(name, chain, leaf, true)
}

// install serves chain for name and records it.
func (m *Manager) install(name string, chain [][]byte, leaf *x509.Certificate, fresh bool) {
	m.mu.Lock()
	cs := m.state[name]
	if cs == nil {
		m.mu.Unlock()
		return
	}
	m.certs[name] = &tls.Certificate{Certificate: chain, PrivateKey: m.c.key, Leaf: leaf}
	*cs = CertStatus{
		Name:        name,
		State:       StateValid,
		Issuer:      issuerName(leaf),
		Serial:      hex.EncodeToString(leaf.SerialNumber.Bytes()),
		NotBefore:   leaf.NotBefore,
		NotAfter:    leaf.NotAfter,
		NextRenewal: m.renewalStart(leaf),
		CertDER:     leaf.Raw,
		Chain:       chain,
	}
	if fresh {
		m.installed++
	}
	m.mu.Unlock()
	ev := m.log.Info().Str("name", name).Str("pin", m.c.pin).Str("issuer", cs.Issuer).
		Str("serial", cs.Serial).Time("not_after", leaf.NotAfter)
	if fresh {
		ev.Msg("certificate installed")
		m.emit(EventInstalled, name)
	} else {
		ev.Msg("stored certificate loaded")
	}
}

// failed records a failed obtain or renewal.
func (m *Manager) failed(name string, renewal bool, err error) {
	now := time.Now()
	m.mu.Lock()
	cs := m.state[name]
	if cs == nil {
		m.mu.Unlock()
		return
	}
	cs.LastError = err.Error()
	cs.Problem = classify(err, m.c.Challenge)
	cs.LastErrorAt = now
	cs.Failures++
	cs.NextAttempt = time.Time{}
	if renewal && m.certs[name] != nil {
		m.renewFail++
		cs.State = StateRenewalFailed
		cs.NextAttempt = now.Add(renewalDelay(cs.Failures))
	}
	problem, next := cs.Problem, cs.NextAttempt
	m.mu.Unlock()
	ev := m.log.Error().Str("name", name).Bool("renewal", renewal).Str("problem", string(problem)).Err(err)
	if !next.IsZero() {
		ev = ev.Time("next_attempt", next)
	}
	ev.Msg("certificate not obtained")
	m.emit(EventFailed, name)
}

// observeLog picks the retry delay out of certmagic's "will retry" record
// (async.go doWithRetry), the only place the first-certificate schedule is
// visible. Its error reads "[name] Obtain: ...".
func (m *Manager) observeLog(msg string, fields map[string]any) {
	if msg != "will retry" {
		return
	}
	d, ok := durationField(fields, "retrying_in")
	if !ok {
		return
	}
	errText, _ := fields["error"].(string)
	next := time.Now().Add(d)
	var waiting []string
	m.mu.Lock()
	for name, cs := range m.state {
		if strings.HasPrefix(errText, "["+name+"]") && cs.State == StateWaiting {
			cs.NextAttempt = next
			waiting = append(waiting, name)
		}
	}
	m.mu.Unlock()
	if len(waiting) > 0 {
		m.log.Warn().Strs("names", waiting).Time("next_attempt", next).
			Msg("still no certificate: every handshake fails with an alert until the next attempt succeeds")
	}
}

func (m *Manager) emit(kind EventKind, name string) {
	if m.c.OnEvent == nil {
		return
	}
	m.c.OnEvent(Event{Kind: kind, Name: name, Status: m.Status()})
}

// renewalStart is when certmagic's ratio puts the start of renewal.
func (m *Manager) renewalStart(leaf *x509.Certificate) time.Time {
	return renewalStart(leaf, m.c.RenewalWindowRatio)
}

func renewalStart(leaf *x509.Certificate, ratio float64) time.Time {
	if ratio == 0 {
		ratio = certmagic.DefaultRenewalWindowRatio
	}
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotAfter.Add(-time.Duration(float64(life) * ratio))
}

func issuerName(leaf *x509.Certificate) string {
	if leaf.Issuer.CommonName != "" {
		return leaf.Issuer.CommonName
	}
	return leaf.Issuer.String()
}

// parseChain decodes a PEM bundle of certificates (leaf first).
func parseChain(data []byte) ([][]byte, *x509.Certificate, error) {
	var chain [][]byte
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			chain = append(chain, b.Bytes)
		}
	}
	if len(chain) == 0 {
		return nil, nil, errors.New("no certificate in the PEM bundle")
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, nil, err
	}
	return chain, leaf, nil
}

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/internal/pairing"
	"github.com/hermes-securelink/securelink/pinning"
)

func pinCommand() *cli.Command {
	return &cli.Command{
		Name:  "pin",
		Usage: "show the identity's pin and pairing candidate (creating the identity when none exists), rotate it, or inspect a remote endpoint",
		Flags: []cli.Flag{
			configFlag,
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
			&cli.BoolFlag{Name: "rotate", Usage: "replace the identity (every paired client must re-pair); needs --yes"},
			&cli.BoolFlag{Name: "yes", Usage: "confirm --rotate"},
			&cli.StringFlag{Name: "remote", Usage: "connect to `URL` (https://HOST:PORT) without trusting anything and show what it presents"},
			&cli.StringFlag{Name: "expect", Usage: "with --remote: exit non-zero unless the endpoint presents `PIN`"},
		},
		Action: func(c *cli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			if c.String("remote") != "" {
				return pinRemote(c.Context, c.String("remote"), c.String("expect"), c.Bool("json"))
			}
			if c.String("expect") != "" {
				return fmt.Errorf("--expect goes with --remote")
			}
			return pinLocal(c.String("config"), c.Bool("json"), c.Bool("rotate"), c.Bool("yes"))
		},
	}
}

type pinJSON struct {
	Authority  string                       `json:"authority"`
	URL        string                       `json:"url"`
	PinSHA256  string                       `json:"pin_sha256"`
	CertSHA256 string                       `json:"cert_sha256"`
	CertDER    string                       `json:"cert_der"`
	NotBefore  string                       `json:"not_before"`
	NotAfter   string                       `json:"not_after"`
	SANs       []string                     `json:"sans"`
	KeyType    string                       `json:"key_type"`
	ChangedAt  string                       `json:"identity_changed_at"`
	StateDir   string                       `json:"state_dir"`
	Source     string                       `json:"source"`
	Rotated    bool                         `json:"rotated,omitempty"`
	OldPin     string                       `json:"old_pin_sha256,omitempty"`
	Candidate  pairing.PluginProxyCandidate `json:"candidate"`
	TLS        admin.TLSStatus              `json:"tls"`
}

// storedCert serves the certificate found in the ACME storage, so pin shows
// it through the identity's one Current path.
type storedCert struct{ c *tls.Certificate }

func (s storedCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.c, nil }

// acmeView is the ACME identity as the storage holds it: the current
// certificate (when there is one) and the tls block.
func acmeView(e *config.Env, a pinning.Authority, id *pinning.Identity) (*pinning.Identity, admin.TLSStatus, error) {
	st, err := acme.Stored(e.ACMEOptions(a, id.Signer()))
	if err != nil {
		return nil, admin.TLSStatus{}, err
	}
	ts := admin.ACMETLSStatus(st, e.Cfg.TLS.ACME.Needs())
	if st.State == acme.StateValid {
		leaf, err := x509.ParseCertificate(st.CertDER)
		if err != nil {
			return nil, ts, err
		}
		id = id.WithCertSource(storedCert{&tls.Certificate{Certificate: st.Chain, PrivateKey: id.Signer(), Leaf: leaf}})
	}
	return id.Current(), ts, nil
}

// certTime formats one of a certificate's times; "" without a certificate.
func certTime(leaf *x509.Certificate, t func(*x509.Certificate) time.Time) string {
	if leaf == nil {
		return ""
	}
	return t(leaf).UTC().Format(time.RFC3339)
}

func pinLocal(flagConfig string, asJSON, rotate, yes bool) error {
	e, err := loadEnv(flagConfig, true)
	if err != nil {
		return err
	}
	port, err := config.ListenPort(e.Cfg.Listen)
	if err != nil {
		return err
	}
	if port == 0 && e.Cfg.AdvertisePort == 0 {
		return fmt.Errorf("listen %q has no fixed port, so the authority's port is unknown; set advertise_port", e.Cfg.Listen)
	}
	ra, err := e.Authority(port)
	if err != nil {
		return err
	}
	for _, w := range ra.Warnings {
		fmt.Fprintln(os.Stderr, "warning:", w)
	}
	ic := e.IdentityConfig(ra.Authority)
	// The identity being replaced, whatever names it was issued for.
	var cur *pinning.Identity
	var curErr error
	if rotate {
		old := ic
		old.SkipNameCheck = true
		cur, curErr = pinning.Load(old)
	}
	if rotate && !yes {
		if curErr == nil {
			fmt.Printf("Rotation would replace the identity with pin %s for %s.\n", cur.Pin, ra.Authority)
		} else {
			fmt.Printf("No usable identity yet (%v); rotation would create one for %s.\n", curErr, ra.Authority)
		}
		fmt.Println("Every paired client would have to re-pair. The current identity is kept as a backup (the last three are kept).")
		fmt.Println("Run `securelink pin --rotate --yes` to do it.")
		return nil
	}
	var id *pinning.Identity
	var oldPin string
	if rotate {
		if curErr == nil {
			oldPin = cur.Pin
		}
		id, err = pinning.Rotate(ic)
	} else {
		id, err = pinning.LoadOrCreate(ic)
	}
	if err != nil {
		return err
	}
	for _, w := range id.Warnings {
		fmt.Fprintln(os.Stderr, "warning:", w)
	}
	ts := admin.TLSStatus{Mode: e.Cfg.TLS.Mode, State: string(acme.StateValid), Issuer: id.Leaf.Issuer.CommonName,
		NotAfter: certTime(id.Leaf, func(c *x509.Certificate) time.Time { return c.NotAfter })}
	if e.Cfg.TLS.Mode == pinning.ModeACME {
		if id, ts, err = acmeView(e, ra.Authority, id); err != nil {
			return err
		}
		if ts.Rotation != nil && !rotate {
			fmt.Fprintf(os.Stderr, "warning: the stored ACME certificate is for pin %s, the identity key's pin is %s: %s\n", ts.Rotation.OldPin, ts.Rotation.NewPin, admin.RotationMessage)
		}
	}
	certSHA := ""
	if id.Leaf != nil {
		certSHA = pinning.CertSHA256Hex(id.CertDER)
	}
	out := pinJSON{
		Authority:  ra.Authority.String(),
		URL:        ra.Authority.URL(),
		PinSHA256:  id.Pin,
		CertSHA256: certSHA,
		CertDER:    id.CertDERBase64(),
		NotBefore:  certTime(id.Leaf, func(c *x509.Certificate) time.Time { return c.NotBefore }),
		NotAfter:   certTime(id.Leaf, func(c *x509.Certificate) time.Time { return c.NotAfter }),
		SANs:       id.SANs(),
		KeyType:    id.KeyType,
		ChangedAt:  id.ChangedAt.UTC().Format(time.RFC3339),
		StateDir:   e.StateDir,
		Source:     id.Source,
		Rotated:    rotate,
		OldPin:     oldPin,
		Candidate:  pairing.NewPluginProxyCandidate(ra.Authority, id),
		TLS:        ts,
	}
	if asJSON {
		if err := printJSON(out); err != nil {
			return err
		}
	} else {
		fmt.Printf("authority    %s\nurl          %s\npin_sha256   %s\ncert_sha256  %s\nkey          %s\nsans         %s\nvalid        %s .. %s\nchanged      %s\nidentity     %s\n",
			out.Authority, out.URL, out.PinSHA256, out.CertSHA256, out.KeyType, strings.Join(out.SANs, ", "),
			out.NotBefore, out.NotAfter, out.ChangedAt, out.Source)
		fmt.Printf("tls          %s, %s\n", out.TLS.Mode, out.TLS.State)
		if out.TLS.Mode == pinning.ModeACME {
			fmt.Printf("issuer       %s\nnot_after    %s\nnext_renewal %s\n", orNone(out.TLS.Issuer), orNone(out.TLS.NotAfter), orNone(out.TLS.NextRenewal))
			if out.TLS.State == string(acme.StateWaiting) {
				fmt.Printf("waiting      no certificate in %s yet; %s\n", config.ACMEDir(e.StateDir), out.TLS.Needs)
			}
		}
		cand, _ := json.MarshalIndent(out.Candidate, "", "  ")
		fmt.Printf("candidate    %s\n", cand)
	}
	if rotate {
		fmt.Fprintf(os.Stderr, "Identity rotated (old pin %s, new pin %s).\nEvery paired client must re-pair: reload the daemon (systemctl reload securelink, or kill -HUP its pid), then run `securelink pair`.\n",
			orNone(oldPin), id.Pin)
		fmt.Fprintln(os.Stderr, pairing.DesktopForgetHint(out.URL))
		fmt.Fprint(os.Stderr, formatClientNotes(pairing.ClientNotes(pairing.IdentityFacts(ra.Authority.Host, id.Leaf))))
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

type remoteJSON struct {
	URL        string   `json:"url"`
	PinSHA256  string   `json:"pin_sha256"`
	CertSHA256 string   `json:"cert_sha256"`
	Subject    string   `json:"subject"`
	SANs       []string `json:"sans"`
	NotBefore  string   `json:"not_before"`
	NotAfter   string   `json:"not_after"`
	Matches    *bool    `json:"matches_expected,omitempty"`
}

func pinRemote(ctx context.Context, rawURL, expect string, asJSON bool) error {
	if expect != "" {
		if _, err := pinning.ParsePin(expect); err != nil {
			return fmt.Errorf("--expect: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	info, err := pinning.InspectRemote(ctx, rawURL)
	if err != nil {
		return err
	}
	out := remoteJSON{URL: rawURL, PinSHA256: info.Pin, CertSHA256: info.CertSHA256, Subject: info.Subject,
		SANs: info.SANs, NotBefore: info.NotBefore.UTC().Format(time.RFC3339), NotAfter: info.NotAfter.UTC().Format(time.RFC3339)}
	var mismatch error
	if expect != "" {
		mismatch = info.CheckPin(expect)
		ok := mismatch == nil
		out.Matches = &ok
	}
	if asJSON {
		if err := printJSON(out); err != nil {
			return err
		}
	} else {
		fmt.Printf("url          %s\npin_sha256   %s\ncert_sha256  %s\nsubject      %s\nsans         %s\nvalid        %s .. %s\n",
			out.URL, out.PinSHA256, out.CertSHA256, out.Subject, strings.Join(out.SANs, ", "), out.NotBefore, out.NotAfter)
	}
	if mismatch != nil {
		return fmt.Errorf("pin mismatch: %s presents %s, expected %s", rawURL, info.Pin, expect)
	}
	return nil
}

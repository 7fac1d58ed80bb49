package acme

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/hermes-securelink/securelink/pinning"
)

// Stored reads what the storage holds for o's names without starting
// anything, creating anything or talking to the CA: for `pin` and `doctor`
// when the daemon is not asked. A name without a certificate is
// StateWaiting; a certificate for another key than o's sets KeyChange (the
// daemon will report the rotation and replace it at its next start).
func Stored(o Options) (Status, error) {
	c, err := o.check()
	if err != nil {
		return Status{}, err
	}
	if _, err := os.Stat(c.StorageDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Status{}, fmt.Errorf("acme storage: %w", err)
	}
	storage := &certmagic.FileStorage{Path: c.StorageDir}
	ik := (&certmagic.ACMEIssuer{CA: c.CA}).IssuerKey()
	st := Status{Pin: c.pin}
	for _, name := range c.Names {
		cs := CertStatus{Name: name, State: StateWaiting}
		data, err := storage.Load(context.Background(), certmagic.StorageKeys.SiteCert(ik, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return Status{}, fmt.Errorf("acme storage: %w", err)
		default:
			chain, leaf, err := parseChain(data)
			if err != nil {
				cs.LastError = "stored certificate unreadable: " + err.Error()
				break
			}
			if !bytes.Equal(leaf.RawSubjectPublicKeyInfo, c.spki) {
				st.KeyChange = &KeyChange{OldPin: pinning.SPKIPin(leaf), NewPin: c.pin, At: time.Now(), Names: append(keyChangeNames(st.KeyChange), name)}
				break
			}
			cs = CertStatus{
				Name: name, State: StateValid, Issuer: issuerName(leaf),
				Serial:    hex.EncodeToString(leaf.SerialNumber.Bytes()),
				NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter,
				NextRenewal: renewalStart(leaf, c.RenewalWindowRatio),
				CertDER:     leaf.Raw, Chain: chain,
			}
		}
		st.Certificates = append(st.Certificates, cs)
	}
	st.CertStatus = st.Certificates[0]
	return st, nil
}

func keyChangeNames(kc *KeyChange) []string {
	if kc == nil {
		return nil
	}
	return kc.Names
}

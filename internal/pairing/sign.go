package pairing

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// QR secret file: the Relay creates 32 random bytes at mode 0600 and accepts
// any file of at least 16 bytes (it regenerates a shorter one, so a short
// file can never verify).
const (
	QRSecretFileName = "hermes-relay-qr-secret"
	MinQRSecretBytes = 16
	// maxQRSecretBytes bounds the read; the Relay reads the whole file, but
	// anything this large is not a secret it wrote.
	maxQRSecretBytes = 64 << 10
)

// sigMember is excluded from the signed bytes, so signing is idempotent.
const sigMember = "sig"

var (
	// ErrUnsigned is returned by Verify for a payload without a sig.
	ErrUnsigned = errors.New("the pairing payload is not signed")
	// ErrBadSignature is returned by Verify when sig does not match.
	ErrBadSignature = errors.New("the pairing payload's signature does not match the QR secret")
)

// SigningInput is the canonical JSON of payload without its sig member: the
// bytes the HMAC covers.
func SigningInput(payload map[string]any) ([]byte, error) {
	if payload == nil {
		return nil, errors.New("no payload to sign")
	}
	clean := make(map[string]any, len(payload))
	for k, v := range payload {
		if k != sigMember {
			clean[k] = v
		}
	}
	return Canonical(clean)
}

// Sign returns the payload's sig: standard base64 (padded) of
// HMAC-SHA256(key, SigningInput(payload)).
func Sign(key []byte, payload map[string]any) (string, error) {
	if len(key) < MinQRSecretBytes {
		return "", fmt.Errorf("QR secret shorter than %d bytes", MinQRSecretBytes)
	}
	in, err := SigningInput(payload)
	if err != nil {
		return "", err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(in)
	return base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
}

// Verify checks the payload's sig against key in constant time.
func Verify(key []byte, payload map[string]any) error {
	if len(key) < MinQRSecretBytes {
		return fmt.Errorf("QR secret shorter than %d bytes", MinQRSecretBytes)
	}
	s, present := payload[sigMember]
	if !present {
		return ErrUnsigned
	}
	sig, ok := s.(string)
	if !ok {
		return ErrBadSignature
	}
	got, err := base64.StdEncoding.Strict().DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return ErrBadSignature
	}
	in, err := SigningInput(payload)
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(in)
	if !hmac.Equal(mac.Sum(nil), got) {
		return ErrBadSignature
	}
	return nil
}

// DefaultQRSecretPath is $HERMES_HOME/hermes-relay-qr-secret, HERMES_HOME
// defaulting to ~/.hermes, as the Relay resolves it.
func DefaultQRSecretPath() (string, error) {
	home := os.Getenv("HERMES_HOME")
	if home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("cannot find the QR secret: %w", err)
		}
		home = filepath.Join(h, ".hermes")
	}
	return filepath.Join(home, QRSecretFileName), nil
}

// LooseModeError reports a QR secret other users can read. It is a warning:
// LoadQRSecret returns the secret together with it, and the caller decides
// whether to verify anyway (the secret is the Relay's; fixing its mode is
// the operator's call).
type LooseModeError struct {
	Path string
	Mode fs.FileMode
}

func (e *LooseModeError) Error() string {
	return fmt.Sprintf("%s has mode %04o: other users can read it and forge pairing signatures; run chmod 600 %s",
		e.Path, e.Mode.Perm(), e.Path)
}

// LoadQRSecret reads the Relay's QR secret. A missing file wraps
// fs.ErrNotExist. When the file is readable but group/other-accessible,
// the secret is returned along with a *LooseModeError.
func LoadQRSecret(path string) ([]byte, error) {
	data, fi, err := atomicfile.ReadPrivate(path, maxQRSecretBytes, 0)
	if err != nil {
		return nil, err
	}
	if len(data) < MinQRSecretBytes {
		return nil, fmt.Errorf("%s has %d bytes, fewer than %d: the Relay will replace it, so nothing signed with it can verify",
			path, len(data), MinQRSecretBytes)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return data, &LooseModeError{Path: path, Mode: fi.Mode()}
	}
	return data, nil
}

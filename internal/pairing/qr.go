package pairing

import (
	"errors"
	"fmt"
	"strings"

	qrcode "github.com/skip2/go-qrcode"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// QRSizeLimit is the most bytes a QR code holds: version 40 with error
// correction L in byte mode. The pairing QR always uses L, because the
// payload (pin, certificate, maybe a broker route) is large and a screen is
// not a damaged sticker.
const QRSizeLimit = 2953

// Rendering parameters.
const (
	// TerminalQuietZone is the light margin, in modules, around the
	// terminal QR. The standard asks for 4; phone scanners read 2 reliably,
	// and every column counts in a terminal.
	TerminalQuietZone = 2
	// PNGModulePixels is the size of one module in the PNG; the PNG keeps
	// the standard 4-module quiet zone.
	PNGModulePixels = 8
)

// ErrTooLargeForQR is matched (errors.Is) by every *QRSizeError.
var ErrTooLargeForQR = errors.New("the pairing payload is too large for a QR code")

// QRSizeError says how far over the QR limit a payload is, and what to do.
type QRSizeError struct{ Size int }

func (e *QRSizeError) Error() string {
	return fmt.Sprintf("the pairing payload has %d bytes; a QR code holds at most %d. "+
		"Pair with --no-reach or fewer --lan routes, or use the invite URL instead of the QR", e.Size, QRSizeLimit)
}

// Unwrap makes errors.Is(err, ErrTooLargeForQR) true.
func (e *QRSizeError) Unwrap() error { return ErrTooLargeForQR }

// ErrQRTooWide is matched (errors.Is) by every *QRWidthError.
var ErrQRTooWide = errors.New("the QR code does not fit the terminal")

// QRWidthError says how many columns the terminal QR needs.
type QRWidthError struct{ Need, Columns int }

func (e *QRWidthError) Error() string {
	return fmt.Sprintf("the QR code needs %d terminal columns and only %d are available; "+
		"widen the terminal, write a PNG with --png FILE, or use the invite URL", e.Need, e.Columns)
}

// Unwrap makes errors.Is(err, ErrQRTooWide) true.
func (e *QRWidthError) Unwrap() error { return ErrQRTooWide }

// encodeQR encodes payload as a QR with error correction L, or returns a
// *QRSizeError.
func encodeQR(payload []byte) (*qrcode.QRCode, error) {
	if len(payload) == 0 {
		return nil, errors.New("empty QR payload")
	}
	if len(payload) > QRSizeLimit {
		return nil, &QRSizeError{Size: len(payload)}
	}
	q, err := qrcode.New(string(payload), qrcode.Low)
	if err != nil {
		return nil, fmt.Errorf("QR encoding: %w", err)
	}
	return q, nil
}

// ANSI colours of the terminal QR: black on white, set explicitly so the code
// has the same polarity on dark and light terminal themes (scanners expect
// dark modules on a light ground; an uncoloured rendering comes out inverted
// on one of the two). 47 (white) comes before 107 (bright white) so a
// terminal without the bright colours still paints a light background.
const (
	ansiQRColours = "\x1b[30;47;107m"
	ansiReset     = "\x1b[0m"
)

// RenderTerminal draws the QR with half blocks, two modules per character
// cell vertically (▀ dark top, ▄ dark bottom, █ both, space neither), inside
// a TerminalQuietZone margin, black on an explicit white background. Each
// line resets the colours before its newline. It returns a *QRWidthError when
// the code is wider than columns, and a *QRSizeError when no QR can hold the
// payload.
func RenderTerminal(payload []byte, columns int) (string, error) {
	q, err := encodeQR(payload)
	if err != nil {
		return "", err
	}
	q.DisableBorder = true
	bm := q.Bitmap()
	n := len(bm) + 2*TerminalQuietZone
	if columns < n {
		return "", &QRWidthError{Need: n, Columns: columns}
	}
	dark := func(x, y int) bool {
		x -= TerminalQuietZone
		y -= TerminalQuietZone
		return y >= 0 && y < len(bm) && x >= 0 && x < len(bm[y]) && bm[y][x]
	}
	var b strings.Builder
	b.Grow((n + 1) / 2 * (n*3 + len(ansiQRColours) + len(ansiReset) + 1))
	for y := 0; y < n; y += 2 {
		b.WriteString(ansiQRColours)
		for x := 0; x < n; x++ {
			top, bottom := dark(x, y), y+1 < n && dark(x, y+1)
			switch {
			case top && bottom:
				b.WriteString("█")
			case top:
				b.WriteString("▀")
			case bottom:
				b.WriteString("▄")
			default:
				b.WriteByte(' ')
			}
		}
		b.WriteString(ansiReset)
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// TerminalColumns is the width RenderTerminal needs for payload.
func TerminalColumns(payload []byte) (int, error) {
	q, err := encodeQR(payload)
	if err != nil {
		return 0, err
	}
	q.DisableBorder = true
	return len(q.Bitmap()) + 2*TerminalQuietZone, nil
}

// WritePNG writes the QR as a PNG at path, mode 0600 and atomically: the
// image holds the API key, the pairing code and maybe a broker token.
func WritePNG(path string, payload []byte) error {
	q, err := encodeQR(payload)
	if err != nil {
		return err
	}
	img, err := q.PNG(-PNGModulePixels)
	if err != nil {
		return fmt.Errorf("QR PNG: %w", err)
	}
	return atomicfile.WriteOutput(path, img, 0o600)
}

package pairing

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/makiuchi-d/gozxing"
	zxqr "github.com/makiuchi-d/gozxing/qrcode"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
	"github.com/hermes-securelink/securelink/internal/otheruid"
)

// realisticPayload is a signed payload with a plugin_proxy candidate built
// from a real self-signed identity: about 1.2-1.5 KB.
func realisticPayload(t *testing.T) []byte {
	t.Helper()
	ttl := 2592000.0
	qr := relayPayload(t, endpointsAny(testEndpoints(t, false)), &ttl, nil)
	if !isPrintableASCII(qr) {
		t.Fatal("the payload is not ASCII")
	}
	if len(qr) < 1100 || len(qr) > 1600 {
		t.Fatalf("realistic payload has %d bytes, want about 1.2-1.5 KB", len(qr))
	}
	return qr
}

// decodeQR reads a QR from img with an independent decoder.
func decodeQR(t *testing.T, img image.Image) []byte {
	t.Helper()
	bmp, err := gozxing.NewBinaryBitmapFromImage(img)
	if err != nil {
		t.Fatal(err)
	}
	res, err := zxqr.NewQRCodeReader().Decode(bmp, map[gozxing.DecodeHintType]interface{}{
		gozxing.DecodeHintType_PURE_BARCODE: true,
	})
	if err != nil {
		t.Fatalf("decoding the QR: %v", err)
	}
	if ec := res.GetResultMetadata()[gozxing.ResultMetadataType_ERROR_CORRECTION_LEVEL]; ec != "L" {
		t.Errorf("error correction level %v, want L", ec)
	}
	// Payloads are ASCII (the Relay writes ensure_ascii JSON), so the text
	// is the bytes whatever character set the decoder guesses for byte
	// segments; the encoder mixes numeric, alphanumeric and byte segments.
	return []byte(res.GetText())
}

// decodePNGFile reads the PNG at path and decodes the QR it shows.
func decodePNGFile(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	return decodeQR(t, img)
}

func TestWritePNGDecodesToPayload(t *testing.T) {
	payload := realisticPayload(t)
	path := filepath.Join(t.TempDir(), "qr.png")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WritePNG(path, payload); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("PNG mode %04o, want 0600", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after the write, want only the PNG", len(entries))
	}
	if got := decodePNGFile(t, path); !bytes.Equal(got, payload) {
		t.Fatalf("decoded QR differs from the payload:\n got %q\nwant %q", got, payload)
	}
}

// sizedPayload returns valid JSON of exactly n bytes shaped like a payload
// (mixed letters, digits and punctuation, so the encoder's mode choice is
// exercised).
func sizedPayload(t *testing.T, n int) []byte {
	t.Helper()
	head := `{"hermes":3,"host":"192.0.2.10","port":8642,"pad":"`
	tail := `"}`
	pad := strings.Repeat("MIIBXzCCAQagAwIBAgIQB8Vd9oqqBbsFM7XuT9nTITAKBggqhkjOPQQDAjAVMRMw+/=1234567890", n/70+1)
	b := []byte(head + pad[:n-len(head)-len(tail)] + tail)
	if len(b) != n {
		t.Fatalf("built %d bytes, want %d", len(b), n)
	}
	return b
}

func TestQRSizeLimit(t *testing.T) {
	max := sizedPayload(t, QRSizeLimit)
	path := filepath.Join(t.TempDir(), "max.png")
	if err := WritePNG(path, max); err != nil {
		t.Fatalf("a %d-byte payload must fit: %v", QRSizeLimit, err)
	}
	if got := decodePNGFile(t, path); !bytes.Equal(got, max) {
		t.Fatalf("the largest QR does not decode to its payload: got %d bytes %q", len(got), got[:200])
	}

	over := sizedPayload(t, QRSizeLimit+1)
	for name, err := range map[string]error{
		"WritePNG":        WritePNG(filepath.Join(t.TempDir(), "over.png"), over),
		"RenderTerminal":  func() error { _, err := RenderTerminal(over, 1000); return err }(),
		"TerminalColumns": func() error { _, err := TerminalColumns(over); return err }(),
	} {
		var se *QRSizeError
		if !errors.Is(err, ErrTooLargeForQR) || !errors.As(err, &se) || se.Size != QRSizeLimit+1 {
			t.Errorf("%s: %v, want a *QRSizeError", name, err)
			continue
		}
		for _, hint := range []string{"--no-reach", "--lan", "invite URL"} {
			if !strings.Contains(err.Error(), hint) {
				t.Errorf("%s: the error does not suggest %s: %v", name, hint, err)
			}
		}
	}
}

// terminalImage turns RenderTerminal output back into modules: each cell is
// one module wide and two tall.
func terminalImage(t *testing.T, out string) image.Image {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	width := -1
	var rows [][]bool
	for i, l := range lines {
		if !strings.HasPrefix(l, ansiQRColours) || !strings.HasSuffix(l, ansiReset) {
			t.Fatalf("line %d does not set and reset its colours: %q", i, l)
		}
		cells := strings.TrimSuffix(strings.TrimPrefix(l, ansiQRColours), ansiReset)
		if n := utf8.RuneCountInString(cells); width < 0 {
			width = n
		} else if n != width {
			t.Fatalf("line %d has %d cells, want %d", i, n, width)
		}
		top, bottom := make([]bool, 0, width), make([]bool, 0, width)
		for _, r := range cells {
			switch r {
			case '█':
				top, bottom = append(top, true), append(bottom, true)
			case '▀':
				top, bottom = append(top, true), append(bottom, false)
			case '▄':
				top, bottom = append(top, false), append(bottom, true)
			case ' ':
				top, bottom = append(top, false), append(bottom, false)
			default:
				t.Fatalf("unexpected character %q", r)
			}
		}
		rows = append(rows, top, bottom)
	}
	// The quiet zone is light on every side.
	for x := 0; x < width; x++ {
		for z := 0; z < TerminalQuietZone; z++ {
			if rows[z][x] || rows[width-1-z][x] || rows[x][z] || rows[x][width-1-z] {
				t.Fatalf("dark module inside the quiet zone at x=%d", x)
			}
		}
	}
	const scale = 4
	img := image.NewGray(image.Rect(0, 0, width*scale, width*scale))
	for y := 0; y < width*scale; y++ {
		for x := 0; x < width*scale; x++ {
			c := color.Gray{Y: 255}
			if rows[y/scale][x/scale] {
				c = color.Gray{Y: 0}
			}
			img.SetGray(x, y, c)
		}
	}
	return img
}

func TestRenderTerminal(t *testing.T) {
	payload := realisticPayload(t)
	need, err := TerminalColumns(payload)
	if err != nil {
		t.Fatal(err)
	}
	out, err := RenderTerminal(payload, 200)
	if err != nil {
		t.Fatalf("a 1.2 KB payload must fit 200 columns: %v", err)
	}
	if got := decodeQR(t, terminalImage(t, out)); !bytes.Equal(got, payload) {
		t.Fatal("the terminal QR does not decode to the payload")
	}
	lines := strings.Count(out, "\n")
	if lines != (need+1)/2 {
		t.Errorf("%d lines for %d modules, want %d", lines, need, (need+1)/2)
	}

	_, err = RenderTerminal(payload, 80)
	var we *QRWidthError
	if !errors.Is(err, ErrQRTooWide) || !errors.As(err, &we) || we.Need != need || we.Columns != 80 {
		t.Fatalf("80 columns: %v, want a *QRWidthError needing %d", err, need)
	}
	for _, hint := range []string{"--png", "invite URL"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("the width error does not point to %s: %v", hint, err)
		}
	}
	// Exactly the needed width fits; one less does not.
	if _, err := RenderTerminal(payload, need); err != nil {
		t.Errorf("exact width %d: %v", need, err)
	}
	if _, err := RenderTerminal(payload, need-1); !errors.Is(err, ErrQRTooWide) {
		t.Errorf("width %d: %v", need-1, err)
	}
	if _, err := RenderTerminal(nil, 200); err == nil {
		t.Error("rendered an empty payload")
	}
}

func TestFullPairingPayloadFitsQR(t *testing.T) {
	// plugin_proxy + one LAN route + Reach with an ECDSA P-256 identity:
	// the largest common pairing still fits one QR (an RSA-3072 identity
	// with Reach does not: about 4.2 KB).
	ttl := 2592000.0
	payload := relayPayload(t, endpointsAny(testEndpoints(t, true, "192.168.1.5")), &ttl, nil)
	if len(payload) > QRSizeLimit {
		t.Fatalf("full payload has %d bytes, more than a QR holds", len(payload))
	}
	path := filepath.Join(t.TempDir(), "full.png")
	if err := WritePNG(path, payload); err != nil {
		t.Fatal(err)
	}
	if got := decodePNGFile(t, path); !bytes.Equal(got, payload) {
		t.Fatal("the full pairing QR does not decode to its payload")
	}
}

// `pair --png /tmp/qr.png` run as the service user: the PNG is the
// caller's own output, so a shared directory it does not own (/tmp, root's,
// sticky) must take it. Run as root, the write happens in a child process
// as nobody, since root passes every owner check.
func TestWritePNGIntoASharedDirectory(t *testing.T) {
	if out := os.Getenv("SECURELINK_TEST_PNG_OUT"); out != "" {
		if err := WritePNG(out, []byte("HERMES-PAIR test payload")); err != nil {
			fmt.Fprintln(os.Stderr, "write:", err)
			os.Exit(3)
		}
		return
	}
	shared := os.TempDir()
	if o, err := atomicfile.OwnerOf(shared); err != nil || (o.UID == os.Geteuid() && os.Geteuid() != 0) {
		t.Skipf("%s is the caller's own directory: no shared directory to write into", shared)
	}
	out := filepath.Join(shared, fmt.Sprintf("securelink-qr-test-%d.png", os.Getpid()))
	t.Cleanup(func() { os.Remove(out) })
	uid := os.Getuid()
	if uid == 0 {
		uid = otheruid.Nobody // root passes every owner check
	}
	cmd := otheruid.New(t).Command(uid, []string{"SECURELINK_TEST_PNG_OUT=" + out},
		"-test.run=^TestWritePNGIntoASharedDirectory$", "-test.count=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pair --png into %s refused: %v\n%s", shared, err, b)
	}
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("PNG mode %04o, want 0600", fi.Mode().Perm())
	}
}

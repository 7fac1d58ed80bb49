package testfake

import (
	"bytes"
	"testing"
)

func TestWSPlaintextDecodesFrames(t *testing.T) {
	head := "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	key := [4]byte{1, 2, 3, 4}
	mask := func(p []byte) []byte {
		out := bytes.Clone(p)
		for i := range out {
			out[i] ^= key[i%4]
		}
		return out
	}
	// "SECRET" split over two masked frames, then a 300-byte unmasked frame
	// (16-bit length) and a 70000-byte one (64-bit length).
	var b []byte
	b = append(b, head...)
	b = append(b, 0x02, 0x80|3)
	b = append(b, key[:]...)
	b = append(b, mask([]byte("SEC"))...)
	b = append(b, 0x80, 0x80|3)
	b = append(b, key[:]...)
	b = append(b, mask([]byte("RET"))...)
	mid := bytes.Repeat([]byte("m"), 300)
	b = append(b, 0x82, 126, 0x01, 0x2c)
	b = append(b, mid...)
	big := bytes.Repeat([]byte("b"), 70000)
	b = append(b, 0x82, 127, 0, 0, 0, 0, 0, 0x01, 0x11, 0x70)
	b = append(b, big...)

	got, err := wsPlaintext(b)
	if err != nil {
		t.Fatal(err)
	}
	want := head + "SECRET" + string(mid) + string(big)
	if string(got) != want {
		t.Fatalf("decoded %d bytes, want %d", len(got), len(want))
	}
	if _, err := wsPlaintext(b[:len(b)-1]); err == nil {
		t.Fatal("a truncated frame was not reported")
	}

	r := &Recorder{Max: 10}
	r.record(&r.sent, []byte("0123456789abc"))
	if !r.Truncated() || string(r.Sent()) != "0123456789" {
		t.Fatalf("bounded recorder kept %q", r.Sent())
	}
}

package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

func TestGoldenFrames(t *testing.T) {
	cases := []struct {
		name string
		f    Frame
		hex  string
	}{
		{"DATA", Frame{Flags: FlagData, StreamID: seqID, Payload: []byte("hi")},
			"0102" + "000102030405060708090a0b0c0d0e0f" + "6869"},
		{"CLOSE", Frame{Flags: FlagClose, StreamID: revID},
			"0104" + "f0e0d0c0b0a090807060504030201000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want, _ := hex.DecodeString(c.hex)
			got, err := AppendFrame(nil, c.f)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("AppendFrame = %x (%v), want %x", got, err, want)
			}
			back, err := ParseFrame(want)
			if err != nil || back.Flags != c.f.Flags || back.StreamID != c.f.StreamID ||
				!bytes.Equal(back.Payload, c.f.Payload) {
				t.Fatalf("ParseFrame = %+v, %v", back, err)
			}
		})
	}
	if got := AppendClose([]byte("x"), revID); !bytes.Equal(got[1:], mustHex("0104f0e0d0c0b0a090807060504030201000")) || got[0] != 'x' {
		t.Errorf("AppendClose = %x", got)
	}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestParseFramePayloadAliasesInput(t *testing.T) {
	b := mustHex("0102000102030405060708090a0b0c0d0e0f6869")
	f, err := ParseFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	b[18] = 'X'
	if f.Payload[0] != 'X' {
		t.Error("payload was copied; the doc promises aliasing")
	}
}

func header(version, flags byte) []byte {
	return append([]byte{version, flags}, seqID[:]...)
}

func TestParseFrameRejects(t *testing.T) {
	cases := map[string][]byte{
		"empty":              nil,
		"17 bytes":           header(1, FlagClose)[:17],
		"DATA empty":         header(1, FlagData),
		"CLOSE with payload": append(header(1, FlagClose), 0),
		"version 0":          append(header(0, FlagData), 1),
		"version 2":          append(header(2, FlagData), 1),
		"version 2 CLOSE":    header(2, FlagClose),
		"flags 0":            append(header(1, 0), 1),
		"flags 1":            append(header(1, 1), 1),
		"flags 3":            append(header(1, 3), 1),
		"flags 6":            append(header(1, 6), 1),
		"flags 6 no payload": header(1, 6),
		"flags 8 (WINDOW)":   append(header(1, 8), 0, 0, 0, 1),
		"flags 0x82":         append(header(1, 0x82), 1),
		"flags 0xff":         append(header(1, 0xff), 1),
		"1 MiB + 19":         append(header(1, FlagData), make([]byte, MaxClientFrame+1)...),
	}
	for name, b := range cases {
		_, err := ParseFrame(b)
		wantErr(t, name, err, CodeUnauthorized, true)
	}
}

func TestFrameSizeLimits(t *testing.T) {
	in := append(header(1, FlagData), make([]byte, MaxClientFrame)...)
	if len(in) != MaxClientFrame+18 {
		t.Fatal("test frame has the wrong size")
	}
	f, err := ParseFrame(in)
	if err != nil || len(f.Payload) != MaxClientFrame {
		t.Fatalf("1 MiB + 18 rejected: %v", err)
	}
	// Sending is capped at 1 MiB in total.
	if _, err := AppendFrame(nil, Frame{Flags: FlagData, Payload: make([]byte, MaxHostFrameOut-HeaderLen)}); err != nil {
		t.Errorf("1 MiB frame refused: %v", err)
	}
	dst := []byte("keep")
	out, err := AppendFrame(dst, Frame{Flags: FlagData, Payload: make([]byte, MaxHostFrameOut-HeaderLen+1)})
	if err == nil || string(out) != "keep" {
		t.Errorf("1 MiB + 1 frame encoded (err %v, len %d)", err, len(out))
	}
}

func TestAppendFrameRefusesInvalid(t *testing.T) {
	bad := map[string]Frame{
		"DATA empty":     {Flags: FlagData},
		"CLOSE payload":  {Flags: FlagClose, Payload: []byte{1}},
		"combined":       {Flags: FlagData | FlagClose, Payload: []byte{1}},
		"zero flags":     {Payload: []byte{1}},
		"WINDOW 0":       {Flags: FlagWindow, Payload: []byte{0, 0, 0, 0}},
		"WINDOW 2^31":    {Flags: FlagWindow, Payload: []byte{0x80, 0, 0, 0}},
		"WINDOW 3 bytes": {Flags: FlagWindow, Payload: []byte{0, 0, 1}},
		"WINDOW 5 bytes": {Flags: FlagWindow, Payload: []byte{0, 0, 0, 0, 1}},
	}
	for name, f := range bad {
		if b, err := AppendFrame(nil, f); err == nil || len(b) != 0 {
			t.Errorf("%s: encoded %x", name, b)
		}
	}
}

func TestWindowFrameOnlyWithCredit(t *testing.T) {
	credit := Dialect{Credit: true}
	ok := append(header(1, FlagWindow), 0x7f, 0xff, 0xff, 0xff)
	if _, err := ParseFrame(ok); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("plain v1 accepted WINDOW: %v", err)
	}
	f, err := credit.ParseFrame(ok)
	if err != nil || f.Flags != FlagWindow || !bytes.Equal(f.Payload, []byte{0x7f, 0xff, 0xff, 0xff}) {
		t.Fatalf("credit dialect rejected WINDOW: %v", err)
	}
	enc, err := AppendFrame(nil, f)
	if err != nil || !bytes.Equal(enc, ok) {
		t.Errorf("WINDOW round trip: %x %v", enc, err)
	}
	for name, b := range map[string][]byte{
		"increment 0":    append(header(1, FlagWindow), 0, 0, 0, 0),
		"increment 2^31": append(header(1, FlagWindow), 0x80, 0, 0, 0),
		"3 bytes":        append(header(1, FlagWindow), 0, 0, 1),
		"no payload":     header(1, FlagWindow),
		"combined 10":    append(header(1, FlagWindow|FlagData), 0, 0, 0, 1),
	} {
		_, err := credit.ParseFrame(b)
		wantErr(t, "credit "+name, err, CodeUnauthorized, true)
	}
	// The credit dialect changes nothing else.
	if _, err := credit.ParseFrame(header(1, FlagData)); err == nil {
		t.Error("credit dialect accepted an empty DATA frame")
	}
}

func TestSplitData(t *testing.T) {
	msg := make([]byte, MaxClientFrame)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	frames := SplitData(revID, msg, 0)
	if len(frames) != 2 {
		t.Fatalf("1 MiB became %d frames, want 2", len(frames))
	}
	var got []byte
	for i, fr := range frames {
		if len(fr) > MaxHostFrameOut {
			t.Errorf("frame %d has %d bytes", i, len(fr))
		}
		f, err := ParseFrame(fr)
		if err != nil || f.Flags != FlagData || f.StreamID != revID {
			t.Fatalf("frame %d: %+v %v", i, f.Flags, err)
		}
		got = append(got, f.Payload...)
	}
	if len(frames[0]) != MaxHostFrameOut || len(frames[1]) != HeaderLen+HeaderLen {
		t.Errorf("frame sizes %d, %d", len(frames[0]), len(frames[1]))
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("reassembled bytes differ")
	}
	// Frames do not alias the message, and appending to one frame does not
	// overwrite the next (they share one allocation).
	msg[0]++
	if frames[0][HeaderLen] == msg[0] {
		t.Error("frame aliases the input")
	}
	before := append([]byte(nil), frames[1]...)
	_ = append(frames[0], 0xAA)
	if !bytes.Equal(frames[1], before) {
		t.Error("appending to frame 0 overwrote frame 1")
	}
}

func TestSplitDataChunks(t *testing.T) {
	chunk := HeaderLen + MaxConnectorChunk
	cases := []struct {
		size, maxFrame, frames int
	}{
		{0, 0, 0},
		{1, 0, 1},
		{MaxHostFrameOut - HeaderLen, 0, 1},
		{MaxHostFrameOut - HeaderLen + 1, 0, 2},
		{3 * MaxConnectorChunk, chunk, 3},
		{3*MaxConnectorChunk + 1, chunk, 4},
		{5, HeaderLen + 1, 5},       // one byte per frame
		{5, HeaderLen, 1},           // invalid limit → default
		{5, MaxHostFrameOut + 1, 1}, // invalid limit → default
		{MaxClientFrame, -1, 2},     // invalid limit → default
	}
	for _, c := range cases {
		msg := bytes.Repeat([]byte{0x5a}, c.size)
		frames := SplitData(seqID, msg, c.maxFrame)
		if len(frames) != c.frames {
			t.Errorf("SplitData(%d, %d) gave %d frames, want %d", c.size, c.maxFrame, len(frames), c.frames)
			continue
		}
		limit := c.maxFrame
		if limit <= HeaderLen || limit > MaxHostFrameOut {
			limit = MaxHostFrameOut
		}
		total := 0
		for _, fr := range frames {
			if len(fr) > limit {
				t.Errorf("SplitData(%d, %d): frame of %d bytes", c.size, c.maxFrame, len(fr))
			}
			f, err := ParseFrame(fr)
			if err != nil {
				t.Fatal(err)
			}
			total += len(f.Payload)
		}
		if total != c.size {
			t.Errorf("SplitData(%d, %d) carried %d bytes", c.size, c.maxFrame, total)
		}
	}
}

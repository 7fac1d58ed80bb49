package wire

import "encoding/binary"

// Host-socket frame layout (binary WebSocket messages between broker and
// host connector; clients never see it):
//
//	offset  size  field
//	0       1     version   = FrameVersion (1)
//	1       1     flags     = exactly one of FlagData, FlagClose (FlagWindow with credit)
//	2       16    stream_id = the 16 raw bytes of the ID from "open"
//	18      n     payload   (DATA: 1..; CLOSE: 0; WINDOW: 4)
const (
	// FrameVersion is byte 0 of every frame.
	FrameVersion byte = 1

	// FlagData (0x02): payload is opaque inner-TLS bytes, at least one.
	//	01 02 <stream_id:16> <payload:1..>
	FlagData byte = 2

	// FlagClose (0x04): the stream is finished in both directions; no
	// payload. The receiver delivers the DATA it already accepted, then
	// closes its side, and never answers CLOSE with CLOSE.
	//	01 04 <stream_id:16>
	FlagClose byte = 4

	// FlagWindow (0x08) exists only under the "credit" extension and is
	// invalid in plain v1: payload is exactly 4 bytes, a big-endian credit
	// increment in 1..MaxWindow for the stream.
	//	01 08 <stream_id:16> <increment:4, big-endian>
	FlagWindow byte = 8
)

// Frame is one decoded host-socket frame. Flags holds exactly one flag:
// combinations are invalid.
type Frame struct {
	Flags    byte
	StreamID ID
	// Payload aliases the buffer given to ParseFrame: copy it before the
	// buffer is reused.
	Payload []byte
}

// Dialect is what one host registration negotiated. The zero value is plain
// v1; Credit is set only once both sides agreed on the "credit" extension
// (the broker offered it in registered, the host answered extensions), and
// only then are WINDOW frames valid.
type Dialect struct {
	Credit bool
}

// ParseFrame decodes a frame of plain v1.
func ParseFrame(b []byte) (Frame, error) { return Dialect{}.ParseFrame(b) }

// ParseFrame decodes one binary message from the host socket. Every error is
// a framing violation (unauthorized, then close 1008): short header,
// version other than 1, unknown or combined flags, DATA without payload,
// CLOSE with payload, a frame above MaxHostFrameIn, and — unless credit was
// negotiated — any WINDOW frame. Whether the stream id belongs to this
// registration is the caller's check.
func (d Dialect) ParseFrame(b []byte) (Frame, error) {
	switch {
	case len(b) < HeaderLen:
		return Frame{}, violation("frame shorter than its 18-byte header")
	case len(b) > MaxHostFrameIn:
		return Frame{}, violation("frame larger than 1 MiB + 18 bytes")
	case b[0] != FrameVersion:
		return Frame{}, violation("frame version is not 1")
	}
	f := Frame{Flags: b[1], Payload: b[HeaderLen:]}
	copy(f.StreamID[:], b[2:HeaderLen])
	switch f.Flags {
	case FlagData:
		if len(f.Payload) == 0 {
			return Frame{}, violation("DATA frame without payload")
		}
	case FlagClose:
		if len(f.Payload) != 0 {
			return Frame{}, violation("CLOSE frame with payload")
		}
	case FlagWindow:
		if !d.Credit {
			return Frame{}, violation("WINDOW frame without the credit extension")
		}
		if len(f.Payload) != 4 {
			return Frame{}, violation("WINDOW payload is not 4 bytes")
		}
		if n := binary.BigEndian.Uint32(f.Payload); n == 0 || n > MaxWindow {
			return Frame{}, violation("WINDOW increment outside 1..2^31-1")
		}
	default:
		return Frame{}, violation("unknown or combined frame flags")
	}
	return f, nil
}

// AppendFrame appends the encoding of f to dst. It refuses what a receiver
// would reject and anything above MaxHostFrameOut, the limit for frames we
// send (reference connectors refuse larger ones). WINDOW frames are not
// checked against a dialect here: sending one is the caller's decision.
func AppendFrame(dst []byte, f Frame) ([]byte, error) {
	switch f.Flags {
	case FlagData:
		if len(f.Payload) == 0 {
			return dst, violation("DATA frame without payload")
		}
	case FlagClose:
		if len(f.Payload) != 0 {
			return dst, violation("CLOSE frame with payload")
		}
	case FlagWindow:
		if len(f.Payload) != 4 {
			return dst, violation("WINDOW payload is not 4 bytes")
		}
		if n := binary.BigEndian.Uint32(f.Payload); n == 0 || n > MaxWindow {
			return dst, violation("WINDOW increment outside 1..2^31-1")
		}
	default:
		return dst, violation("unknown or combined frame flags")
	}
	if HeaderLen+len(f.Payload) > MaxHostFrameOut {
		return dst, violation("frame larger than 1 MiB")
	}
	dst = appendHeader(dst, f.Flags, f.StreamID)
	return append(dst, f.Payload...), nil
}

// AppendClose appends a CLOSE frame, which cannot fail.
func AppendClose(dst []byte, id ID) []byte { return appendHeader(dst, FlagClose, id) }

func appendHeader(dst []byte, flags byte, id ID) []byte {
	dst = append(dst, FrameVersion, flags)
	return append(dst, id[:]...)
}

// SplitData cuts one message of stream id into DATA frames of at most
// maxFrame bytes each, header included, so a full 1 MiB client message
// becomes two frames that reference connectors accept. maxFrame outside
// HeaderLen+1..MaxHostFrameOut (0 included) means MaxHostFrameOut; the
// connector passes HeaderLen+MaxConnectorChunk. An empty payload gives no
// frame, since DATA carries at least one byte. The frames share one new
// allocation and do not alias payload.
func SplitData(id ID, payload []byte, maxFrame int) [][]byte {
	if maxFrame <= HeaderLen || maxFrame > MaxHostFrameOut {
		maxFrame = MaxHostFrameOut
	}
	chunk := maxFrame - HeaderLen
	n := (len(payload) + chunk - 1) / chunk
	if n == 0 {
		return nil
	}
	buf := make([]byte, 0, n*HeaderLen+len(payload))
	frames := make([][]byte, 0, n)
	for len(payload) > 0 {
		c := min(chunk, len(payload))
		start := len(buf)
		buf = appendHeader(buf, FlagData, id)
		buf = append(buf, payload[:c]...)
		frames = append(frames, buf[start:len(buf):len(buf)])
		payload = payload[c:]
	}
	return frames
}

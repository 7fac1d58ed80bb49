package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/textproto"
	"strconv"

	"golang.org/x/net/http/httpguts"
)

// The direct path's upstream answer parser. http.ReadResponse builds a
// textproto reader, a string per line and per value, a header map, a
// transfer reader and a body per answer; on the bench's small GET that was
// about a tenth of the front's CPU. readResponse parses the common answer
// itself, straight from the bytes already in the connection's reader, and
// hands everything else to http.ReadResponse untouched: the subset it takes
// is one where ReadResponse would give the same Response (FuzzReadResponse
// holds the two equal on any input), so the header validation and the
// framing of every answer are still exactly the standard library's.
//
// The subset: the whole head already buffered, "HTTP/1.1 NNN reason" with a
// final status (200-999 except 204 and 304, so never a 1xx or a bodiless
// status), field names that are tokens and values of visible ASCII, spaces
// and tabs, every line ending in CRLF, no continuation line, exactly one
// Content-Length of decimal digits, and no Connection, Transfer-Encoding,
// Trailer or Pragma field (those change the framing, the connection's reuse
// or the header map in ReadResponse). A HEAD request's answer always goes
// to ReadResponse.

// responseSlot holds what readResponse fills in for one exchange; it lives
// in the exchange (directExchange), never in the connection, so a
// connection handed back to the pool is not tied to a handler still reading
// the answer's fields.
type responseSlot struct {
	resp http.Response
	body fixedBody
	hdr  http.Header // reused between exchanges: cleared, never shared
}

// maxKeptHeaderKeys bounds the header map a slot keeps between exchanges.
const maxKeptHeaderKeys = 32

// readResponse reads the answer's head from br: itself when the answer is
// in its subset (see above), else with http.ReadResponse.
func readResponse(br *bufio.Reader, req *http.Request, rs *responseSlot) (*http.Response, error) {
	if req.Method == http.MethodHead {
		return http.ReadResponse(br, req)
	}
	if _, err := br.Peek(1); err != nil {
		// What ReadResponse answers when the status line cannot be read
		// (bufio has handed the error over: it would not see it again).
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, crlfcrlf)
	if end < 0 || !rs.parse(buf[:end+4], req) {
		return http.ReadResponse(br, req)
	}
	br.Discard(end + 4)
	rs.body.br = br
	return &rs.resp, nil
}

var crlfcrlf = []byte("\r\n\r\n")

// parse fills rs from head (the status line through the empty line) when
// the answer is in readResponse's subset, and reports whether it was.
func (rs *responseSlot) parse(head []byte, req *http.Request) bool {
	line, rest, _ := bytes.Cut(head, crlf)
	// "HTTP/1.1 200" or "HTTP/1.1 200 reason".
	if len(line) < 12 || string(line[:9]) != "HTTP/1.1 " || (len(line) > 12 && line[12] != ' ') {
		return false
	}
	code := 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return false
		}
		code = code*10 + int(c-'0')
	}
	if code < 200 || code == http.StatusNoContent || code == http.StatusNotModified {
		return false
	}
	for _, c := range line[12:] {
		if !fieldValueByte[c] {
			return false
		}
	}
	lines := bytes.Count(rest, crlf) - 1 // the last one ends the head
	if lines <= 0 {
		return false // no Content-Length
	}
	if rs.hdr == nil || len(rs.hdr) > maxKeptHeaderKeys {
		rs.hdr = make(http.Header, lines)
	} else {
		clear(rs.hdr)
	}
	h := rs.hdr
	// One string for the whole head, the status and every value a part
	// of it; one slice cut up for the single values (as textproto does).
	s := string(head)
	off := len(line) + 2
	strs := make([]string, lines)
	length := int64(-1)
	for range lines {
		n := bytes.Index(head[off:], crlf)
		kv := head[off : off+n]
		colon := bytes.IndexByte(kv, ':')
		if colon <= 0 {
			return false
		}
		key, ok := canonicalKey(kv[:colon])
		if !ok {
			return false
		}
		vstart, vend := off+colon+1, off+n
		for _, c := range head[vstart:vend] {
			if !fieldValueByte[c] {
				return false
			}
		}
		value := textproto.TrimString(s[vstart:vend]) // no CR or LF is left to trim

		switch key {
		case "Connection", "Transfer-Encoding", "Trailer", "Pragma":
			return false
		case "Content-Length":
			// As net/http's parseContentLength: digits only, below 2^63.
			n, err := strconv.ParseUint(value, 10, 63)
			if length >= 0 || err != nil {
				return false
			}
			length = int64(n)
		}
		if vv := h[key]; vv == nil { // strs has one entry per line: never short
			vv, strs = strs[:1:1], strs[1:]
			vv[0] = value
			h[key] = vv
		} else {
			h[key] = append(vv, value)
		}
		off += n + 2
	}
	if length < 0 {
		return false
	}
	rs.resp = http.Response{
		Status: s[9:len(line)], StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, ContentLength: length, Request: req,
	}
	if length == 0 {
		rs.resp.Body = http.NoBody
	} else {
		rs.body = fixedBody{left: length} // its reader is set by readResponse
		rs.resp.Body = &rs.body
	}
	return true
}

var crlf = []byte("\r\n")

// canonicalKey is textproto's canonical form of a field name made of token
// bytes (false otherwise, or for an empty or overlong one): the common
// names come from a table, the others are allocated.
func canonicalKey(k []byte) (string, bool) {
	var a [64]byte
	if len(k) == 0 || len(k) > len(a) {
		return "", false
	}
	upper := true
	for i, c := range k {
		if !tokenByte[c] {
			return "", false
		}
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		a[i] = c
		upper = c == '-'
	}
	if v, ok := commonKeys[string(a[:len(k)])]; ok {
		return v, true
	}
	return string(a[:len(k)]), true
}

// commonKeys are the answer fields seen on almost every response, kept so
// their names are not allocated per answer.
var commonKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{
		"Accept-Ranges", "Access-Control-Allow-Credentials", "Access-Control-Allow-Headers",
		"Access-Control-Allow-Methods", "Access-Control-Allow-Origin", "Access-Control-Expose-Headers",
		"Access-Control-Max-Age", "Age", "Allow", "Cache-Control", "Content-Disposition",
		"Content-Encoding", "Content-Language", "Content-Length", "Content-Location",
		"Content-Security-Policy", "Content-Type", "Cross-Origin-Opener-Policy", "Date",
		"Etag", "Expires", "Keep-Alive", "Last-Modified", "Link", "Location",
		"Referrer-Policy", "Retry-After", "Server", "Set-Cookie", "Strict-Transport-Security",
		"Vary", "Www-Authenticate", "X-Content-Type-Options", "X-Frame-Options",
		"X-Request-Id", "X-Xss-Protection",
	} {
		m[k] = k
	}
	return m
}()

// tokenByte and fieldValueByte are the bytes readResponse accepts in a
// field name (a token, as textproto requires) and in a value or reason
// phrase (visible ASCII, space, tab: textproto also allows obs-text, which
// is left to it).
var tokenByte, fieldValueByte = func() (t, v [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = c < 0x80 && httpguts.IsTokenRune(rune(c))
		v[c] = c == '\t' || (0x20 <= c && c < 0x7f)
	}
	return
}()

// fixedBody reads a Content-Length body from the connection's reader as
// net/http's body does: io.EOF with the last bytes, io.ErrUnexpectedEOF
// when the upstream closes before the end.
type fixedBody struct {
	br   *bufio.Reader
	left int64
}

func (b *fixedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.br.Read(p)
	b.left -= int64(n)
	switch {
	case err == io.EOF && b.left > 0:
		err = io.ErrUnexpectedEOF
	case err == nil && b.left == 0:
		err = io.EOF
	}
	return n, err
}

func (b *fixedBody) Close() error { return nil }

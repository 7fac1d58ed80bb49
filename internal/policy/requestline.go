package policy

import "golang.org/x/net/http/httpguts"

// The request line the front writes upstream is HTTP/1.1 whatever the
// client spoke, and HTTP/2 and HTTP/3 carry the method and the target as
// header values that may hold what an HTTP/1.1 request line cannot: a
// ":method" of "TRACE " (past a method check, then read as TRACE upstream),
// "GET /admin" (a second target), a space in the query (a forged protocol
// version and more tokens). These rules make the written line one an
// HTTP/1.1 client could have sent, which re-parses to the same method and
// target.

// ValidMethod reports whether m is an RFC 9110 method: a non-empty token
// (no space, tab, control byte, non-ASCII byte or delimiter).
func ValidMethod(m string) bool {
	return httpguts.ValidHeaderFieldName(m) // a field name is exactly a token
}

// CheckRawQuery refuses a raw query (the request-target after '?') holding
// a byte that cannot appear in an HTTP/1.1 request-target: a control byte,
// space, DEL or a byte outside ASCII, or '#' (a fragment is never sent).
// Percent-encoding is not judged: the query passes byte for byte.
func CheckRawQuery(q string) error {
	for i := 0; i < len(q); i++ {
		if !targetByte(q[i]) {
			return unsafe("control, space, non-ASCII byte or '#' in query")
		}
	}
	return nil
}

// CheckRequestTarget refuses an origin-form request-target, as written on
// an upstream request line, that an HTTP/1.1 parser would not read back as
// the same target: it must start with '/', hold only visible ASCII other
// than '#', and its path (before '?') only well-formed percent-encoding.
func CheckRequestTarget(t string) error {
	if t == "" || t[0] != '/' {
		return unsafe("not an origin-form target")
	}
	inQuery := false
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case !targetByte(c):
			return unsafe("control, space, non-ASCII byte or '#' in target")
		case c == '?':
			inQuery = true
		case c == '%' && !inQuery:
			if i+2 >= len(t) || !isHex(t[i+1]) || !isHex(t[i+2]) {
				return unsafe("malformed percent-encoding")
			}
		}
	}
	return nil
}

// targetByte reports a byte allowed anywhere in a request-target as the
// front forwards it: visible ASCII (0x21-0x7E) other than '#'.
func targetByte(c byte) bool { return c > 0x20 && c < 0x7f && c != '#' }

// Package policy holds the pure, table-driven rules of the Secure Link front:
// which raw paths are safe to forward, which Host headers name this front, and
// what each namespace forwards, adds or strips in request and response
// headers. Nothing here does I/O, so every rule is tested row by row and
// fuzzed; package proxy wires the rules into its listener and ReverseProxy.
package policy

import (
	"errors"
	"strings"
)

// Namespace is one of the three services behind the front. Each keeps its own
// credential, so every header rule is decided per namespace.
type Namespace int

// The zero value is deliberately not a namespace, so a forgotten assignment
// never silently gets another namespace's header policy.
const (
	NSUnknown Namespace = iota
	NSRelay
	NSAPI
	NSDashboard
)

// String returns the name used in logs (key "ns") and in the health body.
func (n Namespace) String() string {
	switch n {
	case NSRelay:
		return "relay"
	case NSAPI:
		return "api"
	case NSDashboard:
		return "dashboard"
	default:
		return "unknown"
	}
}

// Prefix is the public path prefix of the namespace, without trailing slash.
func (n Namespace) Prefix() string {
	switch n {
	case NSRelay:
		return "/relay"
	case NSAPI:
		return "/api"
	case NSDashboard:
		return "/dashboard"
	default:
		return ""
	}
}

// ErrUnsafePath is wrapped by every CheckRawPath refusal; the proxy answers
// 400. The wrapped text names the rule, never the path, because paths may
// carry tokens.
var ErrUnsafePath = errors.New("unsafe request path")

func unsafe(reason string) error { return &pathError{reason} }

type pathError struct{ reason string }

func (e *pathError) Error() string { return ErrUnsafePath.Error() + ": " + e.reason }
func (e *pathError) Unwrap() error { return ErrUnsafePath }

// CheckRawPath applies the path-safety rule to the request path exactly as the
// client sent it (the part of the request-target before '?'). It must run on
// the raw bytes: once decoded, "%2e%2e" and ".." are indistinguishable, and an
// upstream that decodes or normalizes differently from us could be walked out
// of its namespace. The upstream later receives these same raw bytes.
//
// Refused (in addition to the contract's backslash, "//", percent-encoded
// '/', '\' or '.' in any case, and "." / ".." segments):
//   - a path not starting with '/', or containing '#' (neither can be an
//     origin-form path, so something upstream of us misparsed it);
//   - malformed percent-encoding ("%zz", a truncated "%2"), since upstreams
//     disagree on how to repair it;
//   - raw or percent-encoded control bytes (NUL, CR, LF, ... DEL) and raw
//     bytes outside printable ASCII, which are not valid in a request-target
//     and which some upstreams truncate at or normalize;
//   - a segment that is "." or ".." followed by ';' (a path parameter), which
//     servlet-style routers treat as a dot segment.
//
// A trailing slash is not an empty segment: "/api/x/" is accepted. Double
// encoding ("%252e") is accepted: it decodes to the literal text "%2e", and an
// upstream that decodes twice is broken regardless of this front.
func CheckRawPath(raw string) error {
	if raw == "" || raw[0] != '/' {
		return unsafe("not an absolute path")
	}
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '\\':
			return unsafe("backslash")
		case c == '#':
			return unsafe("fragment in request path")
		case c <= 0x20 || c >= 0x7f:
			return unsafe("control or non-ASCII byte")
		case c == '%':
			if i+2 >= len(raw) || !isHex(raw[i+1]) || !isHex(raw[i+2]) {
				return unsafe("malformed percent-encoding")
			}
			b := unhex(raw[i+1])<<4 | unhex(raw[i+2])
			switch {
			case b == '/' || b == '\\' || b == '.':
				return unsafe("percent-encoded separator or dot")
			case b < 0x20 || b == 0x7f:
				return unsafe("percent-encoded control byte")
			}
			i += 2
		}
	}
	// Segment by segment after the leading slash, without allocating (this
	// runs on every /api and /dashboard request). The last segment may be
	// empty (a trailing slash); any other empty one is "//".
	rest := raw[1:]
	for {
		s, after, more := strings.Cut(rest, "/")
		if s == "" && more {
			return unsafe("empty segment")
		}
		if param := strings.IndexByte(s, ';'); param >= 0 {
			s = s[:param]
		}
		if s == "." || s == ".." {
			return unsafe("dot segment")
		}
		if !more {
			break
		}
		rest = after
	}
	return nil
}

// Split maps a raw path to its namespace and the raw tail the upstream gets.
// Matching is on the raw bytes and case-sensitive, so "/API/x" or
// "/%61pi/x" are not found rather than guessed at. "/api" and "/dashboard"
// without a trailing slash are not found (404), as the contract says. For the
// relay the tail is the Relay's own path ("/health" or "/ws").
func Split(raw string) (ns Namespace, tail string, ok bool) {
	switch {
	case strings.HasPrefix(raw, "/api/"):
		return NSAPI, raw[len("/api"):], true
	case strings.HasPrefix(raw, "/dashboard/"):
		return NSDashboard, raw[len("/dashboard"):], true
	case raw == "/relay/health":
		return NSRelay, "/health", true
	case raw == "/relay/ws":
		return NSRelay, "/ws", true
	}
	return NSUnknown, "", false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

package pairing

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Limits of the JSON reader. The payload itself is at most a few KiB (a QR
// holds 2,953 bytes); the bounds only keep hostile input cheap.
const (
	// MaxJSONBytes bounds any document Parse accepts.
	MaxJSONBytes = 1 << 20
	// maxDepth bounds nesting; the pairing payload nests five levels deep.
	maxDepth = 64
	// maxIntDigits is CPython's default int/str conversion limit: json.loads
	// refuses longer integers, so the Relay can never have signed one.
	maxIntDigits = 4300
)

// Int is a JSON number written without fraction or exponent, kept as its
// decimal text so that integers of any size survive a round trip exactly;
// Python reads such a number as an int, not a float, and writes it back
// digit for digit.
type Int string

// IntOf returns n as an Int.
func IntOf(n int64) Int { return Int(strconv.FormatInt(n, 10)) }

// Int64 returns the value when it fits in an int64.
func (i Int) Int64() (int64, bool) {
	n, err := strconv.ParseInt(string(i), 10, 64)
	return n, err == nil
}

// valid reports whether i is -?(0|[1-9][0-9]*) within the digit limit.
func (i Int) valid() bool {
	s := string(i)
	if s != "" && s[0] == '-' {
		s = s[1:]
	}
	if s == "" || len(s) > maxIntDigits || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for j := 0; j < len(s); j++ {
		if s[j] < '0' || s[j] > '9' {
			return false
		}
	}
	return true
}

// Parse reads one JSON document into a value tree of nil, bool, string, Int,
// float64, []any and map[string]any.
//
// It is stricter than Python's json.loads wherever accepting would let the
// two sides see different documents: duplicate object keys (Python keeps the
// last), lone UTF-16 surrogates in \u escapes (a Go string cannot carry
// them), NaN/Infinity literals and floats that overflow to infinity (the
// Relay's signer refuses them) and invalid UTF-8 are errors. "-0" is read as
// the integer 0, as Python reads it, so it canonicalizes to "0".
func Parse(data []byte) (any, error) {
	if len(data) > MaxJSONBytes {
		return nil, fmt.Errorf("JSON document of %d bytes exceeds the %d-byte limit", len(data), MaxJSONBytes)
	}
	p := parser{data: data}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return nil, p.errorf("unexpected data after the JSON value")
	}
	return v, nil
}

// ParseObject is Parse for documents that must be a JSON object.
func ParseObject(data []byte) (map[string]any, error) {
	v, err := Parse(data)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("JSON document is not an object")
	}
	return m, nil
}

type parser struct {
	data []byte
	pos  int
}

// errorf reports the byte offset only: quoting the input could put a token
// or the API key into an error message.
func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at byte %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (any, error) {
	if depth > maxDepth {
		return nil, p.errorf("nested deeper than %d levels", maxDepth)
	}
	if p.pos >= len(p.data) {
		return nil, p.errorf("unexpected end of input")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		return p.str()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case p.literal("true"):
		return true, nil
	case p.literal("false"):
		return false, nil
	case p.literal("null"):
		return nil, nil
	default:
		return nil, p.errorf("unexpected character %q", c)
	}
}

func (p *parser) literal(word string) bool {
	if len(p.data)-p.pos >= len(word) && string(p.data[p.pos:p.pos+len(word)]) == word {
		p.pos += len(word)
		return true
	}
	return false
}

func (p *parser) object(depth int) (any, error) {
	p.pos++ // '{'
	m := map[string]any{}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return m, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, p.errorf("expected an object key")
		}
		keyAt := p.pos
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			p.pos = keyAt
			return nil, p.errorf("duplicate object key")
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, p.errorf("expected ':' after an object key")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		m[k] = v
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.errorf("unterminated object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return m, nil
		default:
			return nil, p.errorf("expected ',' or '}' in an object")
		}
	}
}

func (p *parser) array(depth int) (any, error) {
	p.pos++ // '['
	a := []any{}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return a, nil
	}
	for {
		p.skipSpace()
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.errorf("unterminated array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return a, nil
		default:
			return nil, p.errorf("expected ',' or ']' in an array")
		}
	}
}

func (p *parser) str() (string, error) {
	p.pos++ // opening quote
	// Fast path: no escapes.
	start := p.pos
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		if c == '"' {
			s := string(p.data[start:p.pos])
			p.pos++
			return s, nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", p.errorf("control character in a string")
		}
		if c < utf8.RuneSelf {
			p.pos++
			continue
		}
		r, size := utf8.DecodeRune(p.data[p.pos:])
		if r == utf8.RuneError && size <= 1 {
			return "", p.errorf("invalid UTF-8 in a string")
		}
		p.pos += size
	}
	buf := append([]byte(nil), p.data[start:p.pos]...)
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(buf), nil
		case c == '\\':
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			buf = utf8.AppendRune(buf, r)
		case c < 0x20:
			return "", p.errorf("control character in a string")
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return "", p.errorf("invalid UTF-8 in a string")
			}
			buf = append(buf, p.data[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
	return "", p.errorf("unterminated string")
}

// escape decodes one escape sequence at p.pos (a backslash).
func (p *parser) escape() (rune, error) {
	if p.pos+1 >= len(p.data) {
		return 0, p.errorf("unterminated escape")
	}
	c := p.data[p.pos+1]
	p.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		r, ok := p.hex4()
		if !ok {
			return 0, p.errorf("invalid \\u escape")
		}
		if utf16.IsSurrogate(r) {
			if r >= 0xdc00 || p.pos+1 >= len(p.data) || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
				return 0, p.errorf("lone UTF-16 surrogate in a \\u escape")
			}
			p.pos += 2
			lo, ok := p.hex4()
			if !ok || lo < 0xdc00 || lo > 0xdfff {
				return 0, p.errorf("lone UTF-16 surrogate in a \\u escape")
			}
			return utf16.DecodeRune(r, lo), nil
		}
		return r, nil
	default:
		p.pos -= 2
		return 0, p.errorf("invalid escape")
	}
}

func (p *parser) hex4() (rune, bool) {
	if len(p.data)-p.pos < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.pos += 4
	return r, true
}

func (p *parser) number() (any, error) {
	start := p.pos
	if p.data[p.pos] == '-' {
		p.pos++
	}
	intStart := p.pos
	switch {
	case p.pos < len(p.data) && p.data[p.pos] == '0':
		p.pos++
	case p.pos < len(p.data) && p.data[p.pos] >= '1' && p.data[p.pos] <= '9':
		p.digits()
	default:
		return nil, p.errorf("invalid number")
	}
	intDigits := p.pos - intStart
	isFloat := false
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if p.digits() == 0 {
			return nil, p.errorf("invalid number")
		}
		isFloat = true
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if p.digits() == 0 {
			return nil, p.errorf("invalid number")
		}
		isFloat = true
	}
	text := string(p.data[start:p.pos])
	if !isFloat {
		if intDigits > maxIntDigits {
			p.pos = start
			return nil, p.errorf("integer longer than %d digits", maxIntDigits)
		}
		if text == "-0" {
			return Int("0"), nil
		}
		return Int(text), nil
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil || math.IsInf(f, 0) {
		p.pos = start
		return nil, p.errorf("number out of the float range")
	}
	return f, nil
}

func (p *parser) digits() int {
	n := 0
	for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
		p.pos++
		n++
	}
	return n
}

package pairing

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Canonical returns the canonical JSON of v, byte for byte what the Relay's
// signer (Python json.dumps with sort_keys=True, separators=(",", ":"),
// ensure_ascii=True, allow_nan=False) writes for the same value:
//   - object keys sorted by Unicode code point (Go's byte order of UTF-8
//     strings is code point order; UTF-16 order would differ above U+FFFF),
//     array order kept, no whitespace;
//   - strings escape '"' and '\\', use \n \r \t \b \f, and write every other
//     character outside U+0020..U+007E (U+007F included) as lower-case
//     \uXXXX, with a surrogate pair above U+FFFF; '/', '<', '>' and '&' stay
//     as they are;
//   - an Int is written as its digits, a float64 as Python's repr;
//     NaN and infinities are errors.
//
// v is a tree as returned by Parse; int, int64 and the other Go integer
// types, []Endpoint and Endpoint are accepted too, for values built in Go.
func Canonical(v any) ([]byte, error) {
	return AppendCanonical(nil, v)
}

// AppendCanonical appends the canonical JSON of v to dst.
func AppendCanonical(dst []byte, v any) ([]byte, error) {
	return appendCanonical(dst, v, 0)
}

func appendCanonical(b []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("value nested deeper than %d levels", maxDepth)
	}
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		if x {
			return append(b, "true"...), nil
		}
		return append(b, "false"...), nil
	case string:
		return appendCanonicalString(b, x)
	case Int:
		if !x.valid() {
			return nil, errors.New("malformed Int value")
		}
		if x == "-0" {
			x = "0"
		}
		return append(b, x...), nil
	case float64:
		s, err := pythonFloatRepr(x)
		if err != nil {
			return nil, err
		}
		return append(b, s...), nil
	case int:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int8:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int16:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int32:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case uint:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint8:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint16:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint32:
		return strconv.AppendUint(b, uint64(x), 10), nil
	case uint64:
		return strconv.AppendUint(b, x, 10), nil
	case []any:
		return appendCanonicalArray(b, len(x), func(i int) any { return x[i] }, depth)
	case []Endpoint:
		return appendCanonicalArray(b, len(x), func(i int) any { return x[i] }, depth)
	case map[string]any:
		return appendCanonicalObject(b, x, depth)
	case Endpoint:
		return appendCanonicalObject(b, x, depth)
	default:
		return nil, fmt.Errorf("cannot canonicalize a value of type %T", v)
	}
}

func appendCanonicalArray(b []byte, n int, at func(int) any, depth int) ([]byte, error) {
	b = append(b, '[')
	for i := 0; i < n; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendCanonical(b, at(i), depth+1); err != nil {
			return nil, err
		}
	}
	return append(b, ']'), nil
}

func appendCanonicalObject(b []byte, m map[string]any, depth int) ([]byte, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendCanonicalString(b, k); err != nil {
			return nil, err
		}
		b = append(b, ':')
		if b, err = appendCanonical(b, m[k], depth+1); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

const hexDigits = "0123456789abcdef"

func appendU(b []byte, r rune) []byte {
	return append(b, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
}

func appendCanonicalString(b []byte, s string) ([]byte, error) {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"':
				b = append(b, '\\', '"')
			case c == '\\':
				b = append(b, '\\', '\\')
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c == '\b':
				b = append(b, '\\', 'b')
			case c == '\f':
				b = append(b, '\\', 'f')
			case c < 0x20 || c == 0x7f:
				b = appendU(b, rune(c))
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return nil, errors.New("string is not valid UTF-8")
		}
		if r > 0xffff {
			r -= 0x10000
			b = appendU(b, 0xd800+(r>>10))
			b = appendU(b, 0xdc00+(r&0x3ff))
		} else {
			b = appendU(b, r)
		}
		i += size
	}
	return append(b, '"'), nil
}

// pythonFloatRepr formats f as CPython's float.__repr__ does: the shortest
// digits that read back as f (Go's shortest formatting finds the same
// digits), in positional form with at least one digit after the point, or
// in exponent form (no ".0", exponent sign and at least two digits) when the
// decimal exponent is below -4 or at least 16.
func pythonFloatRepr(f float64) (string, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "", errors.New("NaN and infinite floats have no JSON form")
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±dd
	var out strings.Builder
	if s[0] == '-' {
		out.WriteByte('-')
		s = s[1:]
	}
	mant, expText, _ := strings.Cut(s, "e")
	exp, err := strconv.Atoi(expText)
	if err != nil {
		return "", fmt.Errorf("unexpected float format %q", s)
	}
	digits := strings.Replace(mant, ".", "", 1)
	switch {
	case exp < -4 || exp >= 16:
		out.WriteByte(digits[0])
		if len(digits) > 1 {
			out.WriteByte('.')
			out.WriteString(digits[1:])
		}
		out.WriteByte('e')
		if exp < 0 {
			out.WriteByte('-')
			exp = -exp
		} else {
			out.WriteByte('+')
		}
		if exp < 10 {
			out.WriteByte('0')
		}
		out.WriteString(strconv.Itoa(exp))
	case exp < 0:
		out.WriteString("0.")
		out.WriteString(strings.Repeat("0", -exp-1))
		out.WriteString(digits)
	case exp+1 >= len(digits):
		out.WriteString(digits)
		out.WriteString(strings.Repeat("0", exp+1-len(digits)))
		out.WriteString(".0")
	default:
		out.WriteString(digits[:exp+1])
		out.WriteByte('.')
		out.WriteString(digits[exp+1:])
	}
	return out.String(), nil
}

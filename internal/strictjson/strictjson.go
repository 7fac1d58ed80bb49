// Package strictjson is the project's one strict JSON reader: exactly one
// value, valid UTF-8, bounded in size, no data after it, and no object with
// a repeated key anywhere (encoding/json keeps the last of two equal keys,
// another reader may keep the first; two readers of one document must never
// disagree). On top of that it reads an object either as raw members
// checked against a known key set (ParseObject, Object.Keys) or into a
// struct that refuses unknown fields (Decode).
//
// Errors never quote the input: a value may be a token. They may name a
// key (keys are the schema's, or the one unexpected key found).
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"
)

// The kinds of failure; test with errors.Is.
var (
	ErrTooLarge   = errors.New("larger than allowed")
	ErrNotJSON    = errors.New("not valid JSON")
	ErrNotObject  = errors.New("not a JSON object")
	ErrDuplicate  = errors.New("a key appears twice")
	ErrUnknownKey = errors.New("unexpected key")
	ErrMissingKey = errors.New("missing key")
)

// KeyError is ErrDuplicate, ErrUnknownKey or ErrMissingKey for one key.
type KeyError struct {
	Err error
	Key string
}

func (e *KeyError) Error() string {
	switch e.Err {
	case ErrDuplicate:
		return fmt.Sprintf("key %q appears twice", e.Key)
	case ErrUnknownKey:
		return fmt.Sprintf("unexpected key %q", e.Key)
	case ErrMissingKey:
		return fmt.Sprintf("key %q is missing", e.Key)
	}
	return fmt.Sprintf("%v: %q", e.Err, e.Key)
}

func (e *KeyError) Unwrap() error { return e.Err }

// Object is one JSON object's members, their values undecoded.
type Object map[string]json.RawMessage

// check is the part every reader shares: the size bound, UTF-8, JSON
// validity and no repeated key at any depth. With out set, the top-level
// value must be an object, and its members go into out.
func check(data []byte, max int, out Object) error {
	if max > 0 && len(data) > max {
		return fmt.Errorf("%w (%d bytes)", ErrTooLarge, max)
	}
	if !utf8.Valid(data) || !json.Valid(data) {
		return ErrNotJSON
	}
	s := scanner{data: data}
	s.space()
	if out != nil && data[s.i] == '{' {
		return s.object(out)
	}
	if err := s.value(); err != nil {
		return err
	}
	if out != nil {
		return ErrNotObject
	}
	return nil
}

// ParseObject reads data (at most max bytes; 0 = unbounded) as exactly one
// JSON object and returns its members.
func ParseObject(data []byte, max int) (Object, error) {
	// The members' values are slices of one copy: data may be a buffer
	// its owner reuses.
	obj := Object{}
	if err := check(bytes.Clone(data), max, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// Keys checks that o holds every required key, and otherwise only optional
// ones.
func (o Object) Keys(required []string, optional ...string) error {
	for k := range o {
		if !slices.Contains(required, k) && !slices.Contains(optional, k) {
			return &KeyError{ErrUnknownKey, k}
		}
	}
	for _, k := range required {
		if _, ok := o[k]; !ok {
			return &KeyError{ErrMissingKey, k}
		}
	}
	return nil
}

// String decodes a member ParseObject returned that must be a JSON
// string; ok is false for any other value. A string without escapes is
// its bytes between the quotes (ParseObject checked it is valid JSON and
// UTF-8), with no reflection.
func String(raw json.RawMessage) (s string, ok bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	if inner := raw[1 : len(raw)-1]; bytes.IndexByte(inner, '\\') < 0 {
		return string(inner), true
	}
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// Decode reads data (at most max bytes; 0 = unbounded) as exactly one JSON
// value into v; an object field v does not know is ErrUnknownKey.
func Decode(data []byte, max int, v any) error {
	if err := check(data, max, nil); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		const prefix = "json: unknown field "
		if msg := err.Error(); len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
			var k string
			if json.Unmarshal([]byte(msg[len(prefix):]), &k) == nil {
				return &KeyError{ErrUnknownKey, k}
			}
		}
		return err
	}
	return nil
}

// DecodeReader is Decode for a body read from r: more than max bytes is
// ErrTooLarge without reading further.
func DecodeReader(r io.Reader, max int, v any) error {
	data, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
	if err != nil {
		return err
	}
	return Decode(data, max, v)
}

// scanner walks a document json.Valid accepted, one pass and without
// allocating for keys without escapes, and fails on an object with a
// repeated key. Keys are compared decoded ("a" and "\u0061" are one key),
// as encoding/json would see them.
type scanner struct {
	data []byte
	i    int
}

func (s *scanner) space() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

// str skips the string at s.i and returns it with its quotes, and whether
// it holds an escape.
func (s *scanner) str() (raw []byte, escaped bool) {
	start := s.i
	s.i++ // the opening quote
	for {
		switch s.data[s.i] {
		case '\\':
			escaped = true
			s.i += 2 // the escape and the byte after it (\uXXXX: 4 plain bytes follow)
		case '"':
			s.i++
			return s.data[start:s.i], escaped
		default:
			s.i++
		}
	}
}

// value skips the value at s.i, checking every object in it.
func (s *scanner) value() error {
	switch s.data[s.i] {
	case '{':
		return s.object(nil)
	case '[':
		s.i++
		s.space()
		if s.data[s.i] == ']' {
			s.i++
			return nil
		}
		for {
			s.space()
			if err := s.value(); err != nil {
				return err
			}
			s.space()
			c := s.data[s.i]
			s.i++ // ',' or ']'
			if c == ']' {
				return nil
			}
		}
	case '"':
		s.str()
		return nil
	}
	// A number, true, false or null: up to the next delimiter.
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ',', ']', '}', ' ', '\t', '\r', '\n':
			return nil
		}
		s.i++
	}
	return nil
}

// smallObject is how many keys an object's keys are compared by a scan
// of the ones before; past it they go into a map.
const smallObject = 16

// object skips the object at s.i and fails on a repeated key; with out
// set, its members go into out.
func (s *scanner) object(out Object) error {
	s.i++ // '{'
	s.space()
	if s.data[s.i] == '}' {
		s.i++
		return nil
	}
	var small [smallObject][]byte
	var n int
	var seen map[string]struct{}
	for {
		s.space()
		raw, escaped := s.str()
		key := raw[1 : len(raw)-1]
		if escaped {
			var k string
			if json.Unmarshal(raw, &k) != nil {
				return ErrNotJSON
			}
			key = []byte(k)
		}
		switch {
		case seen != nil:
			if _, dup := seen[string(key)]; dup {
				return &KeyError{ErrDuplicate, string(key)}
			}
			seen[string(key)] = struct{}{}
		default:
			for _, k := range small[:n] {
				if bytes.Equal(k, key) {
					return &KeyError{ErrDuplicate, string(key)}
				}
			}
			if n < smallObject {
				small[n], n = key, n+1
				break
			}
			seen = make(map[string]struct{}, 2*smallObject)
			for _, k := range small {
				seen[string(k)] = struct{}{}
			}
			seen[string(key)] = struct{}{}
		}
		s.space()
		s.i++ // ':'
		s.space()
		start := s.i
		if err := s.value(); err != nil {
			return err
		}
		if out != nil {
			out[string(key)] = json.RawMessage(s.data[start:s.i:s.i])
		}
		s.space()
		c := s.data[s.i]
		s.i++ // ',' or '}'
		if c == '}' {
			return nil
		}
	}
}

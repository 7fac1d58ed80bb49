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
// validity and no repeated key at any depth.
func check(data []byte, max int) error {
	if max > 0 && len(data) > max {
		return fmt.Errorf("%w (%d bytes)", ErrTooLarge, max)
	}
	if !utf8.Valid(data) || !json.Valid(data) {
		return ErrNotJSON
	}
	return noDuplicateKeys(data)
}

// ParseObject reads data (at most max bytes; 0 = unbounded) as exactly one
// JSON object and returns its members.
func ParseObject(data []byte, max int) (Object, error) {
	if err := check(data, max); err != nil {
		return nil, err
	}
	var obj Object
	if bytes.TrimLeft(data, " \t\r\n")[0] != '{' || json.Unmarshal(data, &obj) != nil {
		return nil, ErrNotObject
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

// Decode reads data (at most max bytes; 0 = unbounded) as exactly one JSON
// value into v; an object field v does not know is ErrUnknownKey.
func Decode(data []byte, max int, v any) error {
	if err := check(data, max); err != nil {
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

// noDuplicateKeys walks a valid JSON document and fails on an object with a
// repeated key (json.Valid has already refused data after the value).
func noDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		obj  bool
		keys map[string]struct{}
		key  bool // the next token in an object is a key
	}
	var stack []*frame
	for {
		t, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return ErrNotJSON
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if k, isKey := t.(string); isKey && top != nil && top.obj && top.key {
			if _, dup := top.keys[k]; dup {
				return &KeyError{ErrDuplicate, k}
			}
			top.keys[k] = struct{}{}
			top.key = false
			continue
		}
		switch t {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, keys: map[string]struct{}{}, key: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].key = true
		}
	}
}

package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"testing"
	"unicode/utf8"
)

// register is a Reach register message, the frame every registration and
// every match parses first.
var register = []byte(`{"type":"register","protocol_version":1,"role":"host","credential_kind":"host",` +
	`"host_id":"Zm9vYmFyYmF6cXV4cXV1eHh4eHg","connection_id":"YmFyYmF6cXV4Zm9vcXV1eHh4eHg",` +
	`"token":"dG9rZW50b2tlbnRva2VudG9rZW50b2tlbnRva2VudG9rZW4"}`)

func TestDuplicateKeysDecoded(t *testing.T) {
	many := func(dup string) string { // past smallObject, so the map path
		var b strings.Builder
		b.WriteString(`{`)
		for i := range 3 * smallObject {
			fmt.Fprintf(&b, `"k%d":%d,`, i, i)
		}
		b.WriteString(dup + `:0}`)
		return b.String()
	}
	for _, c := range []struct {
		in   string
		want error
	}{
		{`{"a":1,"\u0061":2}`, ErrDuplicate},      // one key, spelt twice
		{`{"\u0061":1,"a":2}`, ErrDuplicate},      // the other way round
		{`{"a\"b":1,"a\u0022b":2}`, ErrDuplicate}, // escapes on both
		{`{"\ud800":1,"\udfff":2}`, ErrDuplicate}, // both decode to U+FFFD
		{`{"a":1,"A":2,"a ":3,"\\a":4}`, nil},
		{`{"a":[1,"}",{"b":"{\"b\":1}"}],"b":{"a":{}}}`, nil}, // delimiters inside strings
		{`{"a":[[],{},[{}],-1.5e3,true,false,null]}`, nil},
		{many(`"k7"`), ErrDuplicate},
		{many(`"k40"`), ErrDuplicate},
		{many(`"k\u0034\u0037"`), ErrDuplicate},
		{many(`"k99"`), nil},
		{`[{"a":1},{"a":1}]`, ErrNotObject}, // equal keys in two objects
		{`[{"a":1,"a":1}]`, ErrDuplicate},   // a duplicate wins over not an object
	} {
		_, err := ParseObject([]byte(c.in), 0)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%.60s: %v, want %v", c.in, err, c.want)
		}
		var v any
		err = Decode([]byte(c.in), 0, &v)
		if want := c.want; want == ErrNotObject {
			want = nil // Decode takes any value
		} else if !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Errorf("Decode %.60s: %v, want %v", c.in, err, want)
		}
	}
}

// The members are ParseObject's own copy: the frame it read may be a
// buffer its owner reuses for the next one.
func TestParseObjectCopies(t *testing.T) {
	in := []byte(`{"a":"xy","b":[1, 2]}`)
	o, err := ParseObject(in, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		in[i] = ' '
	}
	if string(o["a"]) != `"xy"` || string(o["b"]) != `[1, 2]` {
		t.Fatalf("members changed with the input buffer: %q %q", o["a"], o["b"])
	}
}

// A register message is parsed in one pass over one copy: the token-by-
// token walk it replaced (encoding/json's Decoder.Token, then Unmarshal
// into a map) allocated ~130 times for it.
func TestParseObjectAllocations(t *testing.T) {
	n := testing.AllocsPerRun(200, func() {
		if _, err := ParseObject(register, 4096); err != nil {
			t.Fatal(err)
		}
	})
	if n > 16 {
		t.Fatalf("ParseObject allocates %v times for a register message, want at most 16", n)
	}
}

// FuzzParseObject holds the one-pass reader to the rules of the reader it
// replaced, a walk over encoding/json's tokens with one key set per object
// and Unmarshal for the members: the same verdict on every input, and the
// same members.
func FuzzParseObject(f *testing.F) {
	for _, s := range []string{string(register), `{"a":1,"\u0061":2}`, `{"a":{"b":[1,{"c":2,"c":3}]}}`,
		`[{"a":1}]`, `{"a":"\ud800","b":"\\"}`, `{}`, ` {"x" : [ ] } `, `{"a":1}x`, "{\"a\":\"\xff\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseObject(data, 4096)
		want, wantErr := referenceParseObject(data, 4096)
		for _, kind := range []error{ErrTooLarge, ErrNotJSON, ErrNotObject, ErrDuplicate} {
			if errors.Is(err, kind) != errors.Is(wantErr, kind) {
				t.Fatalf("%q: %v, the reference says %v", data, err, wantErr)
			}
		}
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: %v, the reference says %v", data, err, wantErr)
		}
		if err == nil && !maps.EqualFunc(got, want, func(a, b json.RawMessage) bool { return bytes.Equal(a, b) }) {
			t.Fatalf("%q: members %q, the reference has %q", data, got, want)
		}
	})
}

// referenceParseObject is ParseObject as it was before the one-pass reader.
func referenceParseObject(data []byte, max int) (Object, error) {
	if max > 0 && len(data) > max {
		return nil, ErrTooLarge
	}
	if !utf8.Valid(data) || !json.Valid(data) {
		return nil, ErrNotJSON
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		obj  bool
		keys map[string]struct{}
		key  bool
	}
	var stack []*frame
	for {
		t, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, ErrNotJSON
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if k, isKey := t.(string); isKey && top != nil && top.obj && top.key {
			if _, dup := top.keys[k]; dup {
				return nil, &KeyError{ErrDuplicate, k}
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
	var obj Object
	if bytes.TrimLeft(data, " \t\r\n")[0] != '{' || json.Unmarshal(data, &obj) != nil {
		return nil, ErrNotObject
	}
	return obj, nil
}

func BenchmarkParseObject(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseObject(register, 4096); err != nil {
			b.Fatal(err)
		}
	}
}

func TestString(t *testing.T) {
	o, err := ParseObject([]byte(`{"a":"plain","b":"e\u0073c\"","c":1,"d":null,"e":["x"],"f":""}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"a": "plain", "b": `esc"`, "f": ""} {
		if got, ok := String(o[k]); !ok || got != want {
			t.Errorf("%s: %q %v, want %q", k, got, ok, want)
		}
	}
	for _, k := range []string{"c", "d", "e", "missing"} {
		if got, ok := String(o[k]); ok {
			t.Errorf("%s: %q is no string member", k, got)
		}
	}
}

package strictjson

import (
	"errors"
	"strings"
	"testing"
)

func TestParseObject(t *testing.T) {
	for _, c := range []struct {
		in   string
		want error
	}{
		{`{"a":1,"b":"x"}`, nil},
		{` {"a":{"b":[1,{"c":2}]}} `, nil},
		{`{"a":1,"a":2}`, ErrDuplicate},
		{`{"a":{"b":1,"b":1}}`, ErrDuplicate},
		{`{"a":[{"b":1,"b":1}]}`, ErrDuplicate},
		{`{"a":1} {"a":2}`, ErrNotJSON},
		{`{"a":1`, ErrNotJSON},
		{"{\"a\":\"\xff\"}", ErrNotJSON},
		{`[1]`, ErrNotObject},
		{`null`, ErrNotObject},
		{`"s"`, ErrNotObject},
		{`{"a":"` + strings.Repeat("x", 100) + `"}`, ErrTooLarge},
	} {
		_, err := ParseObject([]byte(c.in), 64)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%.40q: %v, want %v", c.in, err, c.want)
		}
	}
	// Equal keys in different objects are not duplicates.
	if _, err := ParseObject([]byte(`{"a":{"k":1},"b":{"k":1}}`), 0); err != nil {
		t.Fatal(err)
	}
}

func TestKeys(t *testing.T) {
	o, err := ParseObject([]byte(`{"a":1,"b":2}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Keys([]string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	if err := o.Keys([]string{"a"}, "b", "c"); err != nil {
		t.Fatal(err)
	}
	var ke *KeyError
	if err := o.Keys([]string{"a"}); !errors.As(err, &ke) || ke.Err != ErrUnknownKey || ke.Key != "b" {
		t.Fatalf("unknown key: %v", err)
	}
	if err := o.Keys([]string{"a", "b", "c"}); !errors.Is(err, ErrMissingKey) || !strings.Contains(err.Error(), `"c"`) {
		t.Fatalf("missing key: %v", err)
	}
}

func TestDecode(t *testing.T) {
	type inner struct {
		N int `json:"n"`
	}
	type doc struct {
		A string           `json:"a"`
		M map[string]inner `json:"m"`
	}
	var d doc
	if err := Decode([]byte(`{"a":"x","m":{"k":{"n":3}}}`), 1024, &d); err != nil || d.A != "x" || d.M["k"].N != 3 {
		t.Fatalf("%+v %v", d, err)
	}
	var ke *KeyError
	if err := Decode([]byte(`{"a":"x","z":1}`), 1024, &d); !errors.As(err, &ke) || ke.Err != ErrUnknownKey || ke.Key != "z" {
		t.Fatalf("unknown field: %v", err)
	}
	// A repeated map key is refused even though encoding/json would keep
	// the last value silently.
	if err := Decode([]byte(`{"m":{"k":{"n":1},"k":{"n":2}}}`), 1024, &d); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate map key: %v", err)
	}
	if err := Decode([]byte(`{"a":"x"}`+strings.Repeat(" ", 10)), 12, &d); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("size bound: %v", err)
	}
	if err := DecodeReader(strings.NewReader(`{"a":"`+strings.Repeat("x", 1<<20)+`"}`), 4096, &d); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("reader bound: %v", err)
	}
	if err := DecodeReader(strings.NewReader(`{"a":"y"}`), 4096, &d); err != nil || d.A != "y" {
		t.Fatalf("reader: %+v %v", d, err)
	}
}

// A token in a value never appears in an error.
func TestErrorsDoNotQuoteValues(t *testing.T) {
	const secret = "c2VjcmV0LXRva2VuLXZhbHVl"
	for _, in := range []string{`{"t":"` + secret + `","t":"` + secret + `"}`, `{"t":"` + secret + `"`, `["` + secret + `"]`} {
		_, err := ParseObject([]byte(in), 0)
		if err == nil || strings.Contains(err.Error(), secret) {
			t.Fatalf("%q: %v", in, err)
		}
	}
}

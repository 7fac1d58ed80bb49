package pairing

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
)

// canonicalVectors: each input was run through Python 3.11's
// json.dumps(json.loads(in), sort_keys=True, separators=(",", ":"),
// ensure_ascii=True, allow_nan=False) — the Relay's signer — and the output
// pasted here verbatim.
var canonicalVectors = []struct{ in, want string }{
	// Key order by code point, nested objects, NUL in a key.
	{"{\"b\":1,\"a\":2,\"B\":3,\"\":4,\"aa\":5,\"a\\u0000\":6}",
		`{"":4,"B":3,"a":2,"a\u0000":6,"aa":5,"b":1}`},
	// Non-BMP keys sort after U+FFFF (code point order; UTF-16 order would
	// put U+10000 before U+E000). U+007F is escaped.
	{"{\"\U0001f600\":1,\"\uffff\":2,\"\ue000\":3,\"\U00010000\":4,\"\u00e9\":5,\"z\":6,\"\u007f\":7}",
		`{"z":6,"\u007f":7,"\u00e9":5,"\ue000":3,"\uffff":2,"\ud800\udc00":4,"\ud83d\ude00":1}`},
	{"{\"outer\":{\"z\":[3,2,1,{\"y\":null,\"x\":true}],\"a\":{\"c\":false,\"b\":[]}},\"empty\":{}}",
		`{"empty":{},"outer":{"a":{"b":[],"c":false},"z":[3,2,1,{"x":true,"y":null}]}}`},
	// Big integers stay integers; -0 is the integer 0 for Python.
	{"[123456789012345678901234567890,-123456789012345678901234567890,0,-0,1,-1]",
		`[123456789012345678901234567890,-123456789012345678901234567890,0,0,1,-1]`},
	// Floats as Python's repr.
	{"[1.0,1e16,0.1,1e-7,1.5e300,1e22,-0.0,0.0001,1e-05,123456789012345680000.0,5e-324,1.7976931348623157e308,2.5,100.0,1e15,1E2,1.5e-10,12345.678,0.5e1]",
		`[1.0,1e+16,0.1,1e-07,1.5e+300,1e+22,-0.0,0.0001,1e-05,1.2345678901234568e+20,5e-324,1.7976931348623157e+308,2.5,100.0,1000000000000000.0,100.0,1.5e-10,12345.678,5.0]`},
	// Escapes: " and \ escaped, / < > & not, short forms, lower-case hex,
	// surrogate pairs, \/ read as /.
	{"[\"quote\\\"back\\\\slash/slash<lt>gt&amp;\",\"\\n\\r\\t\\b\\f\\u0000\\u001f\\u007f\",\"caf\u00e9 \u4e2d\u6587 \U0001f600 \U0010ffff\",\"\\u00e9\\ud83d\\ude00\",\"\\/\"]",
		`["quote\"back\\slash/slash<lt>gt&amp;","\n\r\t\b\f\u0000\u001f\u007f","caf\u00e9 \u4e2d\u6587 \ud83d\ude00 \udbff\udfff","\u00e9\ud83d\ude00","/"]`},
	{"{\"t\":true,\"f\":false,\"n\":null,\"s\":\"\",\"a\":[[],{},[null]]}",
		`{"a":[[],{},[null]],"f":false,"n":null,"s":"","t":true}`},
}

func TestCanonicalMatchesPythonSigner(t *testing.T) {
	for _, v := range canonicalVectors {
		tree, err := Parse([]byte(v.in))
		if err != nil {
			t.Fatalf("Parse(%q): %v", v.in, err)
		}
		got, err := Canonical(tree)
		if err != nil {
			t.Fatalf("Canonical(%q): %v", v.in, err)
		}
		if string(got) != v.want {
			t.Errorf("Canonical(%q)\n got %s\nwant %s", v.in, got, v.want)
		}
		// Idempotent: the canonical form canonicalizes to itself.
		again, err := Parse(got)
		if err != nil {
			t.Fatal(err)
		}
		if c2, _ := Canonical(again); !bytes.Equal(c2, got) {
			t.Errorf("not idempotent: %s -> %s", got, c2)
		}
	}
}

func TestCanonicalGoBuiltValues(t *testing.T) {
	// Values built in Go (not parsed) take the same forms; encoding/json
	// would have escaped <, > and & and reordered nothing.
	tree := map[string]any{
		"int":   42,
		"i64":   int64(-7),
		"u64":   uint64(18446744073709551615),
		"big":   Int("123456789012345678901234567890"),
		"float": 2592000.0,
		"html":  "<a href=\"/x?a=1&b=2\">\x7f</a>",
		"eps":   []Endpoint{{"role": "lan", "priority": IntOf(0)}},
	}
	got, err := Canonical(tree)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"big":123456789012345678901234567890,"eps":[{"priority":0,"role":"lan"}],"float":2592000.0,` +
		`"html":"<a href=\"/x?a=1&b=2\">\u007f</a>","i64":-7,"int":42,"u64":18446744073709551615}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestCanonicalRefusesWhatPythonRefuses(t *testing.T) {
	for name, v := range map[string]any{
		"NaN":          math.NaN(),
		"+Inf":         math.Inf(1),
		"-Inf":         []any{math.Inf(-1)},
		"bad Int":      Int("01"),
		"empty Int":    Int(""),
		"invalid utf8": "a\xffb",
		"bad key":      map[string]any{"\xff": 1},
		"unknown type": struct{}{},
	} {
		if _, err := Canonical(v); err == nil {
			t.Errorf("%s: Canonical succeeded", name)
		}
	}
}

func TestCanonicalDepthBounded(t *testing.T) {
	var v any = "leaf"
	for i := 0; i < maxDepth+5; i++ {
		v = []any{v}
	}
	if _, err := Canonical(v); err == nil {
		t.Fatal("Canonical accepted a value nested deeper than the limit")
	}
}

func TestPythonFloatRepr(t *testing.T) {
	// Expected values are Python 3.11 repr() outputs.
	for _, c := range []struct {
		f    float64
		want string
	}{
		{0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {1, "1.0"}, {-1.5, "-1.5"},
		{1e16, "1e+16"}, {9999999999999998, "9999999999999998.0"}, {1e15, "1000000000000000.0"},
		{0.0001, "0.0001"}, {0.00001, "1e-05"}, {0.000123, "0.000123"}, {1.23e-5, "1.23e-05"},
		{1e22, "1e+22"}, {123456789012345680000.0, "1.2345678901234568e+20"},
		{0.1, "0.1"}, {1e-7, "1e-07"}, {1.5e300, "1.5e+300"}, {5e-324, "5e-324"},
		{1.7976931348623157e308, "1.7976931348623157e+308"}, {2.5e-100, "2.5e-100"},
		{123.456, "123.456"}, {1.0 / 3, "0.3333333333333333"}, {2592000, "2592000.0"},
	} {
		got, err := pythonFloatRepr(c.f)
		if err != nil || got != c.want {
			t.Errorf("repr(%v) = %q, %v; want %q", c.f, got, err, c.want)
		}
	}
}

func TestParseRejects(t *testing.T) {
	deep := strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2)
	for name, in := range map[string]string{
		"empty":                "",
		"duplicate key":        `{"a":1,"a":2}`,
		"nested duplicate":     `{"x":{"k":1,"k":1}}`,
		"lone high surrogate":  `["\ud800"]`,
		"lone low surrogate":   `["\udc00"]`,
		"high then non-low":    `["\ud800\u0041"]`,
		"high then text":       `["\ud800x"]`,
		"invalid utf8":         "[\"a\xffb\"]",
		"encoded surrogate":    "[\"\xed\xa0\x80\"]",
		"raw control":          "[\"a\nb\"]",
		"NaN":                  `[NaN]`,
		"Infinity":             `[Infinity]`,
		"-Infinity":            `[-Infinity]`,
		"float overflow":       `[1e400]`,
		"negative overflow":    `[-1.8e308]`,
		"leading zero":         `[01]`,
		"bare dot":             `[1.]`,
		"dot first":            `[.5]`,
		"plus":                 `[+1]`,
		"lone minus":           `[-]`,
		"exponent no digits":   `[1e]`,
		"trailing comma array": `[1,]`,
		"trailing comma obj":   `{"a":1,}`,
		"single quotes":        `{'a':1}`,
		"unquoted key":         `{a:1}`,
		"trailing data":        `{} {}`,
		"BOM":                  "\ufeff{}",
		"bad escape":           `["\x"]`,
		"short unicode":        `["\u12"]`,
		"unterminated":         `["abc`,
		"too deep":             deep,
		"huge integer":         "[" + strings.Repeat("9", maxIntDigits+1) + "]",
		"true prefix":          `[tru]`,
	} {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("%s: Parse(%q) succeeded", name, in)
		}
	}
}

func TestParseErrorsDoNotQuoteInput(t *testing.T) {
	secret := "sk-SECRETSECRETSECRET"
	for _, in := range []string{
		`{"key":"` + secret + `","key":"` + secret + `"}`,
		`{"key":"` + secret + `\q"}`,
		`{"key":"` + secret + `"`,
	} {
		_, err := Parse([]byte(in))
		if err == nil {
			t.Fatalf("Parse(%q) succeeded", in)
		}
		if strings.Contains(err.Error(), "SECRET") {
			t.Errorf("error quotes the input: %v", err)
		}
	}
}

func TestParseAcceptsEdgeCases(t *testing.T) {
	for in, want := range map[string]any{
		`  7 `: Int("7"),
		`-0`:   Int("0"),
		"[" + strings.Repeat("9", maxIntDigits) + "]": []any{Int(strings.Repeat("9", maxIntDigits))},
		`1e-400`:            0.0,
		`"\u0000"`:          "\x00",
		`"\ud83d\ude00"`:    "\U0001F600",
		`"\uD83D\uDE00"`:    "\U0001F600",
		"\"\u007f\"":        "\x7f",
		`{"a":{"a":1}}`:     map[string]any{"a": map[string]any{"a": Int("1")}},
		`[true,false,null]`: []any{true, false, nil},
		`2592000.0`:         2592000.0,
	} {
		got, err := Parse([]byte(in))
		if err != nil {
			t.Errorf("Parse(%q): %v", in, err)
			continue
		}
		gc, _ := Canonical(got)
		wc, _ := Canonical(want)
		if !bytes.Equal(gc, wc) {
			t.Errorf("Parse(%q) = %s, want %s", in, gc, wc)
		}
	}
	// -1e-400 underflows to -0.0 in both Python and Go.
	v, err := Parse([]byte(`-1e-400`))
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := Canonical(v); string(c) != "-0.0" {
		t.Errorf("-1e-400 canonicalized to %s, want -0.0", c)
	}
}

func TestParseSizeLimit(t *testing.T) {
	big := make([]byte, MaxJSONBytes+1)
	for i := range big {
		big[i] = ' '
	}
	big[0] = '1'
	if _, err := Parse(big); err == nil {
		t.Fatal("Parse accepted a document above MaxJSONBytes")
	}
}

func FuzzParseCanonical(f *testing.F) {
	for _, v := range canonicalVectors {
		f.Add([]byte(v.in))
	}
	for _, s := range []string{`{"a":1,"a":2}`, `["\ud800"]`, `[1e400]`, `-0`, `[-0.0]`, `{"":{"":[]}}`,
		`"\u007f\u0080\uffff"`, `[1E+2,1e-2,0.5]`, "\"\xed\xa0\x80\"", `[0.1e1,123456789012345678901234567890]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Parse(data)
		if err != nil {
			return
		}
		// What we accept is JSON.
		if !json.Valid(data) {
			t.Fatalf("Parse accepted invalid JSON %q", data)
		}
		c1, err := Canonical(v)
		if err != nil {
			// Only strings can fail here and Parse validated them.
			t.Fatalf("Canonical of a parsed value: %v", err)
		}
		if !isPrintableASCII(c1) {
			t.Fatalf("canonical form is not printable ASCII: %q", c1)
		}
		v2, err := Parse(c1)
		if err != nil {
			t.Fatalf("canonical form does not parse: %v (%q)", err, c1)
		}
		c2, err := Canonical(v2)
		if err != nil || !bytes.Equal(c1, c2) {
			t.Fatalf("not idempotent: %q -> %q (%v)", c1, c2, err)
		}
	})
}

func isPrintableASCII(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

func FuzzFloatRepr(f *testing.F) {
	for _, x := range []float64{0, 1, 1e16, 1e15, 0.0001, 1e-5, 5e-324, 1.7976931348623157e308, 0.1, 123456789012345680000} {
		f.Add(math.Float64bits(x))
		f.Add(math.Float64bits(-x))
	}
	f.Fuzz(func(t *testing.T, bits uint64) {
		x := math.Float64frombits(bits)
		s, err := pythonFloatRepr(x)
		if math.IsNaN(x) || math.IsInf(x, 0) {
			if err == nil {
				t.Fatalf("repr of %v succeeded", x)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		back, err := strconv.ParseFloat(s, 64)
		if err != nil || math.Float64bits(back) != bits {
			t.Fatalf("repr %q of %v does not round-trip (%v)", s, x, err)
		}
		// Python's repr always marks a float as one.
		if !strings.ContainsAny(s, ".e") {
			t.Fatalf("repr %q has neither '.' nor exponent", s)
		}
		v, err := Parse([]byte(s))
		if err != nil {
			t.Fatalf("repr %q does not parse: %v", s, err)
		}
		if _, ok := v.(float64); !ok {
			t.Fatalf("repr %q parses as %T", s, v)
		}
	})
}

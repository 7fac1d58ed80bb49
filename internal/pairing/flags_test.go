package pairing

import (
	"maps"
	"strconv"
	"strings"
	"testing"
)

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "never": 0, "3600": 3600, "45s": 45, "90m": 5400, "12h": 43200, "30d": 2592000,
		"2w": 1209600, "1d12h": 129600, "1h30m15s": 5415, "0d": 0, "3650d": MaxDurationSeconds,
	} {
		got, err := ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "1.5h", "1y", "d", "30 d", " 30d", "30D", "1d30", "3651d",
		"99999999999", "1e3", "never0", "h1", "5mm", strings.Repeat("1s", 40)} {
		if got, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %d, want an error", in, got)
		}
	}
}

func TestParseGrants(t *testing.T) {
	got, err := ParseGrants("terminal=7d,bridge=1d,chat_x=0")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"terminal": 604800, "bridge": 86400, "chat_x": 0}
	if !maps.Equal(got, want) {
		t.Fatalf("ParseGrants = %v, want %v", got, want)
	}
	many := make([]string, MaxGrants+1)
	for i := range many {
		many[i] = strings.Repeat("a", i%32+1) + strings.Repeat("_", i/32+1) + "=1d"
	}
	for _, in := range []string{"", "terminal", "terminal=", "=1d", "Terminal=1d", "term-inal=1d",
		"terminal=1d,", ",terminal=1d", "terminal=1d,,bridge=1d", "terminal=1d,terminal=2d",
		"terminal = 1d", strings.Repeat("a", 33) + "=1d", "terminal=1y", "terminal=1d=2d",
		strings.Join(many, ",")} {
		if got, err := ParseGrants(in); err == nil {
			t.Errorf("ParseGrants(%q) = %v, want an error", in, got)
		}
	}
}

func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"0", "never", "30d", "1d12h", "3600", "1d30", "99999999999d", "5mm"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseDuration(s)
		if err != nil {
			return
		}
		if n < 0 || n > MaxDurationSeconds {
			t.Fatalf("ParseDuration(%q) = %d out of bounds", s, n)
		}
		// The seconds form reads back the same.
		if m, err := ParseDuration(strconv.FormatInt(n, 10)); err != nil || m != n {
			t.Fatalf("seconds form of %q: %d, %v", s, m, err)
		}
	})
}

func FuzzParseGrants(f *testing.F) {
	for _, s := range []string{"terminal=7d,bridge=1d", "a=0", "a=1d,a=2d", "x=", "=", ","} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := ParseGrants(s)
		if err != nil {
			return
		}
		if len(g) == 0 || len(g) > MaxGrants {
			t.Fatalf("ParseGrants(%q) has %d entries", s, len(g))
		}
		parts := make([]string, 0, len(g))
		for k, v := range g {
			if !grantName.MatchString(k) || v < 0 || v > MaxDurationSeconds {
				t.Fatalf("ParseGrants(%q) entry %q=%d out of bounds", s, k, v)
			}
			parts = append(parts, k+"="+strconv.FormatInt(v, 10))
		}
		back, err := ParseGrants(strings.Join(parts, ","))
		if err != nil || !maps.Equal(back, g) {
			t.Fatalf("round trip of %q: %v, %v", s, back, err)
		}
	})
}

package policy

import "testing"

func TestValidMethod(t *testing.T) {
	for m, want := range map[string]bool{
		"GET": true, "PROPFIND": true, "get": true, "M-SEARCH": true, "X_Y~!": true,
		"": false, "TRACE ": false, " GET": false, "GET /admin": false, "HEAD\t": false,
		"G\xc3\xa9T": false, "GET\x00": false, "GET(": false, "GET,PUT": false, "A\"B": false,
	} {
		if got := ValidMethod(m); got != want {
			t.Errorf("ValidMethod(%q) = %v, want %v", m, got, want)
		}
	}
}

func TestCheckRawQueryAndRequestTarget(t *testing.T) {
	for _, q := range []string{"", "a=1&b=%20", "q=%26%3D%zz&&z", "a=b/../c", "x=?y", "~!$&'()*+,;=:@/"} {
		if err := CheckRawQuery(q); err != nil {
			t.Errorf("CheckRawQuery(%q): %v", q, err)
		}
		if err := CheckRequestTarget("/v1/a%20b?" + q); err != nil {
			t.Errorf("CheckRequestTarget(/v1/a%%20b?%s): %v", q, err)
		}
	}
	for _, q := range []string{"a b", "a=1 HTTP/1.1", "a\tb", "a\r\nX: y", "\x00", "a=\x7f", "a=\xc3\xa9", "a#b", "#"} {
		if CheckRawQuery(q) == nil {
			t.Errorf("CheckRawQuery(%q) passed", q)
		}
		if CheckRequestTarget("/x?"+q) == nil {
			t.Errorf("CheckRequestTarget(/x?%q) passed", q)
		}
	}
	for _, target := range []string{"", "x", "http://h/x", "*", "/a b", "/%zz", "/%4", "/x#f"} {
		if CheckRequestTarget(target) == nil {
			t.Errorf("CheckRequestTarget(%q) passed", target)
		}
	}
}

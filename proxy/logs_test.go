package proxy

import (
	"net/http"
	"strings"
	"testing"
)

// Logs never contain bearer tokens, cookies, pairing codes or session
// tokens, whatever path a request takes through the front (at debug level).
func TestLogsCarryNoSecrets(t *testing.T) {
	secrets := []string{"bearer-secret-1", "cookie-secret-2", "query-secret-3", "path-secret-4", "proxy-auth-5"}
	creds := []string{
		"Authorization: Bearer bearer-secret-1",
		"Cookie: s=cookie-secret-2",
		"Proxy-Authorization: Basic proxy-auth-5",
	}
	h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.API = closedURL(t) }))
	h.dash.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Set-Cookie", "sid=cookie-secret-2; Path=/")
		w.WriteHeader(500)
	})
	for _, target := range []string{
		"/api/path-secret-4?token=query-secret-3",         // upstream down: 502
		"/dashboard/path-secret-4?token=query-secret-3",   // upstream 500
		"/api/a%2fpath-secret-4?token=query-secret-3",     // unsafe path: 400
		"/nowhere/path-secret-4?token=query-secret-3",     // 404
		"/relay/ws?token=query-secret-3",                  // non-upgrade: 400
		"http://x/api/path-secret-4?token=query-secret-3", // absolute form: 400
	} {
		h.rawReq("GET", target, creds...)
	}
	h.rawReq("GET", "/api/x?token=query-secret-3", append(creds, "Host: evil.example")...)
	h.rawReq("POST", "/api/path-secret-4?token=query-secret-3", append(creds, "Content-Length: 99999999")...)
	logs := h.logs.String()
	if logs == "" {
		t.Fatal("no log lines captured; nothing was checked")
	}
	for _, s := range secrets {
		if strings.Contains(logs, s) {
			t.Errorf("log contains %q:\n%s", s, logs)
		}
	}
}

package relay

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"testing"
)

func TestHealthBody(t *testing.T) {
	var calls int
	h := NewHealthHandler(func(context.Context) Availability {
		calls++
		return Availability{Relay: true, API: false, Dashboard: true}
	})
	srv := httptest.NewServer(h)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/relay/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("headers %v", resp.Header)
	}
	const want = `{"status":"ok","surface":"hermes_secure_proxy","display_name":"Hermes Secure Link",
	"description":"Pinned TLS access to this host's Relay, API, and Dashboard services","security":"pinned_tls",
	"capabilities":["relay","api","dashboard"],"namespaces":["relay","api","dashboard"],
	"services":{
	 "relay":{"supported":true,"base_path":"/relay","health_path":"/relay/health","websocket_path":"/relay/ws","authentication":"relay_session","available":true},
	 "api":{"supported":true,"base_path":"/api","authentication":"api_bearer","available":false},
	 "dashboard":{"supported":true,"base_path":"/dashboard","authentication":"dashboard_session","available":true}}}`
	var got, exp any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("body\n%s\nwant\n%s", body, want)
	}

	req, _ := http.NewRequest(http.MethodHead, srv.URL+"/relay/health", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(b) != 0 || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("HEAD: %d, %d body bytes", resp.StatusCode, len(b))
	}
	if calls != 2 {
		t.Fatalf("availability consulted %d times, want once per request", calls)
	}

	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodOptions, http.MethodPatch} {
		req, _ := http.NewRequest(m, srv.URL+"/relay/health", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: %d Allow %q", m, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
}

func TestHealthAvailabilityFollowsProbe(t *testing.T) {
	avail := Availability{}
	h := NewHealthHandler(func(context.Context) Availability { return avail })
	get := func() map[string]any {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/relay/health", nil))
		var body struct {
			Services map[string]map[string]any `json:"services"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		out := map[string]any{}
		for k, v := range body.Services {
			out[k] = v["available"]
		}
		return out
	}
	if got := get(); !reflect.DeepEqual(got, map[string]any{"relay": false, "api": false, "dashboard": false}) {
		t.Fatalf("%v", got)
	}
	avail = Availability{API: true}
	if got := get(); !reflect.DeepEqual(got, map[string]any{"relay": false, "api": true, "dashboard": false}) {
		t.Fatalf("%v", got)
	}
}

// discardWriter is a ResponseWriter that keeps one header map and drops
// the body, so a run of the handler allocates only what the handler does.
type discardWriter struct {
	h      http.Header
	status int
	n      int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(code int)        { d.status = code }
func (d *discardWriter) Write(p []byte) (int, error) { d.n += len(p); return len(p), nil }

// Every availability combination gets its own body with the right bits,
// and answering costs no encoding: the eight bodies are built once.
func TestHealthBodiesCachedPerAvailability(t *testing.T) {
	for i := range 8 {
		a := Availability{Relay: i&1 != 0, API: i&2 != 0, Dashboard: i&4 != 0}
		h := NewHealthHandler(func(context.Context) Availability { return a })
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/relay/health", nil))
		var got struct {
			Services map[string]struct {
				Available bool `json:"available"`
			} `json:"services"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("%+v: %v", a, err)
		}
		if got.Services["relay"].Available != a.Relay || got.Services["api"].Available != a.API ||
			got.Services["dashboard"].Available != a.Dashboard {
			t.Fatalf("%+v: body says %+v", a, got.Services)
		}
		if cl := rec.Header().Get("Content-Length"); cl != strconv.Itoa(rec.Body.Len()) {
			t.Fatalf("%+v: Content-Length %s for %d bytes", a, cl, rec.Body.Len())
		}
		w := &discardWriter{h: http.Header{}}
		req := httptest.NewRequest(http.MethodGet, "/relay/health", nil)
		if n := testing.AllocsPerRun(100, func() { h.ServeHTTP(w, req) }); n != 0 {
			t.Fatalf("%+v: %.0f allocations per answer, want none", a, n)
		}
	}
}

package proxy

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"
)

func TestDashboardGateOffIs503(t *testing.T) {
	cases := map[string]http.HandlerFunc{
		"auth_required false":  gateHealth(`{"auth_required":false}`, 200),
		"auth_required absent": gateHealth(`{"status":"ok"}`, 200),
		"auth_required string": gateHealth(`{"auth_required":"true"}`, 200),
		"array body":           gateHealth(`[{"auth_required":true}]`, 200),
		"string body":          gateHealth(`"auth_required"`, 200),
		"malformed json":       gateHealth(`{"auth_required":true`, 200),
		"status 500":           gateHealth(`{"auth_required":true}`, 500),
		"status 204":           gateHealth(``, 204),
		"redirect":             gateHealth(`{"auth_required":true}`, 302),
	}
	for name, health := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.dash.setHealth(health)
			for _, p := range []string{"/dashboard/", "/dashboard/index.html", "/dashboard/api/sessions"} {
				resp, body := h.get(p)
				wantStatus(t, p, resp, http.StatusServiceUnavailable)
				if len(body) > 64 {
					t.Errorf("%s: 503 body is not short: %q", p, body)
				}
			}
			if n := h.dash.hits.Load(); n != 0 {
				t.Fatalf("gate off, yet the Dashboard served %d requests", n)
			}
			if n := h.dash.probes.Load(); n != 1 {
				t.Fatalf("gate-off answer not cached: %d probes", n)
			}
			// The health body reports it, and probing never yields a 500.
			resp, body := h.get("/relay/health")
			wantStatus(t, "health", resp, 200)
			if dashboardAvailable(t, body) {
				t.Fatal("health says the Dashboard is available with the gate off")
			}
		})
	}
}

func TestDashboardDownIs503(t *testing.T) {
	h := newHarness(t, withOptions(func(o *Options) { o.Upstreams.Dashboard = closedURL(t) }))
	resp, _ := h.get("/dashboard/")
	wantStatus(t, "dashboard down", resp, http.StatusServiceUnavailable)
}

func dashboardAvailable(t *testing.T, body []byte) bool {
	t.Helper()
	var hb struct {
		Services map[string]struct {
			Available bool `json:"available"`
		} `json:"services"`
	}
	if err := json.Unmarshal(body, &hb); err != nil {
		t.Fatalf("health body %s: %v", body, err)
	}
	return hb.Services["dashboard"].Available
}

func TestDashboardGateFlipSeenOnlyAfterCacheInterval(t *testing.T) {
	const interval = 2 * time.Second
	h := newHarness(t, withLimits(func(l *Limits) { l.ProbeInterval = interval }))
	h.dash.setHealth(gateHealth(`{"auth_required":false}`, 200))
	first := time.Now()
	resp, _ := h.get("/dashboard/")
	wantStatus(t, "gate off", resp, 503)

	h.dash.setHealth(gateHealth(`{"auth_required":true}`, 200))
	resp, _ = h.get("/dashboard/")
	if time.Since(first) < interval {
		// Still within the interval of the first probe: the cached "off"
		// answer must hold, and no second probe may have been sent.
		wantStatus(t, "gate flipped on within the cache interval", resp, 503)
		if n := h.dash.probes.Load(); n != 1 {
			t.Fatalf("%d probes within one interval", n)
		}
	}
	var on time.Time
	waitFor(t, "the gate flip to be seen", func() bool {
		resp, _ := h.get("/dashboard/")
		if resp.StatusCode == 200 {
			on = time.Now()
			return true
		}
		return false
	})
	if on.Sub(first) < interval {
		t.Fatalf("gate flip seen after %v, before the %v cache interval", on.Sub(first), interval)
	}
	if h.dash.hits.Load() != 1 {
		t.Fatalf("dashboard served %d requests, want only the one after the flip", h.dash.hits.Load())
	}
}

func TestDashboardGateOneProbePerIntervalUnderConcurrency(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	h.dash.setHealth(func(w http.ResponseWriter, r *http.Request) {
		<-release // hold the first probe so every request queues behind it
		gateHealth(`{"auth_required":true}`, 200)(w, r)
	})
	cl := h.client()
	var wg sync.WaitGroup
	codes := make(chan int, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := cl.Get(h.url("/dashboard/x"))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	waitFor(t, "the first probe", func() bool { return h.dash.probes.Load() >= 1 })
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Errorf("status %d", c)
		}
	}
	if n := h.dash.probes.Load(); n != 1 {
		t.Fatalf("%d Dashboard probes for 50 concurrent requests, want 1", n)
	}
}

func TestRelayHealthProbesCoalesced(t *testing.T) {
	h := newHarness(t)
	tr := &http.Transport{TLSClientConfig: h.tlsConfig(), MaxIdleConnsPerHost: 200}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: testTimeout}
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := 0
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := cl.Get(h.url("/relay/health"))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				mu.Lock()
				bad++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if bad != 0 {
		t.Fatalf("%d health requests failed", bad)
	}
	if r, a, d := h.relay.Probes.Load(), h.api.probes.Load(), h.dash.probes.Load(); r != 1 || a != 1 || d != 1 {
		t.Fatalf("probes for 200 concurrent health requests: relay %d api %d dashboard %d, want 1 each", r, a, d)
	}
	resp, body := h.get("/relay/health")
	wantStatus(t, "health", resp, 200)
	var hb struct {
		Status   string `json:"status"`
		Services map[string]struct {
			Available bool `json:"available"`
		} `json:"services"`
	}
	if err := json.Unmarshal(body, &hb); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"relay", "api", "dashboard"} {
		if !hb.Services[ns].Available {
			t.Errorf("%s reported unavailable: %s", ns, body)
		}
	}
}

func TestHealthReportsDownUpstreamsWithout500(t *testing.T) {
	h := newHarness(t, withOptions(func(o *Options) {
		o.Upstreams.API = closedURL(t)
		o.Upstreams.Relay = closedURL(t)
	}))
	resp, body := h.get("/relay/health")
	wantStatus(t, "health with upstreams down", resp, 200)
	var hb struct {
		Status   string `json:"status"`
		Services map[string]struct {
			Available bool `json:"available"`
		} `json:"services"`
	}
	if err := json.Unmarshal(body, &hb); err != nil {
		t.Fatal(err)
	}
	if hb.Status != "ok" || hb.Services["relay"].Available || hb.Services["api"].Available || !hb.Services["dashboard"].Available {
		t.Fatalf("health body %s", body)
	}
}

func TestDashboardGateProbeTimeoutIs503(t *testing.T) {
	h := newHarness(t, withLimits(func(l *Limits) { l.ProbeTimeout = 300 * time.Millisecond }))
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	h.dash.setHealth(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	})
	resp, _ := h.get("/dashboard/")
	wantStatus(t, "gate probe timed out", resp, http.StatusServiceUnavailable)
	if h.dash.hits.Load() != 0 {
		t.Fatal("the Dashboard served a request with its gate unknown")
	}
}

package proxy

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hermes-securelink/securelink/internal/metrics"
)

// scrape serves the registry on a real loopback listener and reads it as
// Prometheus would.
func scrape(t *testing.T, m *metrics.Front) string {
	t.Helper()
	l, err := metrics.Listen("127.0.0.1:0", m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	go l.Serve()
	defer l.Shutdown(t.Context())
	resp, err := http.Get("http://" + l.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// value reads one series' value from a scrape, 0 when absent.
func value(t *testing.T, text, series string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` ([0-9.e+-]+)$`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestMetricsCountTrafficWithoutSecrets(t *testing.T) {
	m := metrics.NewFront()
	h := newHarness(t, withOptions(func(o *Options) { o.Metrics = m }))
	h.srv.RegisterMetrics(m)

	const secretPath = "/api/v1/secret-path-xyz?token=querytoken123"
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("POST", h.url(secretPath), strings.NewReader("hello body"))
		req.Header.Set("Authorization", "Bearer bearer-secret-abc")
		req.Header.Set("Cookie", "session=cookie-secret-def")
		resp, _ := h.do(req)
		if resp.StatusCode != 200 {
			t.Fatalf("api status %d", resp.StatusCode)
		}
	}
	if resp, _ := h.get("/nope"); resp.StatusCode != 404 {
		t.Fatalf("404 expected, got %d", resp.StatusCode)
	}
	if resp, _ := h.get("/relay/health"); resp.StatusCode != 200 {
		t.Fatalf("health %d", resp.StatusCode)
	}
	// A handshake naming an unknown server is counted by reason.
	if c, err := h.dialTLS(h.tlsConfigFor("unknown.example", h.id.Pin)); err == nil {
		c.Close()
		t.Fatal("unknown SNI accepted")
	}

	text := scrape(t, m)
	checks := map[string]float64{
		`securelink_requests_total{code="2xx",ns="api"}`:                3,
		`securelink_requests_total{code="4xx",ns="none"}`:               1,
		`securelink_requests_total{code="2xx",ns="relay"}`:              1,
		`securelink_bytes_total{direction="in",ns="api"}`:               3 * float64(len("hello body")),
		`securelink_upstream_latency_seconds_count{ns="api"}`:           3,
		`securelink_tls_handshake_failures_total{reason="unknown_sni"}`: 1,
		`securelink_probes_total{target="api"}`:                         1,
		`securelink_upstream_available{target="relay"}`:                 1,
		`securelink_websockets_active{ns="relay"}`:                      0,
	}
	for series, want := range checks {
		if got := value(t, text, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if value(t, text, `securelink_bytes_total{direction="out",ns="api"}`) <= 0 {
		t.Error("no bytes out counted for /api")
	}
	for _, secret := range []string{"secret-path-xyz", "querytoken123", "bearer-secret-abc", "cookie-secret-def", "127.0.0.1", "/api/v1", h.api.port()} {
		if strings.Contains(text, secret) {
			t.Errorf("scrape contains %q", secret)
		}
	}
}

func TestMetricsListenerRefusesNonLoopback(t *testing.T) {
	if _, err := metrics.Listen("0.0.0.0:0", metrics.NewFront().Registry()); err == nil {
		t.Fatal("metrics listener accepted a non-loopback address")
	}
}

package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/internal/metrics"
)

// The soak reads the daemons' own metrics listener: the series it needs
// must be what metrics.NewFront registers.
func TestScrapeReadsTheDaemonsProcessSeries(t *testing.T) {
	m := metrics.NewFront()
	l, err := metrics.Listen("127.0.0.1:0", m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	go l.Serve()
	t.Cleanup(func() { l.Shutdown(context.Background()) })
	s, err := scrape(context.Background(), l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if s.rss < 1<<20 || s.fds < 3 || s.goroutines < 2 {
		t.Fatalf("implausible sample %+v", s)
	}
}

func samples(rss ...float64) []daemonSample {
	out := make([]daemonSample, len(rss))
	for i, r := range rss {
		out[i] = daemonSample{rss: r * (1 << 20), fds: 100, goroutines: 200}
	}
	return out
}

func TestGrowthRule(t *testing.T) {
	rss := soakRules[0]
	for _, tc := range []struct {
		name string
		mib  []float64
		ok   bool
	}{
		{"flat", []float64{30, 31, 30, 29, 30, 31, 30, 30}, true},
		{"one spike at the end is a spike", []float64{30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 90}, true},
		{"within pct+slack", []float64{30, 30, 30, 35, 40, 45, 53, 53}, true},
		{"leak", []float64{30, 40, 50, 60, 70, 80, 90, 100}, false},
	} {
		warm, last, limit, ok := rss.verdict(samples(tc.mib...))
		if ok != tc.ok {
			t.Errorf("%s: warm-up %.0f, last %.0f, limit %.0f MiB: ok=%v, want %v", tc.name, warm/(1<<20), last/(1<<20), limit/(1<<20), ok, tc.ok)
		}
	}
}

// The fake upstream's event stream, read by the soak's SSE client through
// a real HTTP server: events arrive numbered in order and are counted.
func TestSSESessionCountsOrderedEvents(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(serveSSE))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	if err := loopbackOnly(u.Host); err != nil {
		t.Fatal(err)
	}
	st := newSoakStats()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sseSession(srv.Client(), srv.URL, st)(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for st.sseEvents.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("session: %v", err)
	}
	if n := st.sseEvents.Load(); n < 3 {
		t.Fatalf("%d events counted", n)
	}
}

// Package metrics exposes the front's counters in the Prometheus text format
// on a loopback-only listener.
//
// Every label has a small fixed set of values (namespace, status class,
// direction, reason, target): no label may carry a path, a token, a cookie or
// an address, so a scrape can be shared without leaking anything and the
// series count stays bounded whatever clients send.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hermes-securelink/securelink/internal/loopback"
)

// Front holds the front's metrics. A nil *Front is valid and records nothing,
// so callers need no "metrics enabled" checks.
type Front struct {
	reg              *prometheus.Registry
	requests         *prometheus.CounterVec
	bytes            *prometheus.CounterVec
	upstreamLatency  *prometheus.HistogramVec
	handshakeFailure *prometheus.CounterVec
}

// Handshake failure reasons (the label's whole value set).
const (
	ReasonUnknownSNI = "unknown_sni"
	ReasonProtocol   = "protocol"
	ReasonTimeout    = "timeout"
	ReasonOther      = "other"
)

// NewFront creates the registry with the process collectors and the front's
// own series.
func NewFront() *Front {
	f := &Front{reg: prometheus.NewRegistry()}
	f.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "securelink_requests_total", Help: "Requests answered, by namespace and status class.",
	}, []string{"ns", "code"})
	f.bytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "securelink_bytes_total", Help: "Body bytes through the front (in: from clients, out: to clients); upgraded connections excluded.",
	}, []string{"ns", "direction"})
	f.upstreamLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "securelink_upstream_latency_seconds", Help: "Time from forwarding a request to the upstream's response headers.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"ns"})
	f.handshakeFailure = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "securelink_tls_handshake_failures_total", Help: "TLS handshakes that failed, by reason.",
	}, []string{"reason"})
	f.reg.MustRegister(f.requests, f.bytes, f.upstreamLatency, f.handshakeFailure)
	for _, r := range []string{ReasonUnknownSNI, ReasonProtocol, ReasonTimeout, ReasonOther} {
		f.handshakeFailure.WithLabelValues(r)
	}
	return f
}

// Registry is where other parts (probes, Reach, the broker) add their series.
func (f *Front) Registry() *prometheus.Registry {
	if f == nil {
		return nil
	}
	return f.reg
}

// statusClass maps a status code to "1xx".."5xx".
func statusClass(code int) string {
	if code < 100 || code > 599 {
		return "other"
	}
	return strconv.Itoa(code/100) + "xx"
}

// Request records one answered request.
func (f *Front) Request(ns string, status int, in, out int64) {
	if f == nil {
		return
	}
	f.requests.WithLabelValues(ns, statusClass(status)).Inc()
	if in > 0 {
		f.bytes.WithLabelValues(ns, "in").Add(float64(in))
	}
	if out > 0 {
		f.bytes.WithLabelValues(ns, "out").Add(float64(out))
	}
}

// UpstreamLatency records the wait for an upstream's response headers.
func (f *Front) UpstreamLatency(ns string, d time.Duration) {
	if f == nil {
		return
	}
	f.upstreamLatency.WithLabelValues(ns).Observe(d.Seconds())
}

// HandshakeFailure counts a failed TLS handshake; reason is one of the Reason constants.
func (f *Front) HandshakeFailure(reason string) {
	if f == nil {
		return
	}
	f.handshakeFailure.WithLabelValues(reason).Inc()
}

// Register adds a collector (e.g. BrokerCollector) to the registry.
func (f *Front) Register(c prometheus.Collector) {
	if f == nil {
		return
	}
	f.reg.MustRegister(c)
}

// BrokerStats is what the broker reports at scrape time. Counts keys are
// "kind:outcome" strings from a fixed set in the broker's code (refusals by
// error code, stream ends, drops), never anything a peer chose.
type BrokerStats struct {
	HostsOnline, ActiveStreams int
	QueuedBytes                int64
	Counts                     map[string]int64
}

type brokerCollector struct {
	stats                  func() BrokerStats
	hosts, streams, queued *prometheus.Desc
	events                 *prometheus.Desc
}

// BrokerCollector exposes a broker's state: hosts online, active streams,
// queued bytes and counted outcomes (refusals by error code and the like).
func BrokerCollector(stats func() BrokerStats) prometheus.Collector {
	return &brokerCollector{
		stats:   stats,
		hosts:   prometheus.NewDesc("securelink_broker_hosts_online", "Hosts registered with the broker.", nil, nil),
		streams: prometheus.NewDesc("securelink_broker_streams_active", "Client streams being relayed.", nil, nil),
		queued:  prometheus.NewDesc("securelink_broker_queued_bytes", "Bytes held in the broker's queues.", nil, nil),
		events:  prometheus.NewDesc("securelink_broker_events_total", "Counted outcomes: refusals by error code, stream ends, drops.", []string{"kind", "outcome"}, nil),
	}
}

func (c *brokerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.hosts
	ch <- c.streams
	ch <- c.queued
	ch <- c.events
}

func (c *brokerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ch <- prometheus.MustNewConstMetric(c.hosts, prometheus.GaugeValue, float64(s.HostsOnline))
	ch <- prometheus.MustNewConstMetric(c.streams, prometheus.GaugeValue, float64(s.ActiveStreams))
	ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(s.QueuedBytes))
	for k, v := range s.Counts {
		kind, outcome, ok := strings.Cut(k, ":")
		if !ok {
			kind, outcome = k, ""
		}
		ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(v), kind, outcome)
	}
}

// GaugeFunc registers a gauge computed at scrape time (open WebSockets,
// availability, Reach state). Labels must be fixed, low-cardinality values.
func (f *Front) GaugeFunc(name, help string, labels prometheus.Labels, fn func() float64) {
	if f == nil {
		return
	}
	f.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, fn))
}

// CounterFunc registers a counter read at scrape time from another component.
func (f *Front) CounterFunc(name, help string, labels prometheus.Labels, fn func() float64) {
	if f == nil {
		return
	}
	f.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, fn))
}

// Listener serves /metrics. It refuses non-loopback addresses: the scrape
// shows traffic patterns that are nobody else's business.
type Listener struct {
	srv *http.Server
	ln  net.Listener
}

// Listen binds addr (loopback only) for reg.
func Listen(addr string, reg *prometheus.Registry) (*Listener, error) {
	if err := loopback.CheckListen(addr); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{MaxRequestsInFlight: 4, Timeout: 10 * time.Second}))
	return &Listener{ln: ln, srv: &http.Server{
		Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 16 << 10,
	}}, nil
}

// Addr is the bound address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Serve serves until Shutdown.
func (l *Listener) Serve() error {
	if err := l.srv.Serve(l.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops the listener.
func (l *Listener) Shutdown(ctx context.Context) error { return l.srv.Shutdown(ctx) }

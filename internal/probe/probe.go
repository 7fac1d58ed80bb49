// Package probe answers "is this upstream available?" for the front's three
// namespaces without letting public traffic multiply loopback requests: each
// answer, success or failure, is reused for an interval, and concurrent
// callers share one in-flight probe. The Dashboard answer is the login gate:
// the Dashboard namespace is only served while the Dashboard itself says it
// requires authentication, so a Dashboard in loopback-token mode is never
// exposed (fail closed).
package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Target names one probed upstream.
type Target int

const (
	Relay Target = iota
	API
	Dashboard
	numTargets
)

// String is the namespace name used as the "ns" log key.
func (t Target) String() string {
	switch t {
	case Relay:
		return "relay"
	case API:
		return "api"
	case Dashboard:
		return "dashboard"
	default:
		return "unknown"
	}
}

// Defaults of Options, from the contract's "Availability probes".
const (
	DefaultInterval = 15 * time.Second
	DefaultTimeout  = 3 * time.Second
	DefaultMaxBody  = 64 << 10
)

// Options configure a Prober. Zero fields take the defaults.
type Options struct {
	// Interval is how long one result, success or failure, is reused before
	// the next caller triggers a new probe. Default 15 s.
	Interval time.Duration
	// Timeout bounds one probe: connect, headers and body. Default 3 s.
	Timeout time.Duration
	// MaxBody is the most bytes of a Dashboard health body read; a longer
	// body is "gate off". Default 64 KiB, at most 1 MiB.
	MaxBody int64
	// Client sends the probes. Default: a client that never uses a proxy
	// (the environment's HTTP_PROXY must not see loopback traffic) and never
	// follows redirects. A supplied Client is copied and its CheckRedirect
	// replaced; its Transport must not use a proxy either.
	Client *http.Client
	// Now is the clock for the cache. Default time.Now.
	Now func() time.Time
	// Log receives availability changes (key "ns"). Default: no logging.
	Log zerolog.Logger
}

// Validate reports options that cannot work. Zero values are valid (they
// mean "default").
func (o Options) Validate() error {
	switch {
	case o.Interval < 0:
		return errors.New("probe interval must not be negative")
	case o.Timeout < 0:
		return errors.New("probe timeout must not be negative")
	case o.MaxBody < 0 || o.MaxBody > 1<<20:
		return fmt.Errorf("probe max body %d out of range (0..1 MiB)", o.MaxBody)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxBody == 0 {
		o.MaxBody = DefaultMaxBody
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Prober probes the three upstreams on demand and caches the answers. All
// methods are safe for concurrent use.
type Prober struct {
	o      Options
	client *http.Client
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	gen     uint64 // bumped by SetTargets; results of older flights are not stored
	targets [numTargets]*url.URL
	states  [numTargets]state

	counts  [numTargets]atomic.Uint64
	waiting atomic.Int64 // callers currently waiting on a flight (for tests)
}

type state struct {
	valid  bool
	ok     bool
	at     time.Time
	flight *flight
	logged bool // a result was logged, so later logs are changes only
}

// flight is one in-flight probe shared by every caller that arrives while it
// runs. ok is written before done is closed.
type flight struct {
	done chan struct{}
	ok   bool
}

// New returns a Prober with no targets (everything unavailable until
// SetTargets). It panics if o fails Validate: options come from code and the
// validated configuration, so an invalid value is a programming error.
func New(o Options) *Prober {
	if err := o.Validate(); err != nil {
		panic("probe.New: " + err.Error())
	}
	o = o.withDefaults()
	p := &Prober{o: o}
	if o.Client != nil {
		c := *o.Client
		p.client = &c
	} else {
		p.client = &http.Client{Transport: &http.Transport{
			Proxy:                  nil,
			DialContext:            (&net.Dialer{Timeout: o.Timeout}).DialContext,
			ResponseHeaderTimeout:  o.Timeout,
			MaxIdleConns:           int(numTargets),
			MaxIdleConnsPerHost:    1,
			IdleConnTimeout:        2 * o.Interval,
			MaxResponseHeaderBytes: 64 << 10,
			DisableCompression:     true,
		}}
	}
	p.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	p.base, p.cancel = context.WithCancel(context.Background())
	return p
}

// SetTargets sets or replaces the upstream base URLs (nil: not configured,
// always unavailable) and forgets every cached answer, so a reload is
// reflected by the next call. A probe still in flight for an old target
// answers its own waiters but is not cached.
func (p *Prober) SetTargets(relay, api, dashboard *url.URL) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	for i, u := range []*url.URL{relay, api, dashboard} {
		if u != nil {
			c := *u
			u = &c
		}
		p.targets[i] = u
		p.states[i] = state{}
	}
}

// Relay reports whether GET <relay>/health answered 2xx.
func (p *Prober) Relay(ctx context.Context) bool { return p.Available(ctx, Relay) }

// API reports whether GET <api>/health answered 2xx.
func (p *Prober) API(ctx context.Context) bool { return p.Available(ctx, API) }

// Dashboard reports whether the Dashboard's login gate is on: GET
// <dashboard>/api/health answered 200 with a JSON object whose
// "auth_required" is exactly true. Anything else is false.
func (p *Prober) Dashboard(ctx context.Context) bool { return p.Available(ctx, Dashboard) }

// Available answers for one target from the cache, or from a shared probe. A
// caller whose ctx ends first gets false; the probe itself runs on its own
// context (bounded by Options.Timeout) and still answers the other callers.
func (p *Prober) Available(ctx context.Context, t Target) bool {
	if t < 0 || t >= numTargets {
		return false
	}
	ok, fl := p.start(t)
	if fl == nil {
		return ok
	}
	return p.wait(ctx, fl)
}

// All answers for the three targets, probing them in parallel so the health
// body waits for at most one probe timeout.
func (p *Prober) All(ctx context.Context) (relay, api, dashboard bool) {
	var out [numTargets]bool
	var fls [numTargets]*flight
	for t := range numTargets {
		out[t], fls[t] = p.start(t)
	}
	for t := range numTargets {
		if fls[t] != nil {
			out[t] = p.wait(ctx, fls[t])
		}
	}
	return out[Relay], out[API], out[Dashboard]
}

// Count returns how many probe requests were sent to t, for tests and
// metrics.
func (p *Prober) Count(t Target) uint64 {
	if t < 0 || t >= numTargets {
		return 0
	}
	return p.counts[t].Load()
}

// Close cancels probes in flight (their waiters get false) and waits for
// them to finish. Later calls answer false without probing.
func (p *Prober) Close() {
	p.cancel()
	p.wg.Wait()
}

// start returns a cached answer, or the flight to wait for (starting one if
// none is running).
func (p *Prober) start(t Target) (bool, *flight) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := &p.states[t]
	target := p.targets[t]
	if target == nil || p.base.Err() != nil {
		return false, nil
	}
	if st.valid {
		if age := p.o.Now().Sub(st.at); age >= 0 && age < p.o.Interval {
			return st.ok, nil
		}
	}
	if st.flight != nil {
		return false, st.flight
	}
	fl := &flight{done: make(chan struct{})}
	st.flight = fl
	p.wg.Add(1)
	go p.run(t, target, p.gen, fl)
	return false, fl
}

func (p *Prober) wait(ctx context.Context, fl *flight) bool {
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	select {
	case <-fl.done:
		return fl.ok
	case <-ctx.Done():
		return false
	}
}

func (p *Prober) run(t Target, target *url.URL, gen uint64, fl *flight) {
	defer p.wg.Done()
	ok, reason := p.probeSafely(t, target)
	p.mu.Lock()
	fl.ok = ok
	if p.gen == gen {
		st := &p.states[t]
		changed := !st.logged || st.ok != ok
		st.valid, st.ok, st.at, st.flight, st.logged = true, ok, p.o.Now(), nil, true
		if changed {
			if ok {
				p.o.Log.Info().Str("ns", t.String()).Msg("upstream available")
			} else {
				p.o.Log.Warn().Str("ns", t.String()).Str("reason", reason).Msg("upstream unavailable")
			}
		}
	}
	p.mu.Unlock()
	close(fl.done)
}

// probeSafely turns a panic in a supplied Client into "unavailable": a probe
// runs on its own goroutine, where a panic would take the whole front down.
func (p *Prober) probeSafely(t Target, target *url.URL) (ok bool, reason string) {
	defer func() {
		if r := recover(); r != nil {
			ok, reason = false, "probe panicked"
		}
	}()
	return p.probe(t, target)
}

func (p *Prober) probe(t Target, target *url.URL) (bool, string) {
	ctx, cancel := context.WithTimeout(p.base, p.o.Timeout)
	defer cancel()
	path := "/health"
	if t == Dashboard {
		path = "/api/health"
	}
	u := url.URL{Scheme: target.Scheme, Host: target.Host, Path: strings.TrimSuffix(target.Path, "/") + path}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false, "bad target URL"
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "hermes-securelink-probe")
	p.counts[t].Add(1)
	res, err := p.client.Do(req)
	if err != nil {
		return false, reasonOf(err)
	}
	defer res.Body.Close()
	if t != Dashboard {
		// Drain a bounded amount so the connection can be reused; the
		// Relay's and API's health bodies carry nothing we judge.
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, p.o.MaxBody))
		if res.StatusCode < 200 || res.StatusCode > 299 {
			return false, fmt.Sprintf("status %d", res.StatusCode)
		}
		return true, ""
	}
	if res.StatusCode != http.StatusOK {
		return false, fmt.Sprintf("status %d", res.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, p.o.MaxBody+1))
	switch {
	case err != nil:
		return false, reasonOf(err)
	case int64(len(body)) > p.o.MaxBody:
		return false, "health body too large"
	}
	if !GateOn(body) {
		return false, "dashboard login gate is not on"
	}
	return true, ""
}

// GateOn reports whether a Dashboard /api/health body is a JSON object whose
// "auth_required" member is the literal true. Keys match exactly (not
// case-insensitively, as a Go struct would), a repeated key counts by its
// last value, and anything that is not one complete JSON object is false.
func GateOn(body []byte) bool {
	b := bytes.Trim(body, " \t\r\n")
	if len(b) == 0 || b[0] != '{' {
		return false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return false
	}
	return string(m["auth_required"]) == "true"
}

// reasonOf keeps log reasons short and free of anything but the failure
// kind; the target URL is configuration and carries no secret, but the
// reason is logged on every availability change.
func reasonOf(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	default:
		var oe *net.OpError
		if errors.As(err, &oe) {
			return oe.Op + " failed"
		}
		return "request failed"
	}
}

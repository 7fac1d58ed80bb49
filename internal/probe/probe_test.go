package probe

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// clock is an injectable time source the tests advance by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// upstream is a real loopback HTTP server that counts requests per path.
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	counts map[string]int
}

func newUpstream(t *testing.T, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{counts: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.counts[r.URL.Path]++
		u.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[path]
}

func (u *upstream) url(t *testing.T) *url.URL {
	t.Helper()
	p, err := url.Parse(u.URL)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newProber(t *testing.T, o Options) *Prober {
	t.Helper()
	o.Log = zerolog.New(zerolog.NewTestWriter(t))
	p := New(o)
	t.Cleanup(p.Close)
	return p
}

func reply(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

func TestDashboardGate(t *testing.T) {
	huge := `{"auth_required":true,"pad":"` + strings.Repeat("x", 70<<10) + `"}`
	tests := []struct {
		name   string
		status int
		body   string
		want   bool
	}{
		{"on", 200, `{"auth_required":true}`, true},
		{"on with other fields", 200, `{"status":"ok","auth_required":true,"v":[1,2]}`, true},
		{"on with whitespace", 200, " \n{ \"auth_required\" : true }\r\n", true},
		{"off", 200, `{"auth_required":false}`, false},
		{"missing", 200, `{"status":"ok"}`, false},
		{"empty object", 200, `{}`, false},
		{"string true", 200, `{"auth_required":"true"}`, false},
		{"number", 200, `{"auth_required":1}`, false},
		{"null member", 200, `{"auth_required":null}`, false},
		{"wrong case key", 200, `{"AUTH_REQUIRED":true}`, false},
		{"last duplicate wins", 200, `{"auth_required":true,"auth_required":false}`, false},
		{"array", 200, `[]`, false},
		{"array of object", 200, `[{"auth_required":true}]`, false},
		{"string", 200, `"x"`, false},
		{"null", 200, `null`, false},
		{"bare true", 200, `true`, false},
		{"empty body", 200, ``, false},
		{"malformed", 200, `{"auth_required":tr`, false},
		{"trailing garbage", 200, `{"auth_required":true} x`, false},
		{"two objects", 200, `{"auth_required":true}{}`, false},
		{"huge body", 200, huge, false},
		{"status 201", 201, `{"auth_required":true}`, false},
		{"status 204", 204, ``, false},
		{"status 401", 401, `{"auth_required":true}`, false},
		{"status 500", 500, `{"auth_required":true}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, reply(tt.status, tt.body))
			p := newProber(t, Options{})
			p.SetTargets(nil, nil, up.url(t))
			if got := p.Dashboard(context.Background()); got != tt.want {
				t.Fatalf("Dashboard() = %v, want %v", got, tt.want)
			}
			if up.count("/api/health") != 1 {
				t.Fatalf("upstream saw %d probes of /api/health", up.count("/api/health"))
			}
		})
	}
}

func TestRelayAndAPIHealth(t *testing.T) {
	tests := []struct {
		status int
		want   bool
	}{
		{200, true}, {204, true}, {299, true},
		{301, false}, {302, false}, {404, false}, {500, false}, {503, false},
	}
	for _, tt := range tests {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/health" || r.Method != http.MethodGet {
				w.WriteHeader(http.StatusTeapot)
				return
			}
			if tt.status == 302 || tt.status == 301 {
				w.Header().Set("Location", "/elsewhere")
			}
			w.WriteHeader(tt.status)
		})
		p := newProber(t, Options{})
		p.SetTargets(up.url(t), up.url(t), nil)
		if got := p.Relay(context.Background()); got != tt.want {
			t.Errorf("status %d: Relay() = %v", tt.status, got)
		}
		if got := p.API(context.Background()); got != tt.want {
			t.Errorf("status %d: API() = %v", tt.status, got)
		}
		if up.count("/health") != 2 {
			t.Errorf("status %d: %d probes of /health, want 2", tt.status, up.count("/health"))
		}
	}
}

func TestProbeKeepsUpstreamBasePath(t *testing.T) {
	up := newUpstream(t, reply(200, `{"auth_required":true}`))
	base := up.url(t)
	base.Path = "/base/"
	p := newProber(t, Options{})
	p.SetTargets(base, base, base)
	relay, api, dash := p.All(context.Background())
	if !relay || !api || !dash {
		t.Fatalf("All() = %v %v %v", relay, api, dash)
	}
	if up.count("/base/health") != 2 || up.count("/base/api/health") != 1 {
		t.Fatalf("paths probed: %v", up.counts)
	}
}

func TestProbeDoesNotFollowRedirects(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health", "/api/health":
			http.Redirect(w, r, "/ok", http.StatusFound)
		default:
			reply(200, `{"auth_required":true}`)(w, r)
		}
	})
	p := newProber(t, Options{})
	p.SetTargets(up.url(t), up.url(t), up.url(t))
	relay, api, dash := p.All(context.Background())
	if relay || api || dash {
		t.Fatalf("a redirect counted as available: %v %v %v", relay, api, dash)
	}
	if up.count("/ok") != 0 {
		t.Fatalf("redirect followed %d times", up.count("/ok"))
	}
}

func TestDefaultClientUsesNoProxy(t *testing.T) {
	p := newProber(t, Options{})
	tr, ok := p.client.Transport.(*http.Transport)
	if !ok {
		t.Fatalf("transport is %T", p.client.Transport)
	}
	if tr.Proxy != nil {
		t.Fatal("default probe transport consults a proxy")
	}
	if tr.MaxResponseHeaderBytes <= 0 {
		t.Fatal("response headers unbounded")
	}
}

func TestProbeTimeoutIsUnavailable(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	slowHeaders := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	slowBody := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		_, _ = w.Write([]byte(`{"auth_required":`))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	for name, up := range map[string]*upstream{"headers": slowHeaders, "body": slowBody} {
		p := newProber(t, Options{Timeout: 100 * time.Millisecond})
		p.SetTargets(up.url(t), up.url(t), up.url(t))
		relay, api, dash := p.All(context.Background())
		if dash || (name == "headers" && (relay || api)) {
			t.Errorf("slow %s: All() = %v %v %v", name, relay, api, dash)
		}
		if p.Count(Dashboard) != 1 {
			t.Errorf("slow %s: %d dashboard probes", name, p.Count(Dashboard))
		}
	}
}

func TestProbeDownIsUnavailable(t *testing.T) {
	up := newUpstream(t, reply(200, `{"auth_required":true}`))
	u := up.url(t)
	up.Close()
	p := newProber(t, Options{})
	p.SetTargets(u, u, u)
	relay, api, dash := p.All(context.Background())
	if relay || api || dash {
		t.Fatalf("closed upstream available: %v %v %v", relay, api, dash)
	}
}

func TestNoTargetsAreUnavailable(t *testing.T) {
	p := newProber(t, Options{})
	if p.Relay(context.Background()) || p.API(context.Background()) || p.Dashboard(context.Background()) {
		t.Fatal("available before SetTargets")
	}
	p.SetTargets(nil, nil, nil)
	if relay, api, dash := p.All(context.Background()); relay || api || dash {
		t.Fatal("nil targets available")
	}
	if p.Available(context.Background(), Target(7)) || p.Count(Target(-1)) != 0 {
		t.Fatal("unknown target")
	}
	for _, tg := range []Target{Relay, API, Dashboard} {
		if p.Count(tg) != 0 {
			t.Fatalf("%v probed without a target", tg)
		}
	}
}

// Every caller that arrives while a probe is in flight shares it: 200
// callers per target, all waiting before the upstream answers, make exactly
// one upstream request per target. The clock jumps an hour per reading so
// the cache alone could not explain the count.
func TestConcurrentCallersShareOneProbe(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		reply(200, `{"auth_required":true}`)(w, r)
	})
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	jumpy := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Hour)
		return now
	}
	p := newProber(t, Options{Now: jumpy, Timeout: time.Minute})
	p.SetTargets(up.url(t), up.url(t), up.url(t))

	const callers = 200
	var wg sync.WaitGroup
	var trues atomic.Int64
	for i := 0; i < callers; i++ {
		for _, tg := range []Target{Relay, API, Dashboard} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if p.Available(context.Background(), tg) {
					trues.Add(1)
				}
			}()
		}
	}
	waitFor(t, func() bool { return p.waiting.Load() == 3*callers })
	releaseOnce.Do(func() { close(release) })
	wg.Wait()
	if trues.Load() != 3*callers {
		t.Fatalf("%d of %d callers saw available", trues.Load(), 3*callers)
	}
	if up.count("/health") != 2 || up.count("/api/health") != 1 {
		t.Fatalf("upstream requests: %v, want /health 2 (relay+api) and /api/health 1", up.counts)
	}
	for _, tg := range []Target{Relay, API, Dashboard} {
		if p.Count(tg) != 1 {
			t.Fatalf("%v: %d probes", tg, p.Count(tg))
		}
	}
}

// Within one interval, a cached answer serves everyone; many sequential and
// concurrent callers make one request per target.
func TestCachedWithinInterval(t *testing.T) {
	up := newUpstream(t, reply(200, `{"auth_required":true}`))
	clk := newClock()
	p := newProber(t, Options{Now: clk.Now})
	p.SetTargets(up.url(t), up.url(t), up.url(t))
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.All(context.Background())
		}()
	}
	wg.Wait()
	for i := 0; i < 50; i++ {
		clk.Advance(100 * time.Millisecond)
		p.All(context.Background())
	}
	if up.count("/health") != 2 || up.count("/api/health") != 1 {
		t.Fatalf("upstream requests: %v", up.counts)
	}
}

func TestFlipSeenOnlyAfterInterval(t *testing.T) {
	var gate atomic.Bool
	gate.Store(true)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if gate.Load() {
			reply(200, `{"auth_required":true}`)(w, r)
		} else {
			reply(200, `{"auth_required":false}`)(w, r)
		}
	})
	clk := newClock()
	p := newProber(t, Options{Now: clk.Now, Interval: 15 * time.Second})
	p.SetTargets(nil, nil, up.url(t))
	ctx := context.Background()
	if !p.Dashboard(ctx) {
		t.Fatal("gate on not seen")
	}
	gate.Store(false)
	clk.Advance(14*time.Second + 999*time.Millisecond)
	if !p.Dashboard(ctx) {
		t.Fatal("flip seen before the interval ended")
	}
	if up.count("/api/health") != 1 {
		t.Fatalf("re-probed within the interval: %d", up.count("/api/health"))
	}
	clk.Advance(time.Millisecond)
	if p.Dashboard(ctx) {
		t.Fatal("flip not seen after the interval")
	}
	gate.Store(true)
	clk.Advance(time.Second)
	if p.Dashboard(ctx) {
		t.Fatal("gate off not cached")
	}
	if up.count("/api/health") != 2 {
		t.Fatalf("probes: %d, want 2", up.count("/api/health"))
	}
}

func TestFailuresAreCached(t *testing.T) {
	up := newUpstream(t, reply(500, `{"auth_required":true}`))
	clk := newClock()
	p := newProber(t, Options{Now: clk.Now})
	p.SetTargets(up.url(t), up.url(t), up.url(t))
	for i := 0; i < 100; i++ {
		if relay, api, dash := p.All(context.Background()); relay || api || dash {
			t.Fatal("500 counted as available")
		}
	}
	if up.count("/health") != 2 || up.count("/api/health") != 1 {
		t.Fatalf("failures re-probed: %v", up.counts)
	}
	clk.Advance(DefaultInterval)
	p.All(context.Background())
	if up.count("/health") != 4 || up.count("/api/health") != 2 {
		t.Fatalf("after the interval: %v", up.counts)
	}
}

func TestTimeoutFailureIsCached(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	clk := newClock()
	p := newProber(t, Options{Now: clk.Now, Timeout: 50 * time.Millisecond})
	p.SetTargets(nil, nil, up.url(t))
	for i := 0; i < 20; i++ {
		if p.Dashboard(context.Background()) {
			t.Fatal("timeout counted as available")
		}
	}
	if p.Count(Dashboard) != 1 {
		t.Fatalf("%d probes after timeouts, want 1", p.Count(Dashboard))
	}
}

// A caller that gives up must not cancel the shared probe: the upstream
// request completes normally and the next caller gets its answer.
func TestCallerCancellationDoesNotPoisonRefresh(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	var canceledUpstream atomic.Bool
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			canceledUpstream.Store(true)
			return
		}
		reply(200, `{"auth_required":true}`)(w, r)
	})
	clk := newClock()
	p := newProber(t, Options{Now: clk.Now, Timeout: time.Minute})
	p.SetTargets(nil, nil, up.url(t))

	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan bool)
	go func() { first <- p.Dashboard(ctx) }()
	waitFor(t, func() bool { return up.count("/api/health") == 1 && p.waiting.Load() == 1 })
	cancel()
	if <-first {
		t.Fatal("canceled caller got true")
	}
	second := make(chan bool)
	go func() { second <- p.Dashboard(context.Background()) }()
	waitFor(t, func() bool { return p.waiting.Load() == 1 })
	releaseOnce.Do(func() { close(release) })
	if !<-second {
		t.Fatal("second caller did not get the shared answer")
	}
	if canceledUpstream.Load() {
		t.Fatal("the caller's cancellation reached the upstream request")
	}
	if up.count("/api/health") != 1 {
		t.Fatalf("%d upstream requests, want 1", up.count("/api/health"))
	}
	if !p.Dashboard(context.Background()) || up.count("/api/health") != 1 {
		t.Fatal("answer not cached")
	}
}

func TestSetTargetsResetsCache(t *testing.T) {
	on := newUpstream(t, reply(200, `{"auth_required":true}`))
	off := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/health" {
			http.NotFound(w, r)
			return
		}
		reply(200, `{"auth_required":false}`)(w, r)
	})
	clk := newClock()
	p := newProber(t, Options{Now: clk.Now})
	p.SetTargets(on.url(t), on.url(t), on.url(t))
	if relay, api, dash := p.All(context.Background()); !relay || !api || !dash {
		t.Fatal("first target not available")
	}
	down := off.url(t)
	down.Path = "/nothing-here"
	p.SetTargets(down, down, off.url(t))
	if relay, api, dash := p.All(context.Background()); relay || api || dash {
		t.Fatalf("reload not reflected: %v %v %v", relay, api, dash)
	}
	if off.count("/api/health") != 1 || off.count("/nothing-here/health") != 2 {
		t.Fatalf("new targets probed: %v", off.counts)
	}
}

// A probe of the old target still in flight at reload answers its own
// waiters but is not cached for the new target.
func TestSetTargetsDuringFlight(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	old := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		reply(200, `{"auth_required":true}`)(w, r)
	})
	next := newUpstream(t, reply(200, `{"auth_required":false}`))
	clk := newClock()
	p := newProber(t, Options{Now: clk.Now, Timeout: time.Minute})
	p.SetTargets(nil, nil, old.url(t))
	first := make(chan bool)
	go func() { first <- p.Dashboard(context.Background()) }()
	waitFor(t, func() bool { return old.count("/api/health") == 1 })
	p.SetTargets(nil, nil, next.url(t))
	if p.Dashboard(context.Background()) {
		t.Fatal("new target answered with the old one's result")
	}
	releaseOnce.Do(func() { close(release) })
	if !<-first {
		t.Fatal("old flight's waiter lost its answer")
	}
	if p.Dashboard(context.Background()) {
		t.Fatal("old flight's result was cached for the new target")
	}
	if next.count("/api/health") != 1 {
		t.Fatalf("new target probed %d times", next.count("/api/health"))
	}
}

func TestPanickingClientIsUnavailable(t *testing.T) {
	c := &http.Client{Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
		panic("boom")
	})}
	p := newProber(t, Options{Client: c})
	u, _ := url.Parse("http://127.0.0.1:1")
	p.SetTargets(u, u, u)
	if relay, api, dash := p.All(context.Background()); relay || api || dash {
		t.Fatal("panicking probe counted as available")
	}
	if c.CheckRedirect != nil {
		t.Fatal("the supplied client was modified")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestCloseEndsFlightsAndProbing(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	p := New(Options{Timeout: time.Minute})
	p.SetTargets(nil, nil, up.url(t))
	got := make(chan bool)
	go func() { got <- p.Dashboard(context.Background()) }()
	waitFor(t, func() bool { return p.waiting.Load() == 1 })
	p.Close()
	if <-got {
		t.Fatal("closed prober answered true")
	}
	if p.Dashboard(context.Background()) || p.Count(Dashboard) != 1 {
		t.Fatal("closed prober probed again")
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := (Options{}).Validate(); err != nil {
		t.Fatalf("zero options: %v", err)
	}
	for _, o := range []Options{
		{Interval: -1}, {Timeout: -time.Second}, {MaxBody: -1}, {MaxBody: 2 << 20},
	} {
		if o.Validate() == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	o := Options{}.withDefaults()
	if o.Interval != 15*time.Second || o.Timeout != 3*time.Second || o.MaxBody != 64<<10 || o.Now == nil {
		t.Fatalf("defaults: %+v", o)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("New accepted invalid options")
		}
	}()
	New(Options{Interval: -1})
}

func TestReasonOf(t *testing.T) {
	if reasonOf(context.DeadlineExceeded) != "timeout" || reasonOf(errors.New("x")) != "request failed" {
		t.Fatal("reasons")
	}
}

func FuzzGateOn(f *testing.F) {
	for _, s := range []string{`{"auth_required":true}`, `{"auth_required":"true"}`, `[]`, `"x"`, `null`,
		`{"auth_required":true}x`, ` {"auth_required" : true } `, `{"a":{"auth_required":true}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !GateOn(b) {
			return
		}
		// On means: one complete JSON object with a top-level literal true.
		if !strings.HasPrefix(strings.TrimLeft(string(b), " \t\r\n"), "{") {
			t.Fatalf("gate on for non-object %q", b)
		}
		if !strings.Contains(string(b), "true") {
			t.Fatalf("gate on without true: %q", b)
		}
	})
}

// waitFor polls cond; it waits on progress, never asserts on elapsed time.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

package relay

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestOptionsDefaults(t *testing.T) {
	o := Options{}.WithDefaults()
	if o.MaxMessageBytes != 4<<20 || o.PingInterval != 30*time.Second || o.PongTimeout != 60*time.Second ||
		o.DialTimeout != 5*time.Second || o.WriteTimeout != 30*time.Second || o.HandoffTimeout != 5*time.Second ||
		o.AuthFailLimit != 5 || o.AuthFailWindow != time.Minute || o.BlockDuration != 5*time.Minute ||
		o.MaxTrackedSources != 65536 || o.MaxUnauthenticated != 5 || o.MaxUnauthenticatedReach != 16 {
		t.Fatalf("defaults %+v", o)
	}
	if err := o.Validate(); err == nil {
		t.Fatal("missing Upstream accepted")
	}
	o.Upstream, _ = url.Parse("http://127.0.0.1:8767")
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestOptionsValidate(t *testing.T) {
	good := func() Options {
		u, _ := url.Parse("http://127.0.0.1:8767")
		return Options{Upstream: u}.WithDefaults()
	}
	mustURL := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	for name, mutate := range map[string]func(*Options){
		"https upstream": func(o *Options) { o.Upstream = mustURL("https://127.0.0.1:8767") },
		"ws upstream":    func(o *Options) { o.Upstream = mustURL("ws://127.0.0.1:8767") },
		"user info":      func(o *Options) { o.Upstream = mustURL("http://u:p@127.0.0.1:8767") },
		"query":          func(o *Options) { o.Upstream = mustURL("http://127.0.0.1:8767/?a=b") },
		"fragment":       func(o *Options) { o.Upstream = mustURL("http://127.0.0.1:8767/#f") },
		"no host":        func(o *Options) { o.Upstream = mustURL("http:///x") },
		"secret newline": func(o *Options) { o.ProxySecret = "abc\ndef" },
		"secret space":   func(o *Options) { o.ProxySecret = " abc" },
		"max zero":       func(o *Options) { o.MaxMessageBytes = -1 },
		"max huge":       func(o *Options) { o.MaxMessageBytes = 1 << 40 },
		"ping":           func(o *Options) { o.PingInterval = -1 },
		"pong":           func(o *Options) { o.PongTimeout = -1 },
		"dial":           func(o *Options) { o.DialTimeout = -1 },
		"write":          func(o *Options) { o.WriteTimeout = -1 },
		"handoff":        func(o *Options) { o.HandoffTimeout = -1 },
		"limit":          func(o *Options) { o.AuthFailLimit = -1 },
		"window":         func(o *Options) { o.AuthFailWindow = -1 },
		"block":          func(o *Options) { o.BlockDuration = -1 },
		"tracked":        func(o *Options) { o.MaxTrackedSources = -1 },
		"unauth":         func(o *Options) { o.MaxUnauthenticated = -1 },
		"unauth reach":   func(o *Options) { o.MaxUnauthenticatedReach = -1 },
	} {
		o := good()
		mutate(&o)
		err := o.Validate()
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if strings.Contains(err.Error(), "abc") {
			t.Errorf("%s: error quotes the secret: %v", name, err)
		}
		if _, err := NewBridge(o); err == nil {
			t.Errorf("%s: NewBridge accepted", name)
		}
	}
}

func TestRelayWebSocketURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8767":        "ws://127.0.0.1:8767/ws",
		"http://127.0.0.1:8767/":       "ws://127.0.0.1:8767/ws",
		"http://[::1]:8767/hermes":     "ws://[::1]:8767/hermes/ws",
		"http://localhost:8767/a%20b/": "ws://localhost:8767/a%20b/ws",
	} {
		u, _ := url.Parse(in)
		got, err := relayWebSocketURL(u)
		if err != nil || got != want {
			t.Errorf("%s: %q %v, want %q", in, got, err, want)
		}
	}
}

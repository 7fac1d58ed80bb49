package connector

import (
	"strings"
	"testing"
	"time"

	"github.com/hermes-securelink/securelink/broker/wire"
)

func goodConfig() Config {
	return Config{
		BrokerURL: "wss://broker.example:8443/v1/connect",
		HostID:    "AAECAwQFBgcICQoLDA0ODw",
		Token:     wire.NewToken(),
	}
}

func TestDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.MaxStreams != 16 || c.RegisterTimeout != 10*time.Second || c.PingInterval != 15*time.Second ||
		c.PongTimeout != 45*time.Second || c.PublishTimeout != 5*time.Second ||
		c.BackoffBase != time.Second || c.MaxBackoff != time.Minute || c.BackoffResetAfter != time.Minute ||
		c.AuthFailureBackoff != 10*time.Minute || c.ReplacedBackoff != time.Minute ||
		c.SlowConsumerTimeout != 10*time.Second || c.Now == nil || c.Rand == nil || c.Sleep == nil {
		t.Fatalf("defaults: %+v", c)
	}
	if err := goodConfig().WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateChecksUpFront(t *testing.T) {
	token := wire.NewToken()
	cases := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"plaintext", func(c *Config) { c.BrokerURL = "ws://broker.example/v1/connect" }, "scheme is not wss"},
		{"https", func(c *Config) { c.BrokerURL = "https://broker.example/v1/connect" }, "scheme is not wss"},
		{"other path", func(c *Config) { c.BrokerURL = "wss://broker.example/connect" }, "wrong path"},
		{"trailing slash", func(c *Config) { c.BrokerURL = "wss://broker.example/v1/connect/" }, "wrong path"},
		{"query", func(c *Config) { c.BrokerURL = "wss://broker.example/v1/connect?token=x" }, "query"},
		{"user info", func(c *Config) { c.BrokerURL = "wss://u:p@broker.example/v1/connect" }, "user info"},
		{"no host id", func(c *Config) { c.HostID = "" }, "host_id is required"},
		{"padded host id", func(c *Config) { c.HostID = "AAECAwQFBgcICQoLDA0ODw==" }, "canonical"},
		{"non-canonical host id", func(c *Config) { c.HostID = "AAECAwQFBgcICQoLDA0ODx" }, "canonical"},
		{"short token", func(c *Config) { c.Token = token[:31] }, "host token"},
		{"long token", func(c *Config) { c.Token = wire.Secret(strings.Repeat("x", 513)) }, "host token"},
		{"max streams", func(c *Config) { c.MaxStreams = 65 }, "max_streams"},
		{"tiny buffer", func(c *Config) { c.StreamBufferBytes = 64 << 10 }, "StreamBufferBytes"},
		{"negative timeout", func(c *Config) { c.WriteTimeout = -1 }, "WriteTimeout"},
		{"pong before ping", func(c *Config) { c.PongTimeout = c.PingInterval }, "PongTimeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := goodConfig().WithDefaults()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want it to mention %q", err, tc.want)
			}
			if strings.Contains(err.Error(), string(token)) || strings.Contains(err.Error(), string(c.Token)) {
				t.Fatal("the error quotes the token")
			}
			if _, err := New(c); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
	for _, ok := range []string{strings.Repeat("a", 32), strings.Repeat("é", 512)} {
		c := goodConfig().WithDefaults()
		c.Token = wire.Secret(ok)
		if err := c.Validate(); err != nil {
			t.Fatalf("token of %d chars refused: %v", len([]rune(ok)), err)
		}
	}
}

func TestStatusBeforeRun(t *testing.T) {
	c, err := New(goodConfig())
	if err != nil {
		t.Fatal(err)
	}
	st := c.Status()
	if !st.Enabled || st.State != StateStopped || st.HostID != "AAECAwQFBgcICQoLDA0ODw" ||
		st.BrokerURL != "wss://broker.example:8443/v1/connect" || st.Attempts != 0 || st.ConnectedSince != nil {
		t.Fatalf("status %+v", st)
	}
}

package client

import (
	"testing"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// The candidate's credential becomes a Config that passes Config.Validate.
func TestCandidateConfig(t *testing.T) {
	tok := wire.NewToken()
	c := Candidate{Broker: CandidateBroker{URL: "wss://broker.example/v1/connect", HostID: wire.NewID().String(),
		CredentialKind: string(wire.KindBootstrap), Token: tok}}
	cfg := CandidateConfig(c)
	if err := cfg.Validate(); err != nil || cfg.BrokerURL != c.Broker.URL || cfg.HostID != c.Broker.HostID ||
		cfg.CredentialKind != "bootstrap" || cfg.Token != tok {
		t.Fatalf("config %+v %v", cfg, err)
	}
}

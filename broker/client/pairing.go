package client

import "github.com/hermes-securelink/securelink/internal/pairing"

// The client dials with the outbound_broker candidate of internal/pairing,
// its one definition (built and parsed there); these are its names here.
type (
	Candidate       = pairing.BrokerCandidate
	CandidateBroker = pairing.BrokerCredential
	CandidateProxy  = pairing.BrokerProxy
)

// ParseCandidate reads a candidate file (pairing.ParseBrokerCandidate).
func ParseCandidate(data []byte) (Candidate, error) { return pairing.ParseBrokerCandidate(data) }

// NewCandidate builds a candidate (pairing.NewBrokerCandidate).
func NewCandidate(priority int, broker CandidateBroker, proxyURL, pin, certDER string) (Candidate, error) {
	return pairing.NewBrokerCandidate(priority, broker, proxyURL, pin, certDER)
}

// CandidateConfig is the Dial configuration of c's credential; set RootCAs,
// timeouts and Log as needed.
func CandidateConfig(c Candidate) Config {
	return Config{
		BrokerURL:      c.Broker.URL,
		HostID:         c.Broker.HostID,
		CredentialKind: c.Broker.CredentialKind,
		Token:          c.Broker.Token,
	}
}

package doctor

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/internal/metrics"
)

// The shipped unit's LimitNOFILE must cover every socket the default limits
// allow, or a default install warns at start and in doctor.
func TestBrokerUnitCoversTheDefaultLimits(t *testing.T) {
	unit, err := os.ReadFile("../../systemd/securelink-broker.service")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^LimitNOFILE=(\d+)$`).FindSubmatch(unit)
	if m == nil {
		t.Fatal("securelink-broker.service has no LimitNOFILE line")
	}
	limit, _ := strconv.Atoi(string(m[1]))
	cfg := server.DefaultConfig()
	if need := metrics.BrokerFDsNeeded(cfg.MaxHosts, cfg.MaxStreamsPerHost); limit < need {
		t.Fatalf("LimitNOFILE=%d, the defaults (max_hosts %d, max_streams_per_host %d) need %d", limit, cfg.MaxHosts, cfg.MaxStreamsPerHost, need)
	}
}

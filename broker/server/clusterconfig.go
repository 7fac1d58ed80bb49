package server

import (
	"fmt"
	"regexp"
	"time"
)

// ClusterConfig is the `cluster:` block of the broker's YAML
// (docs/cluster.md "Configuration"). Disabled by default: the broker is
// then the single process with state_file, unchanged. When enabled, the
// caller (runBroker) builds Config.Shared and Config.Forward from it with
// broker/cluster.
type ClusterConfig struct {
	Enabled    bool   `yaml:"enabled"`
	InstanceID string `yaml:"instance_id"`
	// Engine is "nats" (JetStream, the measured choice; docs/decisions.md).
	Engine        string            `yaml:"engine"`
	NATS          ClusterNATSConfig `yaml:"nats"`
	Peer          ClusterPeerConfig `yaml:"peer"`
	OwnerTTL      time.Duration     `yaml:"owner_ttl"`
	EngineTimeout time.Duration     `yaml:"engine_timeout"`
}

// ClusterNATSConfig is `cluster.nats`.
type ClusterNATSConfig struct {
	URLs         []string `yaml:"urls"`
	CredsFile    string   `yaml:"creds_file"`
	CAFile       string   `yaml:"ca_file"`
	BucketPrefix string   `yaml:"bucket_prefix"`
	Replicas     int      `yaml:"replicas"`
}

// ClusterPeerConfig is `cluster.peer`, the broker-to-broker link.
type ClusterPeerConfig struct {
	Listen    string `yaml:"listen"`
	Advertise string `yaml:"advertise"`
	CertFile  string `yaml:"cert_file"`
	KeyFile   string `yaml:"key_file"`
	CAFile    string `yaml:"ca_file"`
}

// defaultCluster fills the block's defaults (applied to every config; they
// matter only when enabled).
func defaultCluster() ClusterConfig {
	return ClusterConfig{
		Engine:        "nats",
		NATS:          ClusterNATSConfig{BucketPrefix: "securelink-reach", Replicas: 3},
		Peer:          ClusterPeerConfig{Listen: ":9445"},
		OwnerTTL:      30 * time.Second,
		EngineTimeout: 2 * time.Second,
	}
}

var (
	clusterIDRE     = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)
	clusterBucketRE = regexp.MustCompile(`^[-_a-zA-Z0-9]{1,64}$`)
)

// validateCluster checks the block when it is enabled.
func (c *Config) validateCluster(bad func(key, format string, args ...any)) {
	k := c.Cluster
	if !k.Enabled {
		return
	}
	if !clusterIDRE.MatchString(k.InstanceID) {
		bad("cluster.instance_id", "required when the cluster is enabled: 1 to 32 of a-z, 0-9 and -")
	}
	if k.Engine != "nats" {
		bad("cluster.engine", "must be nats (redis is not built; docs/decisions.md says why)")
	}
	if len(k.NATS.URLs) == 0 {
		bad("cluster.nats.urls", "at least one NATS server is required")
	}
	if !clusterBucketRE.MatchString(k.NATS.BucketPrefix) {
		bad("cluster.nats.bucket_prefix", "1 to 64 of letters, digits, - and _")
	}
	if k.NATS.Replicas < 1 || k.NATS.Replicas > 5 {
		bad("cluster.nats.replicas", "must be 1..5 (3 for no single point of failure)")
	}
	for _, kv := range [][2]string{
		{"cluster.peer.listen", k.Peer.Listen}, {"cluster.peer.advertise", k.Peer.Advertise},
		{"cluster.peer.cert_file", k.Peer.CertFile}, {"cluster.peer.key_file", k.Peer.KeyFile},
		{"cluster.peer.ca_file", k.Peer.CAFile},
	} {
		if kv[1] == "" {
			bad(kv[0], "required when the cluster is enabled")
		}
	}
	if k.Peer.Listen == c.Listen {
		bad("cluster.peer.listen", "must differ from listen: the peer link is never the public port")
	}
	if k.OwnerTTL < 3*time.Second || k.OwnerTTL > 10*time.Minute {
		bad("cluster.owner_ttl", "must be 3s..10m")
	}
	if k.EngineTimeout <= 0 || k.EngineTimeout > time.Minute {
		bad("cluster.engine_timeout", "must be more than 0 and at most 1m")
	} else if msg := LeaseTimingProblem(k.OwnerTTL, k.EngineTimeout); msg != "" {
		bad("cluster.engine_timeout", "%s", msg)
	}
}

// LeaseTimingProblem says why an owner lease of ownerTTL can run out under
// a host that stays registered when each engine write takes up to
// engineTimeout ("" when it cannot). A lease is written once when its host
// registers and then by renewal rounds every ownerTTL/3 (broker/cluster's
// Owners.renew), each renewal one write; a round skips a lease whose
// registration's write is still in flight. The longest wait between two
// writes that reach the engine is a registration's write taking the whole
// timeout, the next round up to ownerTTL/3 later and its write taking the
// whole timeout again: 2 × engineTimeout + ownerTTL/3, which must stay
// below ownerTTL, so engineTimeout below ownerTTL/3. (That a round over
// many leases ends within ownerTTL/3 is the renewal's own concern.)
func LeaseTimingProblem(ownerTTL, engineTimeout time.Duration) string {
	if 3*engineTimeout < ownerTTL {
		return ""
	}
	return fmt.Sprintf("%v must be less than a third of cluster.owner_ttl (%v): a lease renewed every owner_ttl/3 by writes that each take up to engine_timeout would run out under its host", engineTimeout, ownerTTL)
}

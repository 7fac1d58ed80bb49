package server

import (
	"strings"
	"testing"
	"time"
)

const clusterYAMLBase = `listen: "127.0.0.1:9444"
insecure_plaintext: true
hosts_file: /x/hosts.json
state_file: /x/state.json
`

// TestClusterConfig: the block is off by default and then changes nothing;
// enabled, it needs its keys, keeps the defaults of the ones left out, and
// refuses bad values naming the key.
func TestClusterConfig(t *testing.T) {
	c, err := ParseConfig("b.yaml", []byte(clusterYAMLBase))
	if err != nil {
		t.Fatal(err)
	}
	if c.Cluster.Enabled || c.Shared != nil || c.Forward != nil {
		t.Fatalf("cluster mode on by default: %+v", c.Cluster)
	}
	on := clusterYAMLBase + `cluster:
  enabled: true
  instance_id: b-1
  nats:
    urls: ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]
  peer:
    advertise: "10.0.0.5:9445"
    cert_file: /x/peer.pem
    key_file: /x/peer-key.pem
    ca_file: /x/peer-ca.pem
  owner_ttl: 45s
`
	c, err = ParseConfig("b.yaml", []byte(on))
	if err != nil {
		t.Fatal(err)
	}
	k := c.Cluster
	if !k.Enabled || k.InstanceID != "b-1" || len(k.NATS.URLs) != 2 || k.NATS.Replicas != 3 ||
		k.NATS.BucketPrefix != "securelink-reach" || k.Engine != "nats" || k.Peer.Listen != ":9445" ||
		k.OwnerTTL != 45*time.Second || k.EngineTimeout != 2*time.Second {
		t.Fatalf("cluster block: %+v", k)
	}
	for name, tc := range map[string]struct{ from, to, key string }{
		"no instance id":  {"instance_id: b-1", "instance_id: \"\"", "cluster.instance_id"},
		"bad instance id": {"instance_id: b-1", "instance_id: B_1", "cluster.instance_id"},
		"redis":           {"  nats:\n", "  engine: redis\n  nats:\n", "cluster.engine"},
		"no urls":         {`urls: ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]`, "urls: []", "cluster.nats.urls"},
		"no advertise":    {`advertise: "10.0.0.5:9445"`, `advertise: ""`, "cluster.peer.advertise"},
		"public port":     {"  peer:\n", "  peer:\n    listen: \"127.0.0.1:9444\"\n", "cluster.peer.listen"},
		"short lease":     {"owner_ttl: 45s", "owner_ttl: 1s", "cluster.owner_ttl"},
		"unknown key":     {"owner_ttl: 45s", "owner_tll: 45s", "owner_tll"},
	} {
		y := strings.Replace(on, tc.from, tc.to, 1)
		if y == on {
			t.Fatalf("%s: the case changes nothing", name)
		}
		if _, err := ParseConfig("b.yaml", []byte(y)); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: %v, want an error naming %s", name, err, tc.key)
		}
	}
}

// TestClusterEngineTimeoutFitsTheLease: an engine_timeout of a third of
// owner_ttl or more is refused at load, naming both keys (a lease renewed
// every owner_ttl/3 by writes that each take the whole timeout could run
// out under its host); the defaults, and a lease just long enough, load.
func TestClusterEngineTimeoutFitsTheLease(t *testing.T) {
	base := clusterYAMLBase + `cluster:
  enabled: true
  instance_id: b-1
  nats: {urls: ["nats://10.0.0.1:4222"]}
  peer: {advertise: "10.0.0.5:9445", cert_file: /x/p.pem, key_file: /x/k.pem, ca_file: /x/ca.pem}
`
	c, err := ParseConfig("b.yaml", []byte(base))
	if err != nil {
		t.Fatalf("the default owner_ttl and engine_timeout: %v", err)
	}
	if k := c.Cluster; 3*k.EngineTimeout >= k.OwnerTTL {
		t.Fatalf("defaults %v / %v break the rule they passed", k.OwnerTTL, k.EngineTimeout)
	}
	if _, err := ParseConfig("b.yaml", []byte(base+"  owner_ttl: 6100ms\n  engine_timeout: 2s\n")); err != nil {
		t.Fatalf("6.1s / 2s: %v", err)
	}
	for _, pair := range []string{"owner_ttl: 6s\n  engine_timeout: 5s", "owner_ttl: 6s\n  engine_timeout: 2s", "owner_ttl: 3s"} {
		_, err := ParseConfig("b.yaml", []byte(base+"  "+pair+"\n"))
		if err == nil || !strings.Contains(err.Error(), "cluster.engine_timeout") || !strings.Contains(err.Error(), "cluster.owner_ttl") {
			t.Errorf("%q: %v, want an error naming cluster.engine_timeout and cluster.owner_ttl", pair, err)
		}
	}
}

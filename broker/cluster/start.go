package cluster

import (
	"context"
	"fmt"
	"net"

	"github.com/hermes-securelink/securelink/broker/server"
)

// Node is one broker instance's membership of the cluster, built from the
// `cluster:` block: the shared state and the owner leases, to set as
// Config.Shared and Config.Forward before server.New.
type Node struct {
	State  *State
	Owners *Owners
	peer   net.Listener
}

// Start connects to the engine and binds the peer listener (bound here, so
// a taken port fails the start rather than the first forwarded client).
func Start(ctx context.Context, k server.ClusterConfig) (*Node, error) {
	st, err := Open(ctx, Options{
		InstanceID: k.InstanceID, URLs: k.NATS.URLs, CredsFile: k.NATS.CredsFile, CAFile: k.NATS.CAFile,
		BucketPrefix: k.NATS.BucketPrefix, Replicas: k.NATS.Replicas, Timeout: k.EngineTimeout,
	})
	if err != nil {
		return nil, err
	}
	ow, err := st.OpenOwners(ctx, PeerOptions{
		Advertise: k.Peer.Advertise, CertFile: k.Peer.CertFile, KeyFile: k.Peer.KeyFile,
		CAFile: k.Peer.CAFile, OwnerTTL: k.OwnerTTL,
	})
	if err != nil {
		st.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", k.Peer.Listen)
	if err != nil {
		ow.Close()
		st.Close()
		return nil, fmt.Errorf("cluster.peer.listen: %w", err)
	}
	return &Node{State: st, Owners: ow, peer: ln}, nil
}

// Apply sets the broker configuration's cluster hooks.
func (n *Node) Apply(cfg *server.Config) { cfg.Shared, cfg.Forward = n.State, n.Owners }

// Serve serves the peer listener for b until ctx ends.
func (n *Node) Serve(ctx context.Context, b *server.Broker) error {
	return n.Owners.ServePeer(ctx, b, n.peer)
}

// Close stops renewing leases and disconnects from the engine.
func (n *Node) Close() {
	n.peer.Close()
	n.Owners.Close()
	n.State.Close()
}

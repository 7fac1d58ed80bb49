// Package cluster is the Reach broker's cluster mode (docs/cluster.md):
// the broker's shared state in NATS JetStream key-value buckets.
package cluster

package cluster

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsCluster is a three-node JetStream cluster on 127.0.0.1, embedded in
// the test process: each node has its own client port, route port and
// store directory, so one can be shut down and started again.
type natsCluster struct {
	t      testing.TB
	opts   []*server.Options
	nodes  []*server.Server
	routes []*url.URL
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startNATSCluster starts the three nodes on ports freePort found free. A
// port another process took in between (the machine's other tests open
// connections all the while) fails a node's listener; the cluster is then
// started again on other ports, a few times.
func startNATSCluster(t testing.TB) *natsCluster {
	t.Helper()
	var err error
	for range 3 {
		c := &natsCluster{t: t}
		if err = c.startOnFreePorts(); err == nil {
			t.Cleanup(c.shutdown)
			c.waitReady()
			return c
		}
		t.Logf("starting the NATS cluster again on other ports: %v", err)
		c.shutdown()
	}
	t.Fatal(err)
	return nil
}

func (c *natsCluster) startOnFreePorts() error {
	n := 3
	routePorts := make([]int, n)
	for i := range routePorts {
		routePorts[i] = freePort(c.t)
		u, _ := url.Parse(fmt.Sprintf("nats://127.0.0.1:%d", routePorts[i]))
		c.routes = append(c.routes, u)
	}
	for i := 0; i < n; i++ {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       freePort(c.t),
			JetStream:  true,
			StoreDir:   c.t.TempDir(),
			NoSigs:     true,
			NoLog:      true,
			Cluster: server.ClusterOpts{
				Name: "reach-test",
				Host: "127.0.0.1",
				Port: routePorts[i],
				// Clients use the URLs they were given and learn no
				// others, so a test can cut one instance off the engine
				// by stopping the only node it knows.
				NoAdvertise: true,
			},
			Routes: c.routes,
			// Small limits: a test cluster needs little.
			JetStreamMaxMemory: 64 << 20,
			JetStreamMaxStore:  256 << 20,
		}
		c.opts = append(c.opts, o)
		c.nodes = append(c.nodes, nil)
	}
	for i := range c.opts {
		if err := c.start(i); err != nil {
			return err
		}
	}
	return nil
}

// start starts node i and waits until it listens.
func (c *natsCluster) start(i int) error {
	o := *c.opts[i]
	s, err := server.NewServer(&o)
	if err != nil {
		return err
	}
	var log fatalLog
	s.SetLogger(&log, false, false)
	go s.Start()
	c.nodes[i] = s
	deadline := time.Now().Add(10 * time.Second)
	for !s.ReadyForConnections(50 * time.Millisecond) {
		if msg := log.fatal(); msg != "" {
			return fmt.Errorf("nats node %d: %s", i, msg)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats node %d did not start", i)
		}
	}
	return nil
}

// fatalLog keeps the first fatal message of a node (a listener that
// could not bind); the rest is dropped as with NoLog.
type fatalLog struct {
	mu  sync.Mutex
	msg string
}

func (l *fatalLog) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.msg
}

func (l *fatalLog) Fatalf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.msg == "" {
		l.msg = fmt.Sprintf(format, v...)
	}
}
func (l *fatalLog) Noticef(string, ...any) {}
func (l *fatalLog) Warnf(string, ...any)   {}
func (l *fatalLog) Errorf(string, ...any)  {}
func (l *fatalLog) Debugf(string, ...any)  {}
func (l *fatalLog) Tracef(string, ...any)  {}

// waitReady waits until JetStream has a meta leader in the cluster.
func (c *natsCluster) waitReady() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range c.nodes {
			if s != nil && s.JetStreamIsLeader() {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatal("no JetStream meta leader within 30 s")
}

// stop shuts node i down (its store stays for a restart).
func (c *natsCluster) stop(i int) {
	if s := c.nodes[i]; s != nil {
		s.Shutdown()
		s.WaitForShutdown()
		c.nodes[i] = nil
	}
}

func (c *natsCluster) shutdown() {
	for i := range c.nodes {
		c.stop(i)
	}
}

// urls lists the client URLs of every node, running or not.
func (c *natsCluster) urls() []string {
	var out []string
	for _, o := range c.opts {
		out = append(out, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	return out
}

func (c *natsCluster) url(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.opts[i].Port)
}

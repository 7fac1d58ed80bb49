package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/internal/testenv"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// rig is three real brokers (wss:// on 127.0.0.1) sharing one hosts file
// and a three-node JetStream cluster with R=3 buckets; each broker's NATS
// connection prefers a different node.
type rig struct {
	t       *testing.T
	nats    *natsCluster
	brokers []*testenv.Broker // in-process instances (newRig)
	// url names instance i's public endpoint, and pool trusts its
	// certificate (in-process brokers or processes).
	url     func(i int) string
	pool    *x509.CertPool
	shared  []*State
	owners  []*Owners
	peerLn  []string             // each instance's peer listener address
	peerEnd []context.CancelFunc // stops the running ServePeer
	hostID  wire.ID
	token   wire.Secret
	// hostsFile is the hosts file every instance reads.
	hostsFile string
}

// newEngineRig starts the JetStream cluster and writes a hosts file with
// the rig's one host; the caller starts the brokers.
func newEngineRig(t *testing.T, hostsFile string) *rig {
	t.Helper()
	r := &rig{t: t, nats: startNATSCluster(t), hostsFile: hostsFile}
	id, tok, err := store.AddHost(hostsFile)
	if err != nil {
		t.Fatal(err)
	}
	if r.hostID, err = wire.ParseID(id); err != nil {
		t.Fatal(err)
	}
	r.token = tok
	return r
}

// newRig starts three in-process brokers; ownerTTL is their owner lease
// (renewed every third of it). Each instance knows every engine node, its
// own first.
func newRig(t *testing.T, ownerTTL time.Duration) *rig {
	t.Helper()
	return newRigURLs(t, ownerTTL, ownFirst)
}

// ownFirst gives instance i every engine node, node i first.
func ownFirst(all []string, i int) []string {
	all[0], all[i] = all[i], all[0]
	return all
}

// newRigURLs is newRig with instance i given the engine URLs urls(all, i).
func newRigURLs(t *testing.T, ownerTTL time.Duration, urls func(all []string, i int) []string) *rig {
	t.Helper()
	return newRigWith(t, ownerTTL, urls, nil)
}

// rigEngineTimeout is the engine_timeout of the tests that are not about
// the engine's timeouts. Under -race, with other work on both cores (CI at
// load 5), one operation of the in-process three-node engine took up to
// 1.7 s. A test that waits for it to run out (the engine unreachable) waits
// this long.
const rigEngineTimeout = 3 * time.Second

// outageEngineTimeout is the engine_timeout of the tests about an outage's
// timing (the product's default).
const outageEngineTimeout = 2 * time.Second

// shortLease is an owner_ttl a little above the shortest that
// engineTimeout allows (server.LeaseTimingProblem: engine_timeout below a
// third of it), for the tests that wait for a renewal or an expiry.
func shortLease(engineTimeout time.Duration) time.Duration {
	return 3*engineTimeout + engineTimeout/2
}

// newRigWith is newRigURLs with every broker's configuration changed by
// mutate (nil: none) after the rig's own settings.
func newRigWith(t *testing.T, ownerTTL time.Duration, urls func(all []string, i int) []string, mutate func(*server.Config)) *rig {
	t.Helper()
	return newRigTimeout(t, ownerTTL, rigEngineTimeout, urls, mutate)
}

// newRigTimeout is newRigWith with the instances' engine_timeout.
func newRigTimeout(t *testing.T, ownerTTL, engineTimeout time.Duration, urls func(all []string, i int) []string, mutate func(*server.Config)) *rig {
	t.Helper()
	hostsFile := filepath.Join(t.TempDir(), "hosts.json")
	r := newEngineRig(t, hostsFile)
	r.url = func(i int) string { return r.brokers[i].URL() }
	r.pool = x509.NewCertPool()
	ca := newPeerCA(t)
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		st, err := Open(ctx, Options{
			InstanceID: fmt.Sprintf("b%d", i), URLs: urls(r.nats.urls(), i), BucketPrefix: "reach",
			Replicas: 3, Timeout: engineTimeout,
		})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		r.shared = append(r.shared, st)
		name := fmt.Sprintf("b%d", i)
		cert, key := ca.issue(name)
		// Bound now and kept for the first ServePeer, so the advertised
		// port cannot be taken in between.
		pln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		r.peerLn = append(r.peerLn, pln.Addr().String())
		ow, err := st.OpenOwners(context.Background(), PeerOptions{
			Advertise: r.peerLn[i], CertFile: cert, KeyFile: key, CAFile: ca.CAFile, OwnerTTL: ownerTTL,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(ow.Close)
		r.owners = append(r.owners, ow)
		r.brokers = append(r.brokers, testenv.StartBroker(t, testenv.BrokerOptions{Mutate: func(c *server.Config) {
			c.HostsFile = hostsFile
			c.Shared = st
			c.Forward = ow
			if mutate != nil {
				mutate(c)
			}
		}}))
		leaf, err := x509.ParseCertificate(r.brokers[i].Cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		r.pool.AddCert(leaf)
		r.peerEnd = append(r.peerEnd, nil)
		r.servePeerOn(i, pln)
	}
	t.Cleanup(func() {
		for i := range r.peerEnd {
			r.stopPeer(i)
		}
	})
	return r
}

// servePeer serves broker i's running instance on its peer address again
// (after a restart).
func (r *rig) servePeer(i int) {
	r.t.Helper()
	ln, err := net.Listen("tcp", r.peerLn[i])
	if err != nil {
		r.t.Fatal(err)
	}
	r.servePeerOn(i, ln)
}

func (r *rig) servePeerOn(i int, ln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	ow, b := r.owners[i], r.brokers[i].B
	go func() { defer close(done); ow.ServePeer(ctx, b, ln) }()
	r.peerEnd[i] = func() { cancel(); <-done }
}

func (r *rig) stopPeer(i int) {
	if r.peerEnd[i] != nil {
		r.peerEnd[i]()
		r.peerEnd[i] = nil
	}
}

// peer is one WebSocket to a broker, read by a goroutine.
type peer struct {
	t  *testing.T
	c  *websocket.Conn
	ch chan result
}

type result struct {
	typ  websocket.MessageType
	data []byte
	err  error
}

// dialRaw opens a WebSocket to broker i that nothing reads.
func (r *rig) dialRaw(i int) *websocket.Conn {
	t := r.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Step)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.pool}}}
	c, _, err := websocket.Dial(ctx, r.url(i), &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatalf("dial broker %d: %v", i, err)
	}
	c.SetReadLimit(4 << 20)
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func (r *rig) dial(i int) *peer {
	c := r.dialRaw(i)
	p := &peer{t: r.t, c: c, ch: make(chan result, 256)}
	go func() {
		for {
			typ, data, err := c.Read(context.Background())
			p.ch <- result{typ, data, err}
			if err != nil {
				return
			}
		}
	}()
	return p
}

func (p *peer) send(typ websocket.MessageType, b []byte) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Step)
	defer cancel()
	if err := p.c.Write(ctx, typ, b); err != nil {
		p.t.Fatalf("write: %v", err)
	}
}

func (p *peer) sendMsg(m wire.Message) {
	p.t.Helper()
	b, err := wire.Marshal(m)
	if err != nil {
		p.t.Fatal(err)
	}
	p.send(websocket.MessageText, b)
}

func (p *peer) read() result {
	p.t.Helper()
	select {
	case r := <-p.ch:
		return r
	case <-time.After(testenv.Step):
		p.t.Fatalf("nothing arrived within %v", testenv.Step)
		return result{}
	}
}

// msg reads one control message (a close fails the test). A host's
// binary frames in between (CLOSE of probe streams) are skipped.
func (p *peer) msg() wire.Message {
	p.t.Helper()
	r := p.read()
	for r.err == nil && r.typ == websocket.MessageBinary {
		r = p.read()
	}
	if r.err != nil || r.typ != websocket.MessageText {
		p.t.Fatalf("expected a text message, got %v %q %v", r.typ, r.data, r.err)
	}
	m, err := wire.ParseBrokerMessage(r.data)
	if err != nil {
		p.t.Fatalf("%q: %v", r.data, err)
	}
	return m
}

// hostOn registers the rig's host on broker i and returns its socket.
func (r *rig) hostOn(i int) *peer {
	r.t.Helper()
	h := r.dial(i)
	h.sendMsg(wire.Register{Role: wire.RoleHost, HostID: r.hostID, ConnectionID: wire.NewID(), CredentialKind: wire.KindHost, Token: r.token})
	if _, ok := h.msg().(wire.Registered); !ok {
		r.t.Fatalf("host not registered on broker %d", i)
	}
	return h
}

// reply reads a host's answer to a control message, past the open
// messages of streams the test does not follow.
func (p *peer) reply() wire.Message {
	p.t.Helper()
	for {
		m := p.msg()
		if _, open := m.(wire.Open); !open {
			return m
		}
	}
}

func (r *rig) publishRoute(h *peer, credID string, tok wire.Secret) {
	r.t.Helper()
	h.sendMsg(wire.PublishRoute{CredentialID: credID, TokenSHA256: wire.TokenDigest(string(tok)),
		ExpiresAt: time.Now().Add(time.Hour).Unix(), DeviceIDHash: wire.TokenDigest("device")})
	if m := h.reply(); m != (wire.Published{CredentialKind: wire.KindRoute, Label: credID}) {
		r.t.Fatalf("route %s not published: %#v", credID, m)
	}
}

func (r *rig) publishBootstrap(h *peer, pairingID string, tok wire.Secret) {
	r.t.Helper()
	h.sendMsg(wire.PublishBootstrap{PairingID: pairingID, TokenSHA256: wire.TokenDigest(string(tok)),
		ExpiresAt: time.Now().Add(10 * time.Minute).Unix()})
	if m := h.reply(); m != (wire.Published{CredentialKind: wire.KindBootstrap, Label: pairingID}) {
		r.t.Fatalf("bootstrap %s not published: %#v", pairingID, m)
	}
}

// client registers a client on broker i and returns its socket and the
// first message it got (matched or error).
func (r *rig) client(i int, kind wire.Kind, tok wire.Secret, conn wire.ID) (*peer, wire.Message) {
	r.t.Helper()
	c := r.dial(i)
	c.sendMsg(wire.Register{Role: wire.RoleClient, HostID: r.hostID, ConnectionID: conn, CredentialKind: kind, Token: tok})
	return c, c.msg()
}

func code(m wire.Message) wire.Code {
	if e, ok := m.(wire.ErrorMsg); ok {
		return e.Code
	}
	return ""
}

// matched expects a match of a client on broker i and the host's open for
// it; it returns the client and the stream id.
func (r *rig) matched(h *peer, i int, kind wire.Kind, tok wire.Secret) (*peer, wire.ID) {
	r.t.Helper()
	return r.matchedConn(h, i, kind, tok, wire.NewID())
}

func (r *rig) matchedConn(h *peer, i int, kind wire.Kind, tok wire.Secret, conn wire.ID) (*peer, wire.ID) {
	r.t.Helper()
	c, m := r.client(i, kind, tok, conn)
	mm, ok := m.(wire.Matched)
	if !ok {
		r.t.Fatalf("client on broker %d not matched: %#v", i, m)
	}
	if o, ok := h.msg().(wire.Open); !ok || o.StreamID != mm.StreamID {
		r.t.Fatalf("host did not get open for %v", mm.StreamID)
	}
	return c, mm.StreamID
}

// echo relays payload from the client to the host and back, and checks
// the bytes on both sides.
func echo(t *testing.T, h, c *peer, id wire.ID, payload []byte) {
	t.Helper()
	c.send(websocket.MessageBinary, payload)
	var got []byte
	for len(got) < len(payload) {
		r := h.read()
		if r.err != nil || r.typ != websocket.MessageBinary {
			t.Fatalf("host: %v %q %v", r.typ, r.data, r.err)
		}
		f, err := wire.ParseFrame(r.data)
		if err == nil && f.StreamID != id {
			continue // another stream's CLOSE
		}
		if err != nil || f.Flags != wire.FlagData {
			t.Fatalf("host frame: %v %+v", err, f)
		}
		got = append(got, f.Payload...)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("host got %d bytes, not the client's %d", len(got), len(payload))
	}
	frame, err := wire.AppendFrame(nil, wire.Frame{Flags: wire.FlagData, StreamID: id, Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	h.send(websocket.MessageBinary, frame)
	got = got[:0]
	for len(got) < len(payload) {
		r := c.read()
		if r.err != nil || r.typ != websocket.MessageBinary {
			t.Fatalf("client: %v %v", r.typ, r.err)
		}
		got = append(got, r.data...)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("client got other bytes than the host sent")
	}
}

// mirrored waits until broker i's mirror has tok's credential: a client
// presenting it with a fresh connection_id stops being `unauthorized`.
// Only routes are probed this way (a probe of a bootstrap would use it).
func (r *rig) mirrored(h *peer, i int, tok wire.Secret) {
	r.t.Helper()
	testenv.WaitFor(r.t, fmt.Sprintf("broker %d mirrors the route", i), func() bool {
		c, m := r.client(i, wire.KindRoute, tok, wire.NewID())
		defer c.c.CloseNow()
		if mm, ok := m.(wire.Matched); ok {
			if o, ok := h.msg().(wire.Open); !ok || o.StreamID != mm.StreamID {
				r.t.Fatalf("host did not get open")
			}
			// Leave the stream to the host's CLOSE: the test host ignores it.
			return true
		}
		return code(m) != wire.CodeUnauthorized
	})
}

// mirroredOps counts the changes of other instances broker i applied.
func (r *rig) mirroredOps(i int) int64 { return r.brokers[i].B.Stats().Counts["cluster:mirrored"] }

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

// TestClusterRules: the credential rules of spec/reach.md across three
// instances sharing one engine.
func TestClusterRules(t *testing.T) {
	// The host holds registrations on A and B at once below, the window
	// of a takeover; a long lease keeps A from closing its own (newest
	// wins, TestClusterForwarding) while the test runs.
	r := newRig(t, 10*time.Minute)
	route := wire.Secret("route-" + testenv.RandomSecret(""))
	hA := r.hostOn(0)
	r.publishRoute(hA, "dev1", route)

	// A connection_id accepted on A is replayed on B and C.
	conn := wire.NewID()
	cA, id := r.matchedConn(hA, 0, wire.KindRoute, route, conn)
	echo(t, hA, cA, id, payload(70_000))
	for i := 1; i < 3; i++ {
		if _, m := r.client(i, wire.KindRoute, route, conn); code(m) != wire.CodeReplayed {
			t.Fatalf("connection_id reused on broker %d: %#v, want replayed", i, m)
		}
	}

	// The host also holds a registration on B (the route published on A
	// reaches B's mirror); a bootstrap published through both and
	// presented to A and B at once opens exactly one stream.
	hB := r.hostOn(1)
	r.mirrored(hB, 1, route)
	// Several rounds, the two registrations sent at the same moment on
	// sockets already open, so both instances run the matching order
	// before either has seen the other's use.
	var boot wire.Secret
	for round := 0; round < 8; round++ {
		boot = wire.Secret("boot-" + testenv.RandomSecret(""))
		pid := fmt.Sprintf("pair%d", round)
		r.publishBootstrap(hA, pid, boot)
		r.publishBootstrap(hB, pid, boot)
		if wins := r.raceBootstrap(boot, 0, 1); wins != 1 {
			t.Fatalf("round %d: a bootstrap opened %d streams across two instances, want exactly 1", round, wins)
		}
	}
	// And a third instance refuses it too.
	if _, m := r.client(2, wire.KindBootstrap, boot, wire.NewID()); code(m) != wire.CodeReplayed && code(m) != wire.CodeHostOffline {
		t.Fatalf("consumed bootstrap on C: %#v", m)
	}

	// A revoke on A closes the credential's stream on B and refuses it on
	// every instance.
	route2 := r.revokeCloses(hA, hB, 1)
	for i := 0; i < 3; i++ {
		if _, m := r.client(i, wire.KindRoute, route2, wire.NewID()); code(m) != wire.CodeRevoked && code(m) != wire.CodeHostOffline {
			t.Fatalf("revoked route on broker %d: %#v", i, m)
		}
	}

	// One NATS node down: every instance still records matches.
	// (Until the buckets' streams elect a new leader, if node 0 led one,
	// a change may answer `unavailable`; nothing else is accepted.)
	r.nats.stop(0)
	for _, tc := range []struct {
		h *peer
		i int
	}{{hA, 0}, {hB, 1}, {hB, 2}, {hA, 0}} {
		drainOpens(tc.h)
		c, id := r.matchedOnceUp(tc.h, tc.i, route)
		echo(t, tc.h, c, id, payload(5000))
	}

	// The engine unreachable: a match and a publish answer `unavailable`,
	// never a silent accept (both sent at once: each waits out the
	// engine timeout).
	r.nats.stop(1)
	r.nats.stop(2)
	c := r.dial(0)
	c.sendMsg(wire.Register{Role: wire.RoleClient, HostID: r.hostID, ConnectionID: wire.NewID(), CredentialKind: wire.KindRoute, Token: route})
	hA.sendMsg(wire.PublishRoute{CredentialID: "dev3", TokenSHA256: wire.TokenDigest("x"),
		ExpiresAt: time.Now().Add(time.Hour).Unix(), DeviceIDHash: wire.TokenDigest("device")})
	if m := c.msg(); code(m) != wire.CodeUnavailable {
		t.Fatalf("match without the engine: %#v, want unavailable", m)
	}
	if m := hA.reply(); code(m) != wire.CodeUnavailable {
		t.Fatalf("publish without the engine: %#v, want unavailable", m)
	}
}

// matchedOnceUp matches a route client through instance i, retrying while
// the engine answers `unavailable` (a leader election after a node loss);
// any other refusal fails the test.
func (r *rig) matchedOnceUp(h *peer, i int, tok wire.Secret) (*peer, wire.ID) {
	r.t.Helper()
	deadline := time.Now().Add(3 * testenv.Step)
	for {
		c, m := r.client(i, wire.KindRoute, tok, wire.NewID())
		if mm, ok := m.(wire.Matched); ok {
			if o, ok := h.msg().(wire.Open); !ok || o.StreamID != mm.StreamID {
				r.t.Fatalf("host did not get open for %v", mm.StreamID)
			}
			return c, mm.StreamID
		}
		if code(m) != wire.CodeUnavailable || time.Now().After(deadline) {
			r.t.Fatalf("client through broker %d after a node loss: %#v", i, m)
		}
		c.c.CloseNow()
		time.Sleep(100 * time.Millisecond)
	}
}

// revokeCloses publishes route credential dev2 through host socket pub,
// opens a stream of it through instance i (whose host socket is h), has pub
// revoke it and expects the stream closed with 1008. It returns the token.
func (r *rig) revokeCloses(pub, h *peer, i int) wire.Secret {
	r.t.Helper()
	tok := wire.Secret("route-" + testenv.RandomSecret(""))
	r.publishRoute(pub, "dev2", tok)
	drainOpens(pub)
	drainOpens(h)
	r.mirrored(h, i, tok)
	drainOpens(h)
	c, id := r.matched(h, i, wire.KindRoute, tok)
	echo(r.t, h, c, id, payload(1000))
	pub.sendMsg(wire.Revoke{CredentialID: "dev2"})
	if m, ok := pub.reply().(wire.Revoked); !ok || m.CredentialID != "dev2" {
		r.t.Fatalf("revoke: %#v", m)
	}
	if rr := c.read(); websocket.CloseStatus(rr.err) != websocket.StatusPolicyViolation {
		r.t.Fatalf("stream of the revoked route through broker %d: %v %v, want close 1008", i, rr.typ, rr.err)
	}
	return tok
}

// raceBootstrap presents bootstrap tok on the given instances at the same
// moment (sockets dialed first) and counts the matches; every other answer
// must be `replayed`.
func (r *rig) raceBootstrap(tok wire.Secret, instances ...int) int {
	r.t.Helper()
	peers := make([]*peer, len(instances))
	for k, i := range instances {
		peers[k] = r.dial(i)
	}
	start := make(chan struct{})
	results := make([]result, len(peers))
	var wg sync.WaitGroup
	for k, p := range peers {
		msg, _ := wire.Marshal(wire.Register{Role: wire.RoleClient, HostID: r.hostID, ConnectionID: wire.NewID(), CredentialKind: wire.KindBootstrap, Token: tok})
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			p.c.Write(context.Background(), websocket.MessageText, msg)
			select {
			case results[k] = <-p.ch:
			case <-time.After(testenv.Step):
			}
		}()
	}
	close(start)
	wg.Wait()
	wins := 0
	for k, rr := range results {
		m, err := wire.ParseBrokerMessage(rr.data)
		switch {
		case rr.err != nil || err != nil:
			r.t.Fatalf("bootstrap client on broker %d: %v %v", instances[k], rr.err, err)
		case code(m) == wire.CodeReplayed:
		default:
			if _, ok := m.(wire.Matched); !ok {
				r.t.Fatalf("bootstrap client on broker %d: %#v", instances[k], m)
			}
			wins++
		}
		p := peers[k]
		p.c.CloseNow()
	}
	return wins
}

// drainOpens discards the open messages of probe streams queued for h.
func drainOpens(h *peer) {
	for {
		select {
		case rr := <-h.ch:
			if rr.err != nil {
				h.t.Fatalf("host socket ended: %v", rr.err)
			}
		case <-time.After(50 * time.Millisecond):
			return
		}
	}
}

// TestClusterHostMovesWhenInstanceStops: the instance holding the host's
// socket stops mid-transfer; the host registers on another instance and
// its credentials, published on the first, work there without being
// published again; what the first accepted stays refused.
func TestClusterHostMovesWhenInstanceStops(t *testing.T) {
	r := newRig(t, shortLease(rigEngineTimeout))
	route := wire.Secret("route-" + testenv.RandomSecret(""))
	hA := r.hostOn(0)
	r.publishRoute(hA, "dev1", route)
	conn := wire.NewID()
	cA, id := r.matchedConn(hA, 0, wire.KindRoute, route, conn)
	echo(t, hA, cA, id, payload(200_000))
	// A client that landed on C is relayed to A, the host's instance.
	cC, idC := r.matched(hA, 2, wire.KindRoute, route)
	echo(t, hA, cC, idC, payload(100_000))
	cA.send(websocket.MessageBinary, payload(10_000)) // in flight when A stops
	cC.send(websocket.MessageBinary, payload(10_000))
	r.stopPeer(0)
	if err := r.brokers[0].Halt(); err != nil {
		t.Fatal(err)
	}
	for rr := cC.read(); rr.err == nil; rr = cC.read() {
	}
	for rr := cA.read(); rr.err == nil; rr = cA.read() {
	}
	for rr := hA.read(); rr.err == nil; rr = hA.read() {
	}

	// The host registers on B; clients reach it through B and C.
	hB := r.hostOn(1)
	c, id := r.matched(hB, 1, wire.KindRoute, route)
	echo(t, hB, c, id, payload(300_000))
	c, id = r.matched(hB, 2, wire.KindRoute, route)
	echo(t, hB, c, id, payload(300_000))
	if _, m := r.client(2, wire.KindRoute, route, conn); code(m) != wire.CodeReplayed {
		t.Fatalf("connection_id accepted on the stopped instance, reused on C: %#v", m)
	}
	// A restarted instance loads the shared state and serves the host.
	r.brokers[0].Start()
	r.servePeer(0)
	c, id = r.matched(hB, 0, wire.KindRoute, route)
	echo(t, hB, c, id, payload(1000))
	hA2 := r.hostOn(0)
	c, id = r.matched(hA2, 0, wire.KindRoute, route)
	echo(t, hA2, c, id, payload(1000))
}

// TestClusterForwarding: clients that land on instances not holding their
// host are relayed to its owner; the owner applies the rules, so a
// bootstrap presented through two other instances at once opens one
// stream, and a revoke closes the forwarded stream.
func TestClusterForwarding(t *testing.T) {
	r := newRig(t, shortLease(rigEngineTimeout))
	route := wire.Secret("route-" + testenv.RandomSecret(""))
	if _, m := r.client(1, wire.KindRoute, route, wire.NewID()); code(m) != wire.CodeUnauthorized {
		t.Fatalf("unknown route: %#v", m)
	}
	hA := r.hostOn(0)
	r.publishRoute(hA, "dev1", route)
	r.mirrored(hA, 1, route)
	r.mirrored(hA, 2, route)
	drainOpens(hA)
	for i := 1; i < 3; i++ {
		c, id := r.matched(hA, i, wire.KindRoute, route)
		echo(t, hA, c, id, payload(250_000))
	}

	boot := wire.Secret("boot-" + testenv.RandomSecret(""))
	// Both B and C must know the bootstrap before the race: a
	// publication not mirrored yet is refused `unauthorized`.
	before := []int64{r.mirroredOps(1), r.mirroredOps(2)}
	r.publishBootstrap(hA, "pair1", boot)
	testenv.WaitFor(t, "B and C mirror the bootstrap", func() bool {
		return r.mirroredOps(1) > before[0] && r.mirroredOps(2) > before[1]
	})
	if wins := r.raceBootstrap(boot, 1, 2); wins != 1 {
		t.Fatalf("a bootstrap opened %d streams through two instances, want exactly 1", wins)
	}

	r.revokeCloses(hA, hA, 2)

	// A newer registration on B wins: A closes its socket with
	// `replaced` at its next lease renewal, and clients through A reach B.
	hB := r.hostOn(1)
	for {
		rr := hA.read()
		if rr.err != nil {
			var ce websocket.CloseError
			if !errors.As(rr.err, &ce) || ce.Code != websocket.StatusNormalClosure || ce.Reason != wire.CloseReasonReplaced {
				t.Fatalf("A's host socket: %v, want close 1000 %q", rr.err, wire.CloseReasonReplaced)
			}
			break
		}
	}
	c, id := r.matched(hB, 0, wire.KindRoute, route)
	echo(t, hB, c, id, payload(10_000))

	// The host leaves: other instances answer host_offline.
	hB.c.Close(websocket.StatusNormalClosure, "")
	testenv.WaitFor(t, "host_offline through B", func() bool {
		_, m := r.client(1, wire.KindRoute, route, wire.NewID())
		return code(m) == wire.CodeHostOffline
	})
}

// TestClusterOwnerCutOffFromEngine: the instance holding the host loses
// the engine (the only node it knows stops) while the others keep it. Its
// lease runs out, so the others answer host_offline; it closes the host's
// socket (1001 "lease expired") instead of keeping a host nobody can reach,
// and the host registered again on another instance is reached through
// both survivors with the credential it published on the first.
func TestClusterOwnerCutOffFromEngine(t *testing.T) {
	ttl := shortLease(outageEngineTimeout)
	r := newRigTimeout(t, ttl, outageEngineTimeout, func(all []string, i int) []string {
		if i == 0 {
			return all[:1] // A knows node 0 only
		}
		return all[1:]
	}, nil)
	route := wire.Secret("route-" + testenv.RandomSecret(""))
	hA := r.hostOn(0)
	r.publishRoute(hA, "dev1", route)
	r.mirrored(hA, 1, route)
	drainOpens(hA)
	c, id := r.matched(hA, 1, wire.KindRoute, route)
	echo(t, hA, c, id, payload(50_000))

	cut := time.Now()
	r.nats.stop(0)
	var closed time.Duration
	for {
		rr := hA.read()
		if rr.err != nil {
			closed = time.Since(cut)
			var ce websocket.CloseError
			if !errors.As(rr.err, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != wire.CloseReasonLeaseExpired {
				t.Fatalf("A's host socket: %v, want close 1001 %q", rr.err, wire.CloseReasonLeaseExpired)
			}
			break
		}
	}
	// The lease cannot be dropped before the last renewal that reached the
	// engine is a TTL old (at most a renewal interval before the cut).
	if closed < ttl-ttl/3 {
		t.Fatalf("A closed its host %v after losing the engine, before the lease (%v) could have run out", closed, ttl)
	}
	if n := r.brokers[0].B.Stats().Counts["cluster:lease_expired"]; n != 1 {
		t.Fatalf("cluster:lease_expired = %d, want 1", n)
	}

	hB := r.hostOn(1)
	for _, i := range []int{1, 2} {
		c, id := r.matched(hB, i, wire.KindRoute, route)
		echo(t, hB, c, id, payload(100_000))
	}
	// A still cannot reach the engine: it refuses work rather than
	// answering from its mirror.
	if _, m := r.client(0, wire.KindRoute, route, wire.NewID()); code(m) != wire.CodeUnavailable {
		t.Fatalf("a client on the cut-off instance: %#v, want unavailable", m)
	}
}

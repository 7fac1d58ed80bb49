package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/tlsconf"
)

// PeerOptions are the broker-to-broker link: a separate listener with
// mutual TLS, every instance's certificate signed by one CA and naming its
// instance_id as a DNS name.
type PeerOptions struct {
	// Advertise is the host:port other instances dial to reach this one.
	Advertise string
	CertFile  string
	KeyFile   string
	CAFile    string
	// OwnerTTL is the lease on "host H is on this instance", renewed
	// every OwnerTTL/3 while H stays registered here.
	OwnerTTL time.Duration
}

// Owners records which instance holds each host's socket (the
// <prefix>-owner bucket, key o.<host_id>, TTL OwnerTTL) and dials the
// owner's peer listener (it implements server.Forwarder).
type Owners struct {
	s      *State
	opt    PeerOptions
	owner  jetstream.KeyValue
	server *tls.Config // the peer listener's
	client *tls.Config // for dialing peers; ServerName set per dial

	mu   sync.Mutex
	held map[wire.ID]lease
	stop context.CancelFunc
	done chan struct{}
}

type lease struct {
	conn    wire.ID
	rev     uint64 // of the last write; 0 when Hold's write failed
	writing bool   // Hold's write is in flight: renewals wait for it
	// since is when the last write that succeeded was issued (Hold's start
	// until one does): the engine's record cannot outlive since+OwnerTTL.
	since time.Time
	lost  func(server.LeaseLoss)
}

type ownerRecord struct {
	By   string `json:"by"`
	Addr string `json:"addr"`
	Conn string `json:"conn"`
}

var _ server.Forwarder = (*Owners)(nil)

// OpenOwners creates the owner bucket if absent, loads the peer
// certificates and starts renewing leases.
func (s *State) OpenOwners(ctx context.Context, opt PeerOptions) (*Owners, error) {
	if opt.Advertise == "" {
		return nil, errors.New("cluster.peer.advertise is required")
	}
	if opt.OwnerTTL < 3*time.Second || opt.OwnerTTL > 10*time.Minute {
		return nil, errors.New("cluster.owner_ttl must be 3s..10m")
	}
	if msg := server.LeaseTimingProblem(opt.OwnerTTL, s.opt.Timeout); msg != "" {
		return nil, errors.New("cluster.engine_timeout " + msg)
	}
	cert, err := tls.LoadX509KeyPair(opt.CertFile, opt.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster.peer: %w", err)
	}
	pem, err := os.ReadFile(opt.CAFile)
	if err != nil {
		return nil, fmt.Errorf("cluster.peer.ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("cluster.peer.ca_file holds no certificate")
	}
	o := &Owners{
		s: s, opt: opt, held: map[wire.ID]lease{}, done: make(chan struct{}),
		server: &tls.Config{
			MinVersion: tlsconf.MinVersion, CipherSuites: tlsconf.TLS12Suites,
			Certificates: []tls.Certificate{cert}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, NextProtos: []string{"http/1.1"},
		},
		client: &tls.Config{
			MinVersion: tlsconf.MinVersion, CipherSuites: tlsconf.TLS12Suites,
			Certificates: []tls.Certificate{cert}, RootCAs: pool, NextProtos: []string{"http/1.1"},
		},
	}
	if o.owner, err = createBucket(ctx, s.js, s.opt, "owner"); err != nil {
		return nil, fmt.Errorf("cluster: owner bucket: %w", err)
	}
	rctx, stop := context.WithCancel(context.Background())
	o.stop = stop
	go o.renew(rctx)
	return o, nil
}

// Close stops renewing; the leases run out after OwnerTTL.
func (o *Owners) Close() {
	o.stop()
	<-o.done
}

func ownerKey(host wire.ID) string { return "o." + host.String() }

// write stores this instance's lease of host at the expected revision
// (0: unconditionally, a new registration wins) with the lease TTL.
func (o *Owners) write(ctx context.Context, host, conn wire.ID, expect uint64) (uint64, error) {
	b, _ := json.Marshal(ownerRecord{By: o.s.opt.InstanceID, Addr: o.opt.Advertise, Conn: conn.String()})
	var opts []jetstream.PublishOpt
	if expect != 0 {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(expect))
	}
	return o.s.publishTTL(ctx, o.owner, ownerKey(host), b, o.opt.OwnerTTL, opts...)
}

// Hold takes host's lease for registration conn: the newest registration
// wins, on whichever instance it landed.
func (o *Owners) Hold(ctx context.Context, host, conn wire.ID, lost func(server.LeaseLoss)) error {
	o.mu.Lock()
	o.held[host] = lease{conn: conn, lost: lost, writing: true, since: time.Now()}
	o.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, o.s.opt.Timeout)
	defer cancel()
	rev, err := o.write(cctx, host, conn, 0)
	o.mu.Lock()
	if l, ok := o.held[host]; ok && l.conn == conn {
		l.writing = false
		if err == nil {
			l.rev = rev
		}
		o.held[host] = l
	}
	o.mu.Unlock()
	return err
}

// Release deletes host's lease if it is still registration conn's.
func (o *Owners) Release(host, conn wire.ID) {
	o.mu.Lock()
	l, ok := o.held[host]
	if !ok || l.conn != conn {
		o.mu.Unlock()
		return
	}
	delete(o.held, host)
	o.mu.Unlock()
	if l.rev == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.s.opt.Timeout)
	defer cancel()
	o.owner.Delete(ctx, ownerKey(host), jetstream.LastRevision(l.rev)) // a newer lease stays
}

// renew rewrites every held lease at its revision every OwnerTTL/3. A
// lease someone else rewrote (the host registered on another instance), or
// that expired while the engine could not be written, is dropped and its
// registration told (lost: the broker closes it with `replaced`, and the
// host registers again wherever it lands); a failed write is retried at
// the next tick. A lease no write has reached the engine for OwnerTTL is
// dropped too (LeaseExpired): other instances already answer host_offline
// for it, and this one can match no client without the engine, so the
// host is better off registering again elsewhere. Once a write fails for
// any other reason than a changed revision the engine is taken to be out
// for the rest of the tick: the remaining leases are only checked for
// expiry, so one outage does not cost a write timeout per host before the
// last lease is checked.
func (o *Owners) renew(ctx context.Context) {
	defer close(o.done)
	t := time.NewTicker(o.opt.OwnerTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o.renewOnce(ctx)
	}
}

// renewParallel bounds the lease writes in flight in one renewal round:
// one at a time, a round over 10,000 hosts at the engine's ~0.3-1 ms per
// write on loopback (more across machines) takes most of the OwnerTTL/3
// between rounds, and a lease renewed late expires.
const renewParallel = 32

// renewOnce renews the held leases oldest first: when a round takes
// longer than OwnerTTL/3 (many hosts, a slow or busy engine) the next one
// starts as soon as it ends, and each lease is then renewed a round's
// length after its last renewal. In any other order a lease renewed early
// in one round and late in the next waits almost two rounds, and one
// renewed late expires under its host once a round takes OwnerTTL/2.
func (o *Owners) renewOnce(ctx context.Context) {
	type heldLease struct {
		host wire.ID
		lease
	}
	o.mu.Lock()
	held := make([]heldLease, 0, len(o.held))
	for h, l := range o.held {
		held = append(held, heldLease{h, l})
	}
	o.mu.Unlock()
	slices.SortFunc(held, func(a, b heldLease) int { return a.since.Compare(b.since) })
	var engineOut atomic.Bool
	var wg sync.WaitGroup
	slots := make(chan struct{}, renewParallel)
	for _, hl := range held {
		h, l := hl.host, hl.lease
		if l.writing {
			continue
		}
		if engineOut.Load() {
			o.settle(h, l, time.Time{}, 0, nil, false)
			continue
		}
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			// A lease whose first write failed is written afresh (rev 0);
			// if a newer registration elsewhere is overwritten, that
			// instance's next renewal sees it and closes its socket, and
			// the host registers again: newest wins once more.
			issued := time.Now()
			wctx, cancel := context.WithTimeout(ctx, o.s.opt.Timeout)
			rev, err := o.write(wctx, h, l.conn, l.rev)
			if revisionChanged(err) {
				rev, err = o.rewriteOwn(wctx, h, l, err)
			}
			cancel()
			if err != nil && !revisionChanged(err) && err != errRenewalInDoubt {
				engineOut.Store(true)
			}
			o.settle(h, l, issued, rev, err, true)
		}()
	}
	wg.Wait()
}

// errRenewalInDoubt: a renewal was refused for a write of the lease still
// in process that a read does not show yet; the next round looks again.
var errRenewalInDoubt = errors.New("cluster: a write of the lease is still in process")

// rewriteOwn looks at a lease whose renewal found its revision changed
// (conflict). A write of this registration's that reached the engine after
// this instance gave up on its answer (past engine_timeout, or sent again
// on a reconnect) leaves the record this instance's at a revision it never
// learnt: that is not another instance's takeover, and the lease is written
// again at that revision. Another's record, or none, leaves the conflict
// (the lease is taken). It runs within the renewal's one engine_timeout, so
// the lease's timing (server.LeaseTimingProblem) holds.
func (o *Owners) rewriteOwn(ctx context.Context, host wire.ID, l lease, conflict error) (uint64, error) {
	e, err := o.owner.Get(ctx, ownerKey(host))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return 0, conflict
	case err != nil:
		return 0, err
	}
	var r ownerRecord
	if json.Unmarshal(e.Value(), &r) != nil || r.By != o.s.opt.InstanceID || r.Conn != l.conn.String() {
		return 0, conflict
	}
	if e.Revision() == l.rev {
		return 0, errRenewalInDoubt
	}
	return o.write(ctx, host, l.conn, e.Revision())
}

func revisionChanged(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) &&
		(api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// settle applies one renewal's outcome to lease l of host (wrote: a write
// was made, issued at issued, giving rev or err) if l is still the held one,
// and tells its registration when the lease is gone.
func (o *Owners) settle(host wire.ID, l lease, issued time.Time, rev uint64, err error, wrote bool) {
	var lost func(server.LeaseLoss)
	why := server.LeaseTaken
	o.mu.Lock()
	cur, ok := o.held[host]
	mine := ok && cur.conn == l.conn && cur.rev == l.rev
	switch {
	case !mine:
	case wrote && err == nil:
		cur.rev, cur.since = rev, issued
		o.held[host] = cur
	case wrote && revisionChanged(err):
		delete(o.held, host) // another instance holds it now
		lost = cur.lost
	case time.Since(cur.since) >= o.opt.OwnerTTL:
		delete(o.held, host)
		lost, why = cur.lost, server.LeaseExpired
	}
	o.mu.Unlock()
	if lost != nil {
		lost(why)
	}
}

// Dial connects to the peer listener of host's owner.
func (o *Owners) Dial(ctx context.Context, host wire.ID) (msgconn.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, o.s.opt.Timeout)
	defer cancel()
	e, err := o.owner.Get(cctx, ownerKey(host))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, &wire.Error{Code: wire.CodeHostOffline, Detail: "host not online on any instance"}
	}
	if err != nil {
		return nil, err
	}
	var r ownerRecord
	if json.Unmarshal(e.Value(), &r) != nil || !instanceIDRE.MatchString(r.By) {
		return nil, errors.New("cluster: bad owner record")
	}
	if r.By == o.s.opt.InstanceID {
		return nil, &wire.Error{Code: wire.CodeHostOffline, Detail: "host registration ended"}
	}
	tc := o.client.Clone()
	tc.ServerName = r.By // the owner's certificate names its instance_id
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}
	// msgconn.Dial: the socket answers pings itself, so a pong owed while a
	// message is written cannot fail the link (decisions, pong-owed).
	ws, _, err := msgconn.Dial(cctx, "wss://"+r.Addr+wire.ConnectPath, &websocket.DialOptions{
		HTTPClient: hc, CompressionMode: websocket.CompressionDisabled,
	}, r.Addr)
	if err != nil {
		return nil, fmt.Errorf("cluster: peer %s: %w", r.By, err)
	}
	return ws, nil
}

// ServePeer serves b's peer handler on ln behind mutual TLS until ctx
// ends.
func (o *Owners) ServePeer(ctx context.Context, b *server.Broker, ln net.Listener) error {
	srv := &http.Server{
		Handler:           b.PeerHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(tls.NewListener(ln, o.server)) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		srv.Close()
		<-errc
		return nil
	}
}

package server

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// Forwarder, in cluster mode (Config.Forward, with Config.Shared), records
// which instance holds each host's socket and reaches the others: a client
// that lands on an instance not holding its host is relayed to the owner
// over the authenticated peer link (docs/cluster.md). broker/cluster
// implements it.
type Forwarder interface {
	// Hold records that this instance holds host's registration conn (an
	// owner lease the implementation renews until Release). lost is
	// called (once, from another goroutine) when the lease ends without
	// Release: taken by a newer registration elsewhere, or run out because
	// the engine could not be written for its whole TTL.
	Hold(ctx context.Context, host, conn wire.ID, lost func(LeaseLoss)) error
	// Release ends the lease of registration conn, if it is still the
	// recorded one.
	Release(host, conn wire.ID)
	// Dial connects to the peer listener of the instance holding host: a
	// *wire.Error host_offline when no instance holds it.
	Dial(ctx context.Context, host wire.ID) (msgconn.Conn, error)
}

// LeaseLoss says why a host's owner lease ended without Release.
type LeaseLoss int

const (
	// LeaseTaken: a newer registration of the host holds the lease on
	// another instance (or it was gone when the engine answered again).
	LeaseTaken LeaseLoss = iota
	// LeaseExpired: no renewal reached the engine for the lease's TTL, so
	// other instances now answer host_offline for the host while this one
	// cannot match anyone either (every match claims its connection_id in
	// the engine). The socket is closed so the host registers again,
	// wherever it lands, instead of staying unreachable for the outage.
	LeaseExpired
)

// errNotHere: the matching order passed on this instance's mirror, but the
// host's socket is on another instance (or none); serveClient forwards.
var errNotHere = errors.New("host not registered on this instance")

type forwardedKey struct{}

// forwarded reports whether the socket came over the peer link: the
// forwarding instance already claimed its connection_id.
func forwarded(ctx context.Context) bool { return ctx.Value(forwardedKey{}) != nil }

// PeerHandler serves sockets forwarded by other instances. It must only be
// served behind the peer listener's mutual TLS (broker/cluster.ServePeer):
// a forwarded registration skips the connection_id claim and the rate
// limit; every other rule of the matching order runs again here.
func (b *Broker) PeerHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+wire.ConnectPath, func(w http.ResponseWriter, r *http.Request) {
		b.connect(w, r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true)))
	})
	return mux
}

// holdHost records h's ownership in the engine (serveHost, cluster mode).
func (b *Broker) holdHost(ctx context.Context, h *hostSession) {
	if b.cfg.Forward == nil {
		return
	}
	lost := func(why LeaseLoss) {
		if why == LeaseExpired {
			b.count("cluster:lease_expired")
			h.log.Warn().Msg("the host's owner lease ran out while the engine could not be written; closing its socket so it registers again")
			b.endHost(h, hostEnd{code: wire.CloseGoingAway, reason: wire.CloseReasonLeaseExpired})
			return
		}
		b.count("host:replaced")
		h.log.Info().Msg("host registration replaced by a newer one on another instance")
		b.endHost(h, hostEnd{code: wire.CloseNormal, reason: wire.CloseReasonReplaced})
	}
	if err := b.cfg.Forward.Hold(ctx, h.id, h.connID, lost); err != nil {
		b.count("cluster:engine_error")
		h.log.Warn().Msg("the host's owner lease could not be written; clients on other instances do not reach it until the renewal succeeds")
	}
}

func (b *Broker) releaseHost(h *hostSession) {
	if b.cfg.Forward != nil {
		b.cfg.Forward.Release(h.id, h.connID)
	}
}

// forward relays a client whose host is held by another instance: the
// owner gets the same register message over the peer link and applies the
// same rules; its answer and every later message are relayed unchanged in
// both directions, and a close on either side closes the other with the
// same code.
func (b *Broker) forward(ctx context.Context, c msgconn.Conn, reg wire.Register) {
	pc, err := b.cfg.Forward.Dial(ctx, reg.HostID)
	if err != nil {
		var we *wire.Error
		if !errors.As(err, &we) {
			b.count("cluster:peer_error")
			err = &wire.Error{Code: wire.CodeUnavailable, Detail: "the host's instance cannot be reached"}
		}
		b.refuse(c, err)
		return
	}
	msg, err := wire.Marshal(reg)
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, b.cfg.WriteTimeout)
		err = pc.Write(wctx, msgconn.Text, msg)
		cancel()
	}
	if err != nil {
		pc.CloseNow()
		b.refuse(c, &wire.Error{Code: wire.CodeUnavailable, Detail: "the host's instance cannot be reached"})
		return
	}
	b.count("stream:forwarded")
	c.SetReadLimit(wire.MaxClientFrame + 1)
	pc.SetReadLimit(int64(b.cfg.ClientWriteChunk) + wire.MaxControlBytes)
	var once sync.Once
	var pingDead atomic.Bool
	end := func(to msgconn.Conn, err error) {
		once.Do(func() {
			code, reason := wire.CloseGoingAway, ""
			var ce *msgconn.CloseError
			switch {
			case pingDead.Load():
				reason = "ping timeout"
			case errors.As(err, &ce):
				code, reason = ce.Code, ce.Reason
			}
			to.Close(code, reason)
		})
	}
	// The client is pinged here as on the owner (spec: every 15 s, dropped
	// after 45 s without a pong): the owner pings only the peer link, which
	// this instance answers for the client. A client gone silent is cut;
	// the pump reading it then closes the peer link, which ends the stream
	// on the owner and frees its slot there. Both pumps' writes are
	// pauses: while one waits on the client's backpressure our ping waits
	// behind it, and while one waits on the owner's the client is not read.
	var pause msgconn.Pause
	stopKeepalive := b.keepalive(c, &pause, nil, func() {
		b.count("forward:ping_timeout")
		pingDead.Store(true)
		c.CloseNow()
	}).Start(ctx)
	defer stopKeepalive()
	// ctx ending cuts both sockets, the reads and the writes in progress,
	// as a context per call did; the pumps read under one that never ends
	// and bound their writes with a WriteGate, so a small message costs no
	// context, timer or watch of either.
	stop := context.AfterFunc(ctx, func() {
		c.CloseNow()
		pc.CloseNow()
	})
	defer stop()
	pump := func(from, to msgconn.Conn) {
		gate := msgconn.NewWriteGate(to)
		for {
			typ, data, err := from.Read(context.Background())
			if err != nil {
				end(to, err)
				from.CloseNow()
				return
			}
			pause.Enter()
			err = gate.Write(typ, data, b.cfg.WriteTimeout, nil)
			pause.Leave()
			if err != nil {
				end(from, nil)
				to.CloseNow()
				return
			}
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); pump(pc, c) }()
	pump(c, pc)
	wg.Wait()
}

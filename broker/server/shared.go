package server

import (
	"context"
	"errors"
	"time"

	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// Shared is the state a broker shares with the other instances of a
// cluster (docs/cluster.md); Config.Shared is nil in the single-process
// mode. broker/cluster implements it on NATS JetStream. In cluster mode the
// broker's store.State is a mirror of the engine: this instance's changes
// are applied locally as in the single process and made durable by Write
// instead of the state file, and changes of other instances arrive through
// Follow. The rules that must hold across instances are decided by the
// engine's compare-and-set (the Claim methods), never by the mirror.
type Shared interface {
	// Follow delivers the engine's current state to apply, returns once
	// it has, and then keeps delivering the changes other instances make
	// until ctx ends.
	Follow(ctx context.Context, apply func(store.Op)) error
	// Write makes ops durable in the engine; nil means every op is
	// acknowledged (by a quorum of its replicas).
	Write(ctx context.Context, ops []store.Op) error
	// ClaimConnectionID records id as accepted until exp, once across the
	// cluster: false when another registration already has it.
	ClaimConnectionID(ctx context.Context, id wire.ID, exp time.Time) (bool, error)
	// ClaimConsumed records bootstrap digest d as used until exp, once
	// across the cluster: false when it was used already.
	ClaimConsumed(ctx context.Context, d wire.Digest, exp time.Time) (bool, error)
	// CountReplay counts one accepted client registration, remembered
	// until exp, in host's replay share (at most perHost) and credential
	// d's (perCred), across the cluster: false, counting neither, when
	// one is full. It makes several engine operations, each bounded by
	// Timeout; ctx bounds them all.
	CountReplay(ctx context.Context, host wire.ID, d wire.Digest, exp time.Time, perHost, perCred int) (bool, error)
	// ReleaseConnectionID undoes ClaimConnectionID for a registration
	// refused after it.
	ReleaseConnectionID(ctx context.Context, id wire.ID) error
	// LookupCredential reads credential d from the engine, for a digest
	// the mirror does not know (it may lag the engine): found is false
	// when the engine has none either.
	LookupCredential(ctx context.Context, d wire.Digest) (c store.Credential, found bool, err error)
	// Reload delivers the engine's current state to apply again, in order
	// with Follow's changes (a hosts-file reload: the mirror skipped the
	// credentials of hosts it did not list).
	Reload(ctx context.Context, apply func(store.Op)) error
	// Timeout bounds one engine operation (cluster.engine_timeout); a
	// method that makes several bounds each by it.
	Timeout() time.Duration
}

// maxLookups bounds the engine reads of unknown credential digests in
// flight on one instance (lookupShared); past it a client is answered
// `unavailable` and retries.
const maxLookups = 64

// errUnknownCredential is admitLocked's answer for a digest the mirror
// does not hold; in cluster mode match asks the engine before giving it.
var errUnknownCredential = &wire.Error{Code: wire.CodeUnauthorized, Detail: "unknown credential"}

// lookupShared reads credential d from the engine after a mirror miss
// (match, cluster mode): a client that lands here right after the host
// published on another instance would otherwise be refused while the
// watch has not delivered the publication. The credential found is used
// for this match only and not kept as a live credential in the mirror: the
// watch may already have delivered a later delete of it, which a late
// insert would undo. (A bootstrap read this way enters the mirror only to
// be consumed at once, after its engine claim succeeded: match. Should the
// consumption's write fail and be undone, the mirror holds it live, and a
// later match of it still ends at the engine's claim: replayed.) Consumed
// and revoked digests are still decided by the mirror and the engine's
// creates, as without the read. nil, nil: the engine has no such
// credential either. The engine unreachable → `unavailable`, never an
// accept.
func (b *Broker) lookupShared(ctx context.Context, d wire.Digest) (*store.Credential, error) {
	select {
	case b.lookups <- struct{}{}:
		defer func() { <-b.lookups }()
	default:
		b.count("cluster:lookup_busy")
		return nil, &wire.Error{Code: wire.CodeUnavailable, Detail: "too many engine reads of unknown credentials in flight"}
	}
	b.count("cluster:mirror_miss")
	sh := b.cfg.Shared
	cctx, cancel := context.WithTimeout(ctx, sh.Timeout())
	defer cancel()
	c, found, err := sh.LookupCredential(cctx, d)
	switch {
	case err != nil:
		b.count("cluster:engine_error")
		return nil, errEngine
	case !found:
		return nil, nil
	}
	return &c, nil
}

// stateWriter makes the state's changes durable: the state file's
// store.Persister, or sharedWriter in cluster mode.
type stateWriter interface {
	Mark() uint64
	Run(ctx context.Context)
}

// errEngine answers a change or a match the shared engine did not
// acknowledge in time (spec: `unavailable`, the state cannot be written).
var errEngine = &wire.Error{Code: wire.CodeUnavailable, Detail: "the shared state cannot be written"}

// sharedWriter is the cluster's stateWriter: each batch of changes is
// written to the engine, and the commit rules of commit.go hold unchanged
// (a change is acknowledged once written, undone and answered `unavailable`
// when the write fails). Marks during a write are coalesced into the next.
type sharedWriter struct {
	b    *Broker
	kick chan struct{}
}

func newSharedWriter(b *Broker) *sharedWriter {
	return &sharedWriter{b: b, kick: make(chan struct{}, 1)}
}

func (w *sharedWriter) Mark() uint64 {
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return 0
}

func (w *sharedWriter) Run(ctx context.Context) {
	for {
		select {
		case <-w.kick:
			w.flush(ctx)
		case <-ctx.Done():
			w.flush(context.Background()) // what is still queued
			return
		}
	}
}

func (w *sharedWriter) flush(ctx context.Context) {
	batch := w.b.take(false)
	var err error
	if len(batch.Ops) > 0 {
		sh := w.b.cfg.Shared
		wctx, cancel := context.WithTimeout(ctx, sh.Timeout())
		err = sh.Write(wctx, batch.Ops)
		cancel()
	}
	w.b.written(err)
}

// followShared starts mirroring the engine into b.state (New, cluster
// mode): it returns once the current state is loaded.
func (b *Broker) followShared(ctx context.Context) error {
	return b.cfg.Shared.Follow(ctx, b.applyShared)
}

// applyShared applies a change another instance made. A revoke closes this
// instance's streams of the revoked digest, as the revoking instance does
// with its own.
func (b *Broker) applyShared(op store.Op) {
	now := b.cfg.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if op.Kind == store.OpPutBootstrap || op.Kind == store.OpPutRoute {
		if _, ok := b.hostKeys[op.Cred.HostID]; !ok {
			return // not a host of this instance's hosts file (yet)
		}
	}
	if !b.state.ApplyOp(op, now) {
		b.count("cluster:table_full")
	}
	b.count("cluster:mirrored")
	if op.Kind == store.OpRevoked {
		for _, h := range b.hosts {
			h.mu.Lock()
			b.endRevokedLocked(h, []wire.Digest{op.Digest})
			h.mu.Unlock()
		}
	}
}

// loadAddedHosts gives the mirror the engine's credentials of hosts a
// hosts-file reload added (ReloadHosts, cluster mode): the mirror skipped
// them while they were not listed. Credentials of other hosts are not
// touched; consumed and revoked digests were mirrored all along. A failed
// load leaves the misses to lookupShared.
func (b *Broker) loadAddedHosts(added map[wire.ID]struct{}) {
	sh := b.cfg.Shared
	ctx, cancel := context.WithTimeout(context.Background(), 5*sh.Timeout())
	defer cancel()
	n := 0
	err := sh.Reload(ctx, func(op store.Op) {
		if op.Kind != store.OpPutBootstrap && op.Kind != store.OpPutRoute {
			return
		}
		if _, ok := added[op.Cred.HostID]; ok {
			n++
			b.applyShared(op)
		}
	})
	if err != nil {
		b.count("cluster:engine_error")
		b.log.Warn().Int("hosts_added", len(added)).Msg("the credentials of hosts added to the hosts file could not be loaded from the engine; each is read at its first use")
		return
	}
	b.log.Info().Int("hosts_added", len(added)).Int("credentials", n).Msg("credentials of added hosts loaded from the engine")
}

// claimHost records a host registration's connection_id in the engine
// before registerHost runs; only a registration with the right host token
// gets that far. In cluster mode a connection_id is recorded at the first
// registration that presents it (a client's too, by match), accepted or
// not: honest peers make a new one per attempt, and the spec's matching
// order answers `replayed` first wherever the id lands.
func (b *Broker) claimHost(ctx context.Context, reg wire.Register) error {
	d := wire.TokenDigest(string(reg.Token))
	b.mu.Lock()
	ok := b.hostTokenOKLocked(reg.HostID, d)
	b.mu.Unlock()
	if !ok {
		return nil // registerHost refuses it
	}
	return b.claimID(ctx, reg.ConnectionID)
}

func (b *Broker) claimID(ctx context.Context, id wire.ID) error {
	sh := b.cfg.Shared
	cctx, cancel := context.WithTimeout(ctx, sh.Timeout())
	defer cancel()
	ok, err := sh.ClaimConnectionID(cctx, id, b.cfg.now().Add(wire.ReplayTTL))
	switch {
	case err != nil:
		b.count("cluster:engine_error")
		return errEngine
	case !ok:
		return &wire.Error{Code: wire.CodeReplayed, Detail: "connection_id already used on another instance"}
	}
	return nil
}

// admitSteps bounds a match's recording in the engine (admitSharedLocked)
// to this many engine_timeouts: its steps are the host's replay share, the
// credential's and a bootstrap's use, each a write and, when this instance
// has not written the share before or lost a race for it, a read.
const admitSteps = 3

// admitSharedLocked (b.mu held; released while the engine answers, held
// again on return) records in the engine what the matching order that
// passed on this instance decided: the client's place in its host's and
// its credential's replay shares (over either → quota_exceeded, and the
// connection_id claim is deleted again: the id was not accepted), then a
// bootstrap's one use, which exactly one instance's create wins. The
// stream's slot on h, and on a route its per-route slot, stay reserved
// meanwhile; the connection_id enters the local replay table once the
// engine counted it. (A client's connection_id was claimed before the
// matching order ran, by claimID in match, or by the instance that
// forwarded it.) Each engine operation has the engine_timeout, and the
// recording as a whole at most admitSteps of them.
func (b *Broker) admitSharedLocked(ctx context.Context, h *hostSession, cred store.Credential, id wire.ID) error {
	h.mu.Lock()
	h.reserved++
	h.mu.Unlock()
	route := cred.Kind == wire.KindRoute
	if route {
		b.routeLive[cred.Digest]++
	}
	b.mu.Unlock()
	sh := b.cfg.Shared
	now := b.cfg.now()
	cctx, cancel := context.WithTimeout(ctx, admitSteps*sh.Timeout())
	ok, err := sh.CountReplay(cctx, h.id, cred.Digest, now.Add(wire.ReplayTTL), b.cfg.ReplayPerHost, b.cfg.ReplayPerCredential)
	switch {
	case err != nil:
	case !ok:
		b.count("cluster:replay_share_full")
		// A time of its own: the counting may have used up cctx's.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), sh.Timeout())
		if sh.ReleaseConnectionID(rctx, id) != nil {
			b.count("cluster:engine_error")
		}
		rcancel()
		err = &wire.Error{Code: wire.CodeQuotaExceeded, Detail: "replay share of this credential or host is full across the cluster"}
	case cred.Kind == wire.KindBootstrap:
		octx, ocancel := context.WithTimeout(cctx, sh.Timeout())
		ok, err = sh.ClaimConsumed(octx, cred.Digest, time.Unix(cred.ExpiresAt, 0))
		ocancel()
		if err == nil && !ok {
			err = &wire.Error{Code: wire.CodeReplayed, Detail: "bootstrap token already consumed on another instance"}
		}
	}
	cancel()
	var we *wire.Error
	if err != nil && !errors.As(err, &we) {
		b.count("cluster:engine_error")
		err = errEngine
	}
	b.mu.Lock()
	if route {
		if b.routeLive[cred.Digest]--; b.routeLive[cred.Digest] <= 0 {
			delete(b.routeLive, cred.Digest)
		}
	}
	h.mu.Lock()
	h.reserved--
	ended := h.end != nil
	h.mu.Unlock()
	sec := now.Unix()
	switch {
	case err != nil:
		return err
	case b.closing:
		return errShuttingDown
	case ended:
		return &wire.Error{Code: wire.CodeHostOffline, Detail: "host left while the match was recorded"}
	case !b.clientReplay.Add(id, h.id, cred.Digest, sec+replaySeconds, sec):
		// Another match filled the local table meanwhile; the engine
		// counts this one once too often, which lets fewer in, not more.
		return &wire.Error{Code: wire.CodeQuotaExceeded, Detail: "replay cache share of this credential or host is full"}
	}
	return nil
}

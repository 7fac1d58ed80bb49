// Package server is the Reach rendezvous broker (spec/reach.md): it
// authenticates host and client registrations, matches clients to hosts,
// and relays the opaque bytes of each stream between the client's socket and
// the host's multiplexed socket, with the plain-v1 flow control of the spec.
//
// The core is transport-agnostic: Broker.Serve takes a msgconn.Conn (one
// WebSocket as read/write of typed messages), so unit tests drive it over
// in-memory pipes and the HTTP handler in http.go only upgrades and adapts.
//
// Concurrency rules, which keep one slow or hostile peer from stalling the
// others:
//   - Broker.mu guards the global tables (hosts online, credentials, replay
//     and closed-id tables, per-route counts); hostSession.mu guards one
//     host's streams and queues. Order: Broker.mu before hostSession.mu;
//     the queue budget's lock is a leaf.
//   - No network write, close handshake or state-file write happens while
//     holding either lock. Every peer has its own writer goroutine; each
//     write carries a deadline.
//   - Readers are the only goroutines that wait for queue space, and they
//     wait without locks, so backpressure reaches exactly the producer that
//     caused it.
package server

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/acme"
	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// Broker is one running rendezvous broker. Create it with New, serve
// sockets with Serve (or Handler / ListenAndServe), stop it with Close.
type Broker struct {
	cfg Config
	log zerolog.Logger

	// acme is the certificate manager while ServeListener runs with
	// tls.acme; Certificate reads it for metrics.
	acme atomic.Pointer[acme.Manager]

	ctx    context.Context // ends when Close gives up waiting for sessions
	cancel context.CancelFunc

	bgCancel context.CancelFunc
	bg       sync.WaitGroup
	sessions sync.WaitGroup

	persist stateWriter // the state file's Persister, or sharedWriter in cluster mode
	budget  budget
	// coalesce holds ClientWriteChunk-sized buffers for client messages
	// made of several queued payloads; only writers busy writing hold one.
	coalesce sync.Pool
	limiter  *rateLimiter
	dummy    wire.Digest // compared against when a host_id is unknown

	mu       sync.Mutex
	hostKeys store.Hosts
	hosts    map[wire.ID]*hostSession
	state    *store.State
	// Accepted connection ids, Unix seconds: host and client registrations
	// keep separate tables, so clients can never lock hosts out.
	hostReplay   *store.ReplayCache
	clientReplay *store.ReplayCache
	closedIDs    *store.Table[wire.ID, wire.ID] // stream id → owner's connection id, Unix ns
	routeLive    map[wire.Digest]int
	// queued holds applied changes not yet taken by the persister,
	// inflight those in the batch being written (commit.go).
	queued   []*change
	inflight []*change
	live     int
	closing  bool
	pending  map[msgconn.Conn]struct{} // sockets that have not registered yet
	// lookups bounds the engine reads of mirror misses in flight
	// (lookupShared, cluster mode).
	lookups chan struct{}

	statsMu sync.Mutex
	stats   map[string]int64

	closeOnce sync.Once
}

// New loads the hosts file and the state file and starts the background
// work (state writes, sweeping). The state file's directory must exist and
// be writable by this process.
func New(cfg Config, log zerolog.Logger) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hosts, err := store.LoadHosts(cfg.HostsFile)
	if err != nil {
		return nil, fmt.Errorf("broker: %w (create it with `securelink broker add-host`)", err)
	}
	var snap store.Snapshot
	var info store.LoadInfo
	if cfg.Shared == nil { // cluster mode: the engine holds the state (shared.go)
		if err := atomicfile.CheckWriter(filepath.Dir(cfg.StateFile)); err != nil {
			return nil, fmt.Errorf("broker: state_file: %w", err)
		}
		if err := store.CheckStateDir(filepath.Dir(cfg.StateFile)); err != nil {
			return nil, fmt.Errorf("broker: state_file: %w", err)
		}
		if snap, info, err = store.LoadStateInfo(cfg.StateFile); err != nil {
			return nil, fmt.Errorf("broker: %w", err)
		}
	}
	if info.TornBytes > 0 {
		log.Warn().Int("bytes", info.TornBytes).Msg("state journal ends in a write torn by a crash; it was never acknowledged and is ignored")
	}
	state, dropped := store.Restore(snap, hosts, cfg.TableEntries, cfg.MaxCredentialsPerHost, cfg.now())
	// Each host's revokes keep at most its share of the revoked table
	// (store.State.Revoke), so one host cannot fill it for the others.
	state.SetRevokedShare(tableShare(cfg))
	if dropped > 0 {
		log.Warn().Int("dropped", dropped).Msg("state file holds more entries than the configured bounds; the excess was dropped")
	}
	if len(hosts) > cfg.MaxHosts {
		log.Warn().Int("hosts", len(hosts)).Int("max_hosts", cfg.MaxHosts).Msg("hosts file lists more hosts than may be online at once")
	}
	b := &Broker{
		cfg:      cfg,
		log:      log,
		budget:   budget{max: cfg.MaxQueueBytes},
		limiter:  newRateLimiter(cfg.AttemptsPerMinute, cfg.MaxRateSources),
		dummy:    wire.TokenDigest(string(wire.NewToken())),
		hostKeys: hosts,
		hosts:    map[wire.ID]*hostSession{},
		state:    state,
		// Each host keeps its max_hosts-th of the host table (at least 16
		// connection_ids); past it, or with the table full, its own oldest
		// (else the oldest) is forgotten rather than the registration
		// refused (store.NewHostReplayCache says why that is safe).
		hostReplay:   store.NewHostReplayCache(cfg.TableEntries, tableShare(cfg)),
		clientReplay: store.NewReplayCache(cfg.MaxHosts*cfg.ReplayPerHost, cfg.ReplayPerHost, cfg.ReplayPerCredential),
		closedIDs:    store.NewTable[wire.ID, wire.ID](cfg.TableEntries),
		routeLive:    map[wire.Digest]int{},
		pending:      map[msgconn.Conn]struct{}{},
		lookups:      make(chan struct{}, maxLookups),
		stats:        map[string]int64{},
	}
	b.coalesce.New = func() any { buf := make([]byte, 0, cfg.ClientWriteChunk); return &buf }
	b.ctx, b.cancel = context.WithCancel(context.Background())
	var bgCtx context.Context
	bgCtx, b.bgCancel = context.WithCancel(context.Background())
	state.EnableJournal()
	if cfg.Shared != nil {
		b.persist = newSharedWriter(b)
		if err := b.followShared(bgCtx); err != nil {
			b.bgCancel()
			return nil, fmt.Errorf("broker: cluster: %w", err)
		}
	} else {
		p := store.NewPersister(cfg.StateFile, snap.Seq, b.take, b.written, log)
		p.Mark() // the first write compacts: current format, no torn tail
		b.persist = p
	}
	b.bg.Add(2)
	go func() { defer b.bg.Done(); b.persist.Run(bgCtx) }()
	go func() { defer b.bg.Done(); b.janitor(bgCtx) }()
	creds, consumed, revoked := state.Len()
	log.Info().Int("hosts", len(hosts)).Int("credentials", creds).Int("consumed", consumed).
		Int("revoked", revoked).Int("journal_records", info.Records).Bool("old_format", info.Legacy).Msg("reach broker state loaded")
	return b, nil
}

func (b *Broker) janitor(ctx context.Context) {
	t := time.NewTicker(b.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := b.cfg.now()
		b.mu.Lock()
		changed := b.state.Sweep(now)
		b.hostReplay.Sweep(now.Unix())
		b.clientReplay.Sweep(now.Unix())
		b.closedIDs.Sweep(time.Now().UnixNano())
		b.mu.Unlock()
		if changed {
			b.persist.Mark()
		}
	}
}

// Serve runs one socket until it ends: it reads the registration and then
// runs the host registration or the client stream. It returns after the
// socket is closed and every goroutine it started has finished.
func (b *Broker) Serve(ctx context.Context, c msgconn.Conn) {
	if !b.enter(c) {
		c.Close(wire.CloseGoingAway, "shutting down")
		return
	}
	defer b.leave(c)
	// A ctx that already ends with the broker's (connect's) serves the
	// session as it is: the session's watches and timeouts hang off the
	// broker's context, and an idle socket keeps no context, done channel
	// and children map of its own (~370 bytes). Nothing needs a cancel at
	// the end: everything the session starts is stopped, or waited for,
	// before Serve returns. Another ctx gets a child that ends with
	// either.
	if ctx.Done() != b.ctx.Done() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(b.ctx, cancel)
		defer stop()
	}

	// A little more than the largest registration is read, so a frame
	// just over it is answered `unauthorized` and 1008 like any bad
	// registration (ParseRegister refuses it); only a far larger one hits
	// the transport's limit, which closes with 1009 at once.
	c.SetReadLimit(registerReadLimit)
	reg, ok := b.readRegister(ctx, c)
	if !ok {
		return
	}
	if reg.Role == wire.RoleHost {
		b.serveHost(ctx, c, reg)
	} else {
		b.serveClient(ctx, c, reg)
	}
}

func (b *Broker) enter(c msgconn.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return false
	}
	b.sessions.Add(1)
	b.pending[c] = struct{}{}
	return true
}

func (b *Broker) leave(c msgconn.Conn) {
	b.mu.Lock()
	delete(b.pending, c)
	b.mu.Unlock()
	b.sessions.Done()
}

// registerReadLimit bounds the first message: MaxControlBytes plus slack to
// tell "over 4096 bytes" from "far too big".
const registerReadLimit = wire.MaxControlBytes + 4096

// readRegister reads the first message. The 10 s limit is a timer that
// answers `unauthorized` and closes while Read is still blocked, because a
// transport may cut the socket when a read's context ends and the error
// could then not be sent.
func (b *Broker) readRegister(ctx context.Context, c msgconn.Conn) (wire.Register, bool) {
	fired := make(chan struct{})
	t := time.AfterFunc(b.cfg.RegisterTimeout, func() {
		defer close(fired)
		b.refuse(c, &wire.Error{Code: wire.CodeUnauthorized, Detail: "no registration within the timeout"})
	})
	typ, data, err := c.Read(ctx)
	if !t.Stop() {
		<-fired
		return wire.Register{}, false
	}
	if err != nil {
		if errors.Is(err, msgconn.ErrTooBig) {
			b.count("refused:too_big")
			c.Close(wire.CloseTooBig, "")
		} else {
			c.Close(wire.CloseGoingAway, "")
		}
		return wire.Register{}, false
	}
	if typ != msgconn.Text {
		b.refuse(c, &wire.Error{Code: wire.CodeUnauthorized, Detail: "registration is not a text message"})
		return wire.Register{}, false
	}
	reg, err := wire.ParseRegister(data)
	if err != nil {
		b.refuse(c, err)
		return wire.Register{}, false
	}
	return reg, true
}

// refuse answers a registration error and closes with 1008.
func (b *Broker) refuse(c msgconn.Conn, err error) {
	code := wire.CodeUnauthorized
	var we *wire.Error
	if errors.As(err, &we) && we.Code.Known() {
		code = we.Code
	}
	b.count("refused:" + string(code))
	ev := b.log.Debug().Str("remote", c.RemoteAddr()).Str("code", string(code))
	if we != nil && we.Detail != "" {
		ev = ev.Str("why", we.Detail)
	}
	ev.Msg("registration refused")
	msg, _ := wire.Marshal(wire.ErrorMsg{Code: code})
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.WriteTimeout)
	c.Write(ctx, msgconn.Text, msg)
	cancel()
	c.Close(wire.ClosePolicy, "")
}

// registered is the plain-v1 answer to a host registration;
// registeredCredit offers the credit extension (reference connectors
// ignore the key).
var (
	registered, _       = wire.Marshal(wire.Registered{})
	registeredCredit, _ = wire.Marshal(wire.Registered{Extensions: []string{wire.ExtensionCredit}})
)

// serveHost authenticates a host and runs its registration.
func (b *Broker) serveHost(ctx context.Context, c msgconn.Conn, reg wire.Register) {
	var err error
	if b.cfg.Shared != nil {
		err = b.claimHost(ctx, reg)
	}
	var h *hostSession
	if err == nil {
		h, err = b.registerHost(ctx, c, reg)
	}
	if err != nil {
		if errors.Is(err, errShuttingDown) {
			c.Close(wire.CloseGoingAway, wire.ShutdownReason(b.cfg.ShutdownRetryAfter))
			return
		}
		b.refuse(c, err)
		return
	}
	b.count("host:registered")
	h.log.Info().Str("remote", c.RemoteAddr()).Msg("host registered")
	b.holdHost(ctx, h)
	defer b.releaseHost(h)
	c.SetReadLimit(wire.MaxHostFrameIn)
	h.wake.start()
	stopKeepalive := b.keepalive(c, &h.pause, h.done, func() {
		b.count("host:ping_timeout")
		b.endHost(h, hostEnd{code: wire.CloseGoingAway, reason: "ping timeout", cancel: true})
	}).Start(ctx)
	h.readLoop(ctx)
	// The reader returns once the end is decided, except when ctx ended.
	b.endHost(h, hostEnd{code: wire.CloseGoingAway, cancel: true})
	stopKeepalive()
	<-h.writerDone
	h.stopCut()
	h.releaseQueues()
	h.log.Info().Int("close_code", h.end.code).Str("reason", h.end.reason).Msg("host registration ended")
}

var errShuttingDown = errors.New("broker is shutting down")

func (b *Broker) registerHost(ctx context.Context, c msgconn.Conn, reg wire.Register) (*hostSession, error) {
	d := wire.TokenDigest(string(reg.Token))
	now := b.cfg.now().Unix()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closing {
		return nil, errShuttingDown
	}
	if !b.hostTokenOKLocked(reg.HostID, d) {
		return nil, &wire.Error{Code: wire.CodeUnauthorized, Detail: "unknown host or wrong host token"}
	}
	if b.replayed(reg.ConnectionID, now) {
		return nil, &wire.Error{Code: wire.CodeReplayed, Detail: "connection_id already used"}
	}
	old := b.hosts[reg.HostID]
	if old == nil && len(b.hosts) >= b.cfg.MaxHosts {
		return nil, &wire.Error{Code: wire.CodeQuotaExceeded, Detail: "max_hosts online"}
	}
	evicted := b.hostReplay.Evicted
	if !b.hostReplay.Add(reg.ConnectionID, reg.HostID, wire.Digest{}, now+replaySeconds, now) {
		return nil, &wire.Error{Code: wire.CodeQuotaExceeded, Detail: "host replay table full"} // not reached: it makes room
	}
	if b.hostReplay.Evicted != evicted {
		b.count("host:replay_evicted")
	}
	h := b.newHostSession(ctx, c, reg, d)
	if old != nil {
		b.count("host:replaced")
		old.log.Info().Msg("host registration replaced by a newer one")
		b.endHostLocked(old, hostEnd{code: wire.CloseNormal, reason: wire.CloseReasonReplaced})
	}
	b.hosts[reg.HostID] = h
	delete(b.pending, c)
	return h, nil
}

// hostTokenOKLocked (b.mu held) checks a host token's digest in constant
// time, with the same work whether or not the host exists.
func (b *Broker) hostTokenOKLocked(id wire.ID, d wire.Digest) bool {
	want, known := b.hostKeys[id]
	if !known {
		want = b.dummy
	}
	return want.Equal(d) && known
}

// serveClient matches a client to its host and relays its stream.
func (b *Broker) serveClient(ctx context.Context, c msgconn.Conn, reg wire.Register) {
	s, err := b.match(ctx, c, reg)
	if err != nil {
		if errors.Is(err, errNotHere) {
			b.forward(ctx, c, reg)
			return
		}
		if errors.Is(err, errShuttingDown) {
			c.Close(wire.CloseGoingAway, "shutting down")
			return
		}
		b.refuse(c, err)
		return
	}
	b.count("stream:matched")
	s.logged(s.h.log.Debug()).Str("remote", c.RemoteAddr()).Str("kind", string(s.kind)).Msg("stream matched")
	c.SetReadLimit(wire.MaxClientFrame + 1)
	s.run(ctx)
}

// replayed reports whether a host or a client registration already used id
// (b.mu held). Each role adds only to its own table, so clients filling
// theirs never lock hosts out, but an id is accepted once across both.
func (b *Broker) replayed(id wire.ID, now int64) bool {
	return b.hostReplay.Seen(id, now) || b.clientReplay.Seen(id, now)
}

// tableShare is one host's share of a tracking table it fills by its own
// doing (host registrations, revokes): the table over max_hosts, at least
// 16 entries. 100 at the defaults.
func tableShare(cfg Config) int { return max(16, cfg.TableEntries/max(1, cfg.MaxHosts)) }

// replaySeconds is how long an accepted connection_id is remembered.
const replaySeconds = int64(wire.ReplayTTL / time.Second)

// match applies the spec's matching order and, on success, creates the
// stream and queues `open` for the host. A bootstrap is consumed at match
// time, but the host is told `open` only once the consumption is on disk:
// when the state file cannot be written the consumption is undone and the
// client is answered `unavailable`, so a restart can never accept the token
// again and a stream never opens on a use that was not recorded.
func (b *Broker) match(ctx context.Context, c msgconn.Conn, reg wire.Register) (*stream, error) {
	fwd := forwarded(ctx)
	if b.cfg.Shared != nil && !fwd {
		if err := b.claimID(ctx, reg.ConnectionID); err != nil {
			return nil, err
		}
	}
	now := b.cfg.now()
	d := wire.TokenDigest(string(reg.Token))
	b.mu.Lock()
	cred, h, err := b.admitLocked(reg, d, now, fwd, nil)
	if err == errUnknownCredential && b.cfg.Shared != nil {
		// The mirror may lag the engine: read it once (lookupShared).
		b.mu.Unlock()
		found, lerr := b.lookupShared(ctx, d)
		if lerr != nil || found == nil {
			return nil, cmp.Or(lerr, error(errUnknownCredential))
		}
		b.mu.Lock()
		cred, h, err = b.admitLocked(reg, d, now, fwd, found)
	}
	if err == nil && b.cfg.Shared != nil {
		err = b.admitSharedLocked(ctx, h, cred, reg.ConnectionID)
	}
	if err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if cred.Kind != wire.KindBootstrap {
		b.routeLive[d]++
		s := b.openLocked(h, c, cred)
		b.mu.Unlock()
		return s, nil
	}
	if b.cfg.Shared != nil && !b.mirrored(d) {
		// Read from the engine (lookupShared), whose claim above already
		// recorded its use: the mirror holds it just to consume it.
		b.state.ApplyOp(store.Op{Kind: store.OpPutBootstrap, Cred: cred}, now)
	}
	undo, err := b.state.Record(func() error {
		if !b.state.Consume(d, now) {
			return &wire.Error{Code: wire.CodeQuotaExceeded, Detail: "consumed table full"}
		}
		return nil
	})
	if err != nil {
		b.mu.Unlock()
		return nil, err
	}
	ch := b.commitLocked(undo)
	h.mu.Lock()
	h.reserved++ // the stream's slot, held while the consumption is written
	h.mu.Unlock()
	b.mu.Unlock()

	err = b.await(ctx, nil, ch)
	b.mu.Lock()
	defer b.mu.Unlock()
	h.mu.Lock()
	h.reserved--
	ended := h.end != nil
	h.mu.Unlock()
	switch {
	case errors.Is(err, wire.ErrUnavailable):
		return nil, err
	case err != nil || b.closing:
		return nil, errShuttingDown
	case ended:
		// The bootstrap is spent: the host went away while its use was
		// being written. The pairing is repeated with a fresh one.
		return nil, &wire.Error{Code: wire.CodeHostOffline, Detail: "host left while the bootstrap use was written"}
	}
	return b.openLocked(h, c, cred), nil
}

// mirrored (b.mu held) reports whether the state holds credential d.
func (b *Broker) mirrored(d wire.Digest) bool {
	_, ok := b.state.Lookup(d)
	return ok
}

// admitLocked (b.mu held) runs the checks of the matching order and, when
// they pass, records the connection_id. It returns the credential and the
// host to open the stream on. read, when not nil, is the credential of d
// the engine holds (lookupShared) for a mirror that has none.
func (b *Broker) admitLocked(reg wire.Register, d wire.Digest, now time.Time, forwarded bool, read *store.Credential) (store.Credential, *hostSession, error) {
	sec := now.Unix()
	fail := func(code wire.Code, detail string) (store.Credential, *hostSession, error) {
		return store.Credential{}, nil, &wire.Error{Code: code, Detail: detail}
	}
	if b.closing {
		return store.Credential{}, nil, errShuttingDown
	}
	if b.replayed(reg.ConnectionID, sec) {
		return fail(wire.CodeReplayed, "connection_id already used")
	}
	if b.state.IsConsumed(d, now) {
		return fail(wire.CodeReplayed, "bootstrap token already consumed")
	}
	if b.state.IsRevoked(d, now) {
		return fail(wire.CodeRevoked, "credential revoked")
	}
	cred, known := b.state.Lookup(d)
	if !known && read != nil && read.Digest.Equal(d) {
		// As the mirror would have it: only hosts of this hosts file.
		_, known = b.hostKeys[read.HostID]
		cred = *read
	}
	if !known {
		return store.Credential{}, nil, errUnknownCredential
	}
	if cred.ExpiresAt <= sec {
		return fail(wire.CodeExpired, "credential expired")
	}
	if cred.HostID != reg.HostID || cred.Kind != reg.CredentialKind {
		return fail(wire.CodeUnauthorized, "unknown credential, other host or wrong kind")
	}
	if cred.Kind == wire.KindRoute && b.routeLive[d] >= b.cfg.MaxStreamsPerRoute {
		return fail(wire.CodeHostBusy, "route credential at max_streams_per_route")
	}
	h := b.hosts[reg.HostID]
	if h == nil {
		if b.cfg.Forward != nil && !forwarded {
			return store.Credential{}, nil, errNotHere // on another instance, perhaps
		}
		return fail(wire.CodeHostOffline, "host not online")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.end != nil {
		return fail(wire.CodeHostOffline, "host registration ending")
	}
	if len(h.streams)+h.reserved >= b.cfg.MaxStreamsPerHost {
		return fail(wire.CodeHostBusy, "host at max_streams_per_host")
	}
	if len(h.ctrl)-h.replies >= 2*b.cfg.MaxStreamsPerHost {
		// The host does not read its `open` messages: its queue of them
		// stays bounded, and the client is told the host is busy.
		return fail(wire.CodeHostBusy, "host does not read its open messages")
	}
	if b.closedIDs.Room(time.Now().UnixNano()) <= b.live+h.reserved ||
		(cred.Kind == wire.KindBootstrap && !b.state.CanConsume(now)) {
		return fail(wire.CodeQuotaExceeded, "a tracking table is full")
	}
	// Past its credential's or its host's share of the replay cache, a
	// client is refused until entries expire; others are unaffected. In
	// cluster mode the shares are counted in the engine first and the
	// entry added here after (admitSharedLocked).
	if b.cfg.Shared != nil {
		if !b.clientReplay.Room(h.id, d, sec) {
			return fail(wire.CodeQuotaExceeded, "replay cache share of this credential or host is full")
		}
		return cred, h, nil
	}
	if !b.clientReplay.Add(reg.ConnectionID, h.id, d, sec+replaySeconds, sec) {
		return fail(wire.CodeQuotaExceeded, "replay cache share of this credential or host is full")
	}
	return cred, h, nil
}

// openLocked (b.mu held) creates the stream on h and queues `open`.
func (b *Broker) openLocked(h *hostSession, c msgconn.Conn, cred store.Credential) *stream {
	h.mu.Lock()
	defer h.mu.Unlock()
	nowNano := time.Now().UnixNano()
	id := wire.NewID()
	for h.streams[id] != nil || b.closedIDs.Contains(id, nowNano) {
		id = wire.NewID()
	}
	s := b.newStream(id, h, c, cred)
	if h.credit {
		s.startCreditLocked()
	}
	h.streams[id] = s
	b.live++
	delete(b.pending, c) // from now on the host's end closes it
	open, _ := wire.Marshal(wire.Open{StreamID: id, HostConnectionID: h.connID})
	h.ctrl = append(h.ctrl, ctrlItem{msg: open})
	h.wake.kick()
	return s
}

// endStream decides how stream s ends; the stream's writer carries it out.
// It is idempotent: the first decision wins.
func (b *Broker) endStream(s *stream, e streamEnd) {
	b.mu.Lock()
	s.h.mu.Lock()
	b.endStreamLocked(s, e)
	s.h.mu.Unlock()
	b.mu.Unlock()
}

// endStreamLocked needs b.mu and s.h.mu. It removes s from its host's live
// streams, remembers the id as closed by this registration (so late frames
// for it are dropped, not fatal), releases what will not be delivered, and
// wakes the writers that finish the job.
func (b *Broker) endStreamLocked(s *stream, e streamEnd) bool {
	if s.end != nil {
		return false
	}
	h := s.h
	s.end = &e
	close(s.done)
	if h.streams[s.id] == s {
		delete(h.streams, s.id)
	}
	until := time.Now().Add(max(b.cfg.IdleTimeout, 2*b.cfg.PongTimeout)).UnixNano()
	if !b.closedIDs.Add(s.id, h.connID, until, time.Now().UnixNano()) {
		b.log.Warn().Msg("closed-stream table full; late frames for this stream will end the host registration")
	}
	b.live--
	if s.kind == wire.KindRoute {
		if b.routeLive[s.digest]--; b.routeLive[s.digest] <= 0 {
			delete(b.routeLive, s.digest)
		}
	}
	if !e.toHost || e.dropUp {
		h.dropUp(s)
	}
	if e.toHost {
		s.upClose = true
		h.rr.Add(s)
		h.wake.kick()
		if s.credit && len(s.up) > 0 {
			if h.flushing == nil {
				h.flushing = map[wire.ID]*stream{}
			}
			h.flushing[s.id] = s
		}
	}
	if !e.flush {
		s.dropDownLocked()
	} else if !s.credit && s.downBytes > 0 {
		// Its queue still holds part of the host's plain cap: the
		// slow-consumer rule must still see it.
		if h.drainingPlain == nil {
			h.drainingPlain = map[*stream]struct{}{}
		}
		h.drainingPlain[s] = struct{}{}
	}
	if s.credit {
		// Its credit is void now: the room goes to the streams waiting.
		h.creditOut -= s.downWin.Credit()
		h.grantAllLocked(nil)
	}
	if e.cancel && s.writing {
		s.gate.Cut()
	}
	s.downWake.kick()
	if e.stat != "" {
		b.count("stream:" + e.stat)
	}
	return true
}

// endHost decides how host registration h ends; its writer carries it out.
func (b *Broker) endHost(h *hostSession, e hostEnd) {
	b.mu.Lock()
	b.endHostLocked(h, e)
	b.mu.Unlock()
}

// endHostLocked needs b.mu. The host leaves the online table (unless a
// newer registration already took its place) and every stream it carried
// ends: clients get what the host already sent, then 1001.
func (b *Broker) endHostLocked(h *hostSession, e hostEnd) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.end != nil {
		return
	}
	if b.hosts[h.id] == h {
		delete(b.hosts, h.id)
	}
	ids := make([]wire.ID, 0, len(h.streams))
	for id := range h.streams {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return string(ids[i][:]) < string(ids[j][:]) })
	for _, id := range ids {
		s := h.streams[id]
		if e.closeStreams {
			e.closeFrames = append(e.closeFrames, wire.AppendClose(nil, id))
		}
		b.endStreamLocked(s, streamEnd{code: wire.CloseGoingAway, reason: "host offline", flush: true})
	}
	if e.closeStreams {
		// Streams that ended before but whose CLOSE is still queued.
		for _, s := range h.rr.Items() {
			if s.upClose {
				e.closeFrames = append(e.closeFrames, wire.AppendClose(nil, s.id))
			}
		}
	}
	h.end = &e
	close(h.done)
	if e.cancel {
		h.gate.Cut()
	}
	h.wake.kick()
}

// Close stops the broker: new sockets are refused, every host gets CLOSE
// for its streams and close 1001, every client 1001 after the bytes its
// host already sent. It waits up to ShutdownGrace for the close handshakes,
// then cuts what remains, and writes the state file a last time.
func (b *Broker) Close() {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closing = true
		for _, h := range b.hosts {
			// The reason advises when to reconnect (spreading the
			// reconnections of every host over a restart).
			b.endHostLocked(h, hostEnd{code: wire.CloseGoingAway, reason: wire.ShutdownReason(b.cfg.ShutdownRetryAfter), flushCtrl: true, closeStreams: true})
		}
		pending := make([]msgconn.Conn, 0, len(b.pending))
		for c := range b.pending {
			pending = append(pending, c)
		}
		b.mu.Unlock()
		var closers sync.WaitGroup
		for _, c := range pending {
			closers.Add(1)
			go func() { defer closers.Done(); c.Close(wire.CloseGoingAway, "shutting down") }()
		}
		done := make(chan struct{})
		go func() { b.sessions.Wait(); closers.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(b.cfg.ShutdownGrace):
			b.log.Warn().Msg("sockets did not finish closing within the shutdown grace; cutting them")
			b.cancel()
			<-done
		}
		b.cancel()
		b.bgCancel()
		b.bg.Wait()
	})
}

// ReloadHosts re-reads the hosts file (SIGHUP). A host that was removed, or
// whose token digest changed, loses its registration with `revoked`, and the
// credentials of removed hosts are dropped. On a read or parse error the
// old list stays in force.
func (b *Broker) ReloadHosts() error {
	hosts, err := store.LoadHosts(b.cfg.HostsFile)
	if err != nil {
		return fmt.Errorf("broker: reload: %w", err)
	}
	b.mu.Lock()
	added := map[wire.ID]struct{}{}
	for id := range hosts {
		if _, ok := b.hostKeys[id]; !ok {
			added[id] = struct{}{}
		}
	}
	b.hostKeys = hosts
	revoked := 0
	for id, h := range b.hosts {
		if d, ok := hosts[id]; !ok || !d.Equal(h.tokenDigest) {
			revoked++
			b.count("host:revoked")
			b.endHostLocked(h, hostEnd{code: wire.ClosePolicy, reason: wire.CloseReasonRevoked, errMsg: wire.CodeRevoked})
		}
	}
	dropped := b.state.RetainHosts(hosts)
	b.mu.Unlock()
	if dropped > 0 {
		b.persist.Mark()
	}
	b.log.Info().Int("hosts", len(hosts)).Int("registrations_revoked", revoked).Int("credentials_dropped", dropped).Msg("hosts file reloaded")
	if b.cfg.Shared != nil && len(added) > 0 {
		b.loadAddedHosts(added)
	}
	return nil
}

// Stats is a snapshot of the broker's gauges and counted outcomes.
type Stats struct {
	HostsOnline   int
	ActiveStreams int
	QueuedBytes   int64
	// Counts holds counted outcomes by label, e.g. "refused:host_busy",
	// "stream:slow_consumer", "host:replaced", "drop:closed_stream".
	Counts map[string]int64
}

// Stats reports the current gauges and counters.
func (b *Broker) Stats() Stats {
	b.mu.Lock()
	st := Stats{HostsOnline: len(b.hosts), ActiveStreams: b.live}
	b.mu.Unlock()
	st.QueuedBytes = b.budget.inUse()
	b.statsMu.Lock()
	st.Counts = make(map[string]int64, len(b.stats))
	for k, v := range b.stats {
		st.Counts[k] = v
	}
	b.statsMu.Unlock()
	return st
}

func (b *Broker) count(label string) {
	b.statsMu.Lock()
	b.stats[label]++
	b.statsMu.Unlock()
}

// hostLabel hashes a host_id for logs: ids are locators, not secrets, but
// logs shipped elsewhere need not list which hosts a broker serves.
func hostLabel(id wire.ID) string {
	sum := sha256.Sum256(id[:])
	return base64.RawURLEncoding.EncodeToString(sum[:6])
}

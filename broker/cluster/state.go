package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hermes-securelink/securelink/broker/server"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// Options connect one broker instance to the engine (the `cluster:` block
// of the broker's YAML, docs/cluster.md).
type Options struct {
	// InstanceID names this instance; unique per instance.
	InstanceID string
	// URLs are the NATS servers' client URLs.
	URLs []string
	// CredsFile is a NATS user credentials file (optional); CAFile the CA
	// of the servers' TLS certificates (optional).
	CredsFile string
	CAFile    string
	// BucketPrefix names the buckets: <prefix>-state and <prefix>-replay.
	BucketPrefix string
	// Replicas is each bucket's replication (3; 1 only for tests).
	Replicas int
	// Timeout bounds one engine operation; past it the change answers
	// `unavailable`.
	Timeout time.Duration
}

var instanceIDRE = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)

// Validate checks the options (defaults filled in by the caller).
func (o *Options) Validate() error {
	switch {
	case !instanceIDRE.MatchString(o.InstanceID):
		return errors.New("cluster.instance_id must match [a-z0-9-]{1,32}")
	case len(o.URLs) == 0:
		return errors.New("cluster.nats.urls is required")
	case o.Replicas < 1 || o.Replicas > 5:
		return errors.New("cluster.nats.replicas must be 1..5")
	case o.Timeout <= 0 || o.Timeout > time.Minute:
		return errors.New("cluster.engine_timeout must be in (0, 1m]")
	case !keyRE.MatchString(o.BucketPrefix) || strings.Contains(o.BucketPrefix, "."):
		return errors.New("cluster.nats.bucket_prefix must be letters, digits, - and _")
	}
	return nil
}

var keyRE = regexp.MustCompile(`^[-_a-zA-Z0-9]{1,64}$`)

// State is the broker's shared state in two JetStream key-value buckets
// (it implements server.Shared):
//
//	<prefix>-state   c.<digest>  a published credential (TTL: expiry + grace)
//	                 u.<digest>  a consumed bootstrap    (TTL: its expiry)
//	                 r.<digest>  a revoked route         (TTL: its expiry)
//	<prefix>-replay  x.<id>      an accepted connection_id (TTL: 24 h + 5 min)
//
// Every instance mirrors the state bucket (Follow); the replay bucket is
// only ever created into. Values name the instance that wrote them, so an
// instance skips the echo of its own changes.
type State struct {
	opt    Options
	nc     *nats.Conn
	js     jetstream.JetStream
	state  jetstream.KeyValue
	replay jetstream.KeyValue

	// shares caches the replay-share counters this instance wrote; turns
	// orders its changes of each.
	shares shareCache
	turns  shareTurns

	// reloads hands Reload's requests to Follow's goroutine.
	reloads chan reload

	// atomic: the state bucket's stream takes atomic batches (nats-server
	// >= 2.12), so Write makes a change of several ops one batch.
	atomic bool
	// writeHook, in tests, runs in Write after op i was sent (an engine
	// that fails half-way).
	writeHook atomic.Pointer[func(i int)]

	// followGate, in tests, holds back Follow's delivery of live changes
	// until the channel closes (a mirror that lags the engine).
	followGate atomic.Pointer[chan struct{}]
}

// reload is one Reload: the current entries go to apply, then done.
type reload struct {
	ctx   context.Context
	apply func(store.Op)
	done  chan error
}

var _ server.Shared = (*State)(nil)

// Open connects to the engine and creates the buckets if they are absent.
// It waits at most opt.Timeout per step; NATS reconnects on its own later.
func Open(ctx context.Context, opt Options) (*State, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	nopts := []nats.Option{
		nats.Name("securelink-broker " + opt.InstanceID),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.Timeout(opt.Timeout),
		nats.RetryOnFailedConnect(false),
	}
	if opt.CredsFile != "" {
		nopts = append(nopts, nats.UserCredentials(opt.CredsFile))
	}
	if opt.CAFile != "" {
		nopts = append(nopts, nats.RootCAs(opt.CAFile))
	}
	nc, err := nats.Connect(strings.Join(opt.URLs, ","), nopts...)
	if err != nil {
		return nil, fmt.Errorf("cluster: connect: %w", err)
	}
	s := &State{opt: opt, nc: nc, reloads: make(chan reload)}
	if s.js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, err
	}
	bucket := func(name string) (jetstream.KeyValue, error) {
		return createBucket(ctx, s.js, opt, name)
	}
	if s.state, err = bucket("state"); err == nil {
		s.replay, err = bucket("replay")
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("cluster: buckets: %w", err)
	}
	s.atomic = s.allowAtomic(ctx) == nil
	return s, nil
}

// AtomicWrites reports whether Write makes a change of several ops one
// atomic batch (allowAtomic succeeded at Open); false: op by op, as on an
// engine older than nats-server 2.12.
func (s *State) AtomicWrites() bool { return s.atomic }

// allowAtomic turns on atomic batches on the state bucket's stream (the KV
// API has no setting for it, and CreateOrUpdateKeyValue turns it off
// again: every instance's start sets it once more). An engine older than
// nats-server 2.12 refuses it; Write then sends op by op.
func (s *State) allowAtomic(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
	defer cancel()
	st, err := s.js.Stream(cctx, "KV_"+s.state.Bucket())
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	if cfg.AllowAtomicPublish {
		return nil
	}
	cfg.AllowAtomicPublish = true
	_, err = s.js.UpdateStream(cctx, cfg)
	return err
}

// createBucket creates (or updates) bucket <prefix>-name with the
// cluster's settings. A JetStream cluster that is still forming answers
// "no suitable peers" for a while: that is retried for up to
// 5 × engine_timeout.
func createBucket(ctx context.Context, js jetstream.JetStream, opt Options, name string) (jetstream.KeyValue, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*opt.Timeout)
	defer cancel()
	for {
		kv, err := js.CreateOrUpdateKeyValue(cctx, jetstream.KeyValueConfig{
			Bucket:   opt.BucketPrefix + "-" + name,
			Replicas: opt.Replicas,
			Storage:  jetstream.FileStorage,
			History:  1,
			// Per-key TTLs need markers; a marker lives this long.
			LimitMarkerTTL: time.Minute,
		})
		if err == nil || cctx.Err() != nil {
			return kv, err
		}
		select {
		case <-cctx.Done():
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Close disconnects from the engine.
func (s *State) Close() { s.nc.Close() }

// Timeout is Options.Timeout.
func (s *State) Timeout() time.Duration { return s.opt.Timeout }

// record is the value of every key: what the op needs plus the writer.
type record struct {
	By      string    `json:"by"`
	Kind    wire.Kind `json:"kind,omitempty"`
	HostID  string    `json:"host_id,omitempty"`
	ID      string    `json:"id,omitempty"`
	Expires int64     `json:"expires_at"`
	Device  string    `json:"device_id_hash,omitempty"`
}

const (
	preCred     = "c."
	preConsumed = "u."
	preRevoked  = "r."
	preReplay   = "x."
)

// ttlUntil is the key TTL for an entry that matters until unix second exp
// (at least one second: JetStream's smallest).
func ttlUntil(exp int64) time.Duration {
	return max(time.Until(time.Unix(exp, 0)).Round(time.Second), time.Second)
}

// Write makes ops durable. With atomic batches (allowAtomic) the ops of
// one write, in chunks of up to maxAtomicBatch, are one batch each: the
// engine applies all of a chunk or none of it, so an engine failing
// half-way (a route replacement: the new route put, the replaced one
// deleted) leaves neither half visible. Without, each op is acknowledged
// by a quorum of the bucket's replicas before the next is sent.
func (s *State) Write(ctx context.Context, ops []store.Op) error {
	if s.atomic && len(ops) > 1 {
		for len(ops) > 0 {
			n := min(len(ops), maxAtomicBatch)
			if err := s.writeAtomic(ctx, ops[:n]); err != nil {
				return fmt.Errorf("cluster: write: %w", err)
			}
			ops = ops[n:]
		}
		return nil
	}
	for i, op := range ops {
		if _, err := s.js.PublishMsg(ctx, s.opMsg(op)); err != nil {
			return fmt.Errorf("cluster: write: %w", err)
		}
		s.wrote(i)
	}
	return nil
}

// maxAtomicBatch is the engine's largest atomic batch (nats-server's
// default max_batch_size). A write of more ops is atomic per chunk only;
// the broker's writer coalesces the changes made during one write, so a
// write this large takes ~1,000 changes within one engine round trip.
const maxAtomicBatch = 1000

func (s *State) wrote(i int) {
	if h := s.writeHook.Load(); h != nil {
		(*h)(i)
	}
}

// opMsg is op's message on the state bucket's stream: a put with the
// key's TTL, or a KV delete marker.
func (s *State) opMsg(op store.Op) *nats.Msg {
	var key string
	var r record
	var ttl time.Duration
	switch op.Kind {
	case store.OpPutBootstrap, store.OpPutRoute:
		c := op.Cred
		key, ttl = preCred+c.Digest.String(), ttlUntil(c.ExpiresAt+int64(store.ExpiredGrace/time.Second))
		r = record{By: s.opt.InstanceID, Kind: c.Kind, HostID: c.HostID.String(), ID: c.ID, Expires: c.ExpiresAt}
		if c.Kind == wire.KindRoute {
			r.Device = c.DeviceIDHash.String()
		}
	case store.OpDelete:
		m := nats.NewMsg("$KV." + s.state.Bucket() + "." + preCred + op.Digest.String())
		m.Header.Set("KV-Operation", "DEL")
		return m
	case store.OpConsumed, store.OpRevoked:
		key = preConsumed + op.Digest.String()
		if op.Kind == store.OpRevoked {
			key = preRevoked + op.Digest.String()
		}
		r, ttl = record{By: s.opt.InstanceID, Expires: op.ExpiresAt}, ttlUntil(op.ExpiresAt)
	}
	m := nats.NewMsg("$KV." + s.state.Bucket() + "." + key)
	m.Data, _ = json.Marshal(r)
	m.Header.Set(jetstream.MsgTTLHeader, ttl.String())
	return m
}

// batchAck is the engine's answer to a batch's commit.
type batchAck struct {
	Error *jetstream.APIError `json:"error"`
	Batch string              `json:"batch"`
	Count int                 `json:"count"`
}

// writeAtomic sends ops as one atomic batch: every message but the last
// without waiting, the last with the commit, whose answer says whether the
// engine applied them all. A batch the engine never sees committed (the
// connection lost half-way) is dropped by it, unapplied. A stream whose
// atomic batches were turned off meanwhile (an instance's start, see
// allowAtomic) has them turned on again and is sent the batch once more.
func (s *State) writeAtomic(ctx context.Context, ops []store.Op) error {
	for try := 0; ; try++ {
		err := s.sendBatch(ctx, ops)
		var api *jetstream.APIError
		if try == 0 && errors.As(err, &api) && api.ErrorCode == atomicDisabled {
			if s.allowAtomic(ctx) == nil {
				continue
			}
		}
		return err
	}
}

// atomicDisabled is nats-server's JSAtomicPublishDisabledErr.
const atomicDisabled jetstream.ErrorCode = 10174

func (s *State) sendBatch(ctx context.Context, ops []store.Op) error {
	id := wire.NewID().String()
	for i, op := range ops {
		m := s.opMsg(op)
		m.Header.Set("Nats-Batch-Id", id)
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		if i < len(ops)-1 {
			if err := s.nc.PublishMsg(m); err != nil {
				return err
			}
			s.wrote(i)
			continue
		}
		m.Header.Set("Nats-Batch-Commit", "1")
		resp, err := s.nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			return err
		}
		var ack batchAck
		switch {
		case json.Unmarshal(resp.Data, &ack) != nil:
			return errors.New("cluster: unreadable batch acknowledgement")
		case ack.Error != nil:
			return ack.Error
		case ack.Batch != id || ack.Count != len(ops):
			return fmt.Errorf("cluster: batch acknowledged with %d of %d ops", ack.Count, len(ops))
		}
	}
	return nil
}

// publishTTL stores key in kv with a per-key TTL (the KV API's Put takes
// none; this is its message with the TTL header), under the further
// conditions opts add, and returns the entry's revision.
func (s *State) publishTTL(ctx context.Context, kv jetstream.KeyValue, key string, data []byte, ttl time.Duration, opts ...jetstream.PublishOpt) (uint64, error) {
	ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + kv.Bucket() + "." + key, Data: data},
		append(opts, jetstream.WithMsgTTL(ttl))...)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// create is the engine's compare-and-set: it stores key only if it is
// absent (or deleted, or expired) and reports false when it exists.
func (s *State) create(ctx context.Context, kv jetstream.KeyValue, key string, exp int64) (bool, error) {
	b, _ := json.Marshal(record{By: s.opt.InstanceID, Expires: exp})
	_, err := kv.Create(ctx, key, b, jetstream.KeyTTL(ttlUntil(exp)))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	}
	return false, err
}

// ClaimConnectionID creates x.<id> in the replay bucket.
func (s *State) ClaimConnectionID(ctx context.Context, id wire.ID, exp time.Time) (bool, error) {
	return s.create(ctx, s.replay, preReplay+id.String(), exp.Unix())
}

// ClaimConsumed creates u.<digest> in the state bucket, which every
// instance mirrors as a consumed digest.
func (s *State) ClaimConsumed(ctx context.Context, d wire.Digest, exp time.Time) (bool, error) {
	return s.create(ctx, s.state, preConsumed+d.String(), exp.Unix())
}

// LookupCredential reads c.<digest> from the state bucket.
func (s *State) LookupCredential(ctx context.Context, d wire.Digest) (store.Credential, bool, error) {
	e, err := s.state.Get(ctx, preCred+d.String())
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return store.Credential{}, false, nil
	case err != nil:
		return store.Credential{}, false, err
	}
	op, ok := s.decode(e, false)
	if !ok || (op.Kind != store.OpPutBootstrap && op.Kind != store.OpPutRoute) {
		return store.Credential{}, false, nil
	}
	return op.Cred, true, nil
}

// Follow delivers every entry of the state bucket, returns once the
// current ones are delivered, and then delivers changes other instances
// make until ctx ends. A deleted or expired credential is delivered as
// OpDelete; expired consumed and revoked digests are left to the mirror's
// own expiry.
func (s *State) Follow(ctx context.Context, apply func(store.Op)) error {
	w, err := s.state.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("cluster: watch: %w", err)
	}
	ready := make(chan struct{})
	go func() {
		defer w.Stop()
		loaded := false
		for {
			select {
			case <-ctx.Done():
				if !loaded {
					close(ready)
				}
				return
			case rl := <-s.reloads:
				rl.done <- s.current(rl.ctx, rl.apply)
			case e, ok := <-w.Updates():
				if !ok {
					if !loaded {
						close(ready)
					}
					return
				}
				if e == nil { // the current values were all delivered
					if !loaded {
						loaded = true
						close(ready)
					}
					continue
				}
				if g := s.followGate.Load(); g != nil && loaded {
					select {
					case <-*g:
					case <-ctx.Done():
						return
					}
				}
				if op, ok := s.decode(e, loaded); ok {
					apply(op)
				}
			}
		}
	}()
	select {
	case <-ready:
		return ctx.Err()
	case <-time.After(30 * s.opt.Timeout):
		return errors.New("cluster: the state bucket did not load in time")
	}
}

// Reload delivers the state bucket's current entries to apply again, on
// Follow's goroutine between two of its changes: a change Follow delivers
// after them is newer or replays one already in them (and the ones after
// it follow), so a mirror that applies both ends as the engine is. It
// waits for ctx, and needs Follow running.
func (s *State) Reload(ctx context.Context, apply func(store.Op)) error {
	rl := reload{ctx: ctx, apply: apply, done: make(chan error, 1)}
	select {
	case s.reloads <- rl:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-rl.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// current delivers the bucket's current entries (deleted ones skipped).
func (s *State) current(ctx context.Context, apply func(store.Op)) error {
	w, err := s.state.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("cluster: reload: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return errors.New("cluster: reload: the watch ended")
			case e == nil:
				return nil
			}
			if op, ok := s.decode(e, false); ok {
				apply(op)
			}
		}
	}
}

// decode turns a bucket entry into an op; live updates this instance wrote
// itself are skipped (its mirror applied them first).
func (s *State) decode(e jetstream.KeyValueEntry, live bool) (store.Op, bool) {
	key := e.Key()
	if len(key) < 2 {
		return store.Op{}, false
	}
	d, err := wire.ParseDigest(key[2:])
	if err != nil {
		return store.Op{}, false
	}
	if e.Operation() != jetstream.KeyValuePut {
		if strings.HasPrefix(key, preCred) {
			return store.Op{Kind: store.OpDelete, Digest: d}, true
		}
		return store.Op{}, false
	}
	var r record
	if json.Unmarshal(e.Value(), &r) != nil || (live && r.By == s.opt.InstanceID) {
		return store.Op{}, false
	}
	switch key[:2] {
	case preConsumed:
		return store.Op{Kind: store.OpConsumed, Digest: d, ExpiresAt: r.Expires}, true
	case preRevoked:
		return store.Op{Kind: store.OpRevoked, Digest: d, ExpiresAt: r.Expires}, true
	case preCred:
		c := store.Credential{Kind: r.Kind, ID: r.ID, Digest: d, ExpiresAt: r.Expires}
		if c.HostID, err = wire.ParseID(r.HostID); err != nil || !wire.ValidLabel(r.ID) {
			return store.Op{}, false
		}
		switch r.Kind {
		case wire.KindBootstrap:
			c.MaxUses = 1
			return store.Op{Kind: store.OpPutBootstrap, Cred: c}, true
		case wire.KindRoute:
			if c.DeviceIDHash, err = wire.ParseDigest(r.Device); err != nil {
				return store.Op{}, false
			}
			return store.Op{Kind: store.OpPutRoute, Cred: c}, true
		}
	}
	return store.Op{}, false
}

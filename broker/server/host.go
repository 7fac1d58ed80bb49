package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/store"
	"github.com/hermes-securelink/securelink/broker/wire"
)

// hostSession is one live host registration: the socket that carries the
// host's control channel and the frames of all its streams.
type hostSession struct {
	b           *Broker
	id          wire.ID
	connID      wire.ID
	tokenDigest wire.Digest
	conn        msgconn.Conn
	log         zerolog.Logger
	pause       msgconn.Pause

	wake       *writer       // runs writeLoop while it has work or must end
	replySpace chan struct{} // capacity 1: a reply left the queue
	done       chan struct{} // closed once the end is decided
	// gate bounds the writer's writes by WriteTimeout; Cut ends them
	// (immediate ends). The session's context ending cuts the socket
	// (stopCut undoes that), so the reader reads under a context that
	// never ends and the transport watches none per message.
	gate       *msgconn.WriteGate
	stopCut    func() bool
	writerDone chan struct{} // closed once the writer closed the socket

	// Writer-only (one writeLoop at a time): a write failed, so only the
	// close is attempted; the close is done; the item being written.
	broken, finished bool
	item             outItem

	mu      sync.Mutex // guards everything below and the queues of its streams
	ctrl    []ctrlItem // text messages in order: registered, replies, opens
	replies int        // replies in ctrl
	// reserved counts stream slots held by bootstrap matches whose
	// consumption is being written.
	reserved int
	streams  map[wire.ID]*stream
	rr       msgconn.RoundRobin[*stream] // streams with host-bound frames or a CLOSE to send
	upBytes  int                         // all host-bound queues together
	upSpace  broadcast                   // fired whenever host-bound space frees
	// downPlain is the client-bound bytes queued for plain v1 streams,
	// capped by HostQueueBytes like the host-bound ones (credit streams
	// are capped by HostCreditBytes); downSpace fires when it shrinks.
	downPlain int
	downSpace broadcast
	// drainingPlain holds the plain streams that ended with their
	// client-bound queue still to be delivered (the host's CLOSE): their
	// bytes stay in downPlain until written, so the slow-consumer rule
	// looks at them as at the live ones (stalestPlainLocked). A stream
	// leaves once its queue is empty or dropped (dropDownLocked).
	drainingPlain map[*stream]struct{}
	end           *hostEnd

	// The credit extension. offered: registered offered it. credit: the
	// host agreed, so every stream of this registration runs under it;
	// grants are the streams with a WINDOW to send; downHeld is the
	// client-bound bytes queued for credit streams and creditOut the
	// credit the host still holds on its live ones (together capped by
	// HostCreditBytes through withheld grants, grantAllLocked); due are the
	// streams with drained bytes not yet granted back, in order.
	offered   bool
	credit    bool
	grants    []*stream
	downHeld  int
	creditOut int
	due       []*stream
	// flushing holds ended credit streams whose host-bound bytes still
	// wait for credit, so the host's WINDOW still reaches them.
	flushing map[wire.ID]*stream

	// Reader-only: frames read so far, and the dialect they are parsed in.
	framesIn int
	dialect  wire.Dialect
}

type ctrlItem struct {
	msg   []byte
	reply bool
}

// hostEnd says how a host registration ends.
type hostEnd struct {
	code   int
	reason string
	// errMsg, when set, is sent as an error message before the close.
	errMsg wire.Code
	// flushCtrl sends the control messages already queued (replies to
	// earlier control frames) before errMsg, so replies stay in order.
	flushCtrl bool
	// closeStreams sends CLOSE for every live stream before the close
	// (broker shutdown); closeFrames holds them once decided.
	closeStreams bool
	closeFrames  [][]byte
	// cancel cuts a write in progress: the peer is dead or the socket
	// already broken, so finishing a large frame is pointless. Never for
	// `replaced` or `revoked`: the WebSocket transport cuts the whole
	// socket when a write's context ends (even a write whose bytes have
	// all left), and the connector needs that close reason to pick its
	// back-off; the write in progress is bounded by WriteTimeout anyway.
	cancel bool
}

func (b *Broker) newHostSession(ctx context.Context, c msgconn.Conn, reg wire.Register, d wire.Digest) *hostSession {
	answer := registered
	if !b.cfg.DisableCredit {
		answer = registeredCredit
	}
	h := &hostSession{
		b:           b,
		id:          reg.HostID,
		connID:      reg.ConnectionID,
		tokenDigest: d,
		conn:        c,
		log:         b.log.Hook(logField{"host", hostLabel(reg.HostID)}),
		writerDone:  make(chan struct{}),
		replySpace:  make(chan struct{}, 1),
		done:        make(chan struct{}),
		ctrl:        []ctrlItem{{msg: answer}},
		streams:     map[wire.ID]*stream{},
		offered:     !b.cfg.DisableCredit,
	}
	h.gate = msgconn.NewWriteGate(c)
	h.stopCut = h.gate.CutWhen(ctx)
	h.wake = newWriter(h.writeLoop) // serveHost starts it
	return h
}

// ---------------------------------------------------------------------------
// Reading

// readLoop reads the host socket until the registration ends. Control
// frames are handled one at a time, so their replies leave in order.
func (h *hostSession) readLoop(ctx context.Context) {
	b := h.b
	for {
		typ, data, err := h.conn.Read(context.Background()) // stopCut cuts it
		if err != nil {
			if errors.Is(err, msgconn.ErrTooBig) {
				b.count("host:too_big")
				b.endHost(h, hostEnd{code: wire.CloseTooBig, reason: "message too big", cancel: true})
			} else {
				b.endHost(h, hostEnd{code: wire.CloseGoingAway, cancel: true})
			}
			return
		}
		select {
		case <-h.done:
			return
		default:
		}
		h.framesIn++
		var ok bool
		if typ == msgconn.Text {
			ok = h.control(ctx, data)
		} else {
			ok = h.frame(ctx, data)
		}
		if !ok {
			return
		}
	}
}

// violation ends the registration: error unauthorized, then close 1008.
func (h *hostSession) violation(err error) bool {
	detail := ""
	var we *wire.Error
	if errors.As(err, &we) {
		detail = we.Detail
	}
	h.b.count("host:violation")
	h.log.Warn().Str("why", detail).Msg("host broke the protocol; ending its registration")
	h.b.endHost(h, hostEnd{code: wire.ClosePolicy, reason: "protocol violation", errMsg: wire.CodeUnauthorized, flushCtrl: true})
	return false
}

func (h *hostSession) control(ctx context.Context, data []byte) bool {
	b := h.b
	parse := wire.ParseHostControl
	if h.offered {
		parse = wire.ParseHostControlOffering
	}
	msg, err := parse(data)
	if err != nil {
		var we *wire.Error
		if !errors.As(err, &we) || we.Violation {
			return h.violation(err)
		}
		return h.replyError(ctx, we)
	}
	now := b.cfg.now()
	switch m := msg.(type) {
	case wire.PublishBootstrap:
		err := b.publish(ctx, h, store.Credential{
			Kind: wire.KindBootstrap, HostID: h.id, ID: m.PairingID,
			Digest: m.TokenSHA256, ExpiresAt: m.ExpiresAt,
		}, now)
		if err != nil {
			return h.replyError(ctx, err)
		}
		return h.reply(ctx, wire.Published{CredentialKind: wire.KindBootstrap, Label: m.PairingID})
	case wire.PublishRoute:
		err := b.publish(ctx, h, store.Credential{
			Kind: wire.KindRoute, HostID: h.id, ID: m.CredentialID,
			Digest: m.TokenSHA256, ExpiresAt: m.ExpiresAt, DeviceIDHash: m.DeviceIDHash,
		}, now)
		if err != nil {
			return h.replyError(ctx, err)
		}
		return h.reply(ctx, wire.Published{CredentialKind: wire.KindRoute, Label: m.CredentialID})
	case wire.Revoke:
		if err := b.revoke(ctx, h, m.CredentialID, now); err != nil {
			return h.replyError(ctx, err)
		}
		return h.reply(ctx, wire.Revoked{CredentialID: m.CredentialID})
	case wire.Extensions:
		return h.agree(m)
	}
	return h.violation(&wire.Error{Code: wire.CodeUnauthorized, Detail: "unexpected control message"})
}

// agree handles the host's answer to the offered extensions; it is never
// answered. It must be the host's first frame after registered: the host
// sends it before it handles any open, so every stream of the registration
// is opened after it from the host's side, and the streams the broker
// opened before reading it switch to credit now, their windows net of the
// bytes already sent. Naming an extension that was not offered is a
// framing violation.
func (h *hostSession) agree(m wire.Extensions) bool {
	if h.framesIn != 1 {
		return h.violation(&wire.Error{Code: wire.CodeUnauthorized, Detail: "extensions is not the first frame after registered"})
	}
	for _, x := range m.Names {
		if x != wire.ExtensionCredit {
			return h.violation(&wire.Error{Code: wire.CodeUnauthorized, Detail: "extensions names one that was not offered"})
		}
	}
	if !m.Has(wire.ExtensionCredit) {
		return true
	}
	h.mu.Lock()
	h.credit = true
	for _, s := range h.streams {
		s.startCreditLocked()
	}
	for _, s := range h.rr.Items() {
		s.startCreditLocked()
	}
	h.mu.Unlock()
	h.dialect.Credit = true
	h.b.count("host:credit")
	h.log.Debug().Msg("host agreed to the credit extension")
	return true
}

// grantAllLocked (h.mu held) queues the WINDOW grants that are due once
// stream s's client drained bytes (s nil: only room was freed, a stream
// ended). HostCreditBytes bounds what the host has committed to the
// broker over its credit streams, the bytes queued for their clients
// (downHeld) plus the credit it still holds (creditOut): a grant never
// takes that sum above the cap. The initial windows of new streams count
// too but are the protocol's, not grants (Validate makes the cap hold
// MaxStreamsPerHost of them). Streams whose grant is due wait in h.due in order; when
// the room is short the first of them takes it before any later one, so a
// stream without credit gets some as the others drain. The walk covers only
// the streams in h.due, never all streams.
func (h *hostSession) grantAllLocked(s *stream) {
	if s != nil && s.credit && s.end == nil && !s.dueQueued && s.downWin.Pending() > 0 {
		s.dueQueued = true
		h.due = append(h.due, s)
	}
	room := int64(h.b.cfg.HostCreditBytes - h.downHeld - h.creditOut)
	keep := h.due[:0]
	for i, d := range h.due {
		if d.end != nil {
			d.dueQueued = false
			continue
		}
		if g := d.downWin.Due(room); g > 0 {
			room -= int64(g)
			h.queueGrantLocked(d, g)
		}
		if d.downWin.Pending() == 0 {
			d.dueQueued = false
			continue
		}
		keep = append(keep, d)
		if d.downWin.Pending() > room {
			// Short of room: the later streams wait behind this one.
			keep = append(keep, h.due[i+1:]...)
			break
		}
	}
	clear(h.due[len(keep):])
	h.due = keep
}

// queueGrantLocked (h.mu held) queues a WINDOW of g bytes for s, counted
// in the host's credit.
func (h *hostSession) queueGrantLocked(s *stream, g uint32) {
	h.creditOut += int(g)
	s.grant += g // at most the window, below 2^31
	if !s.grantQueued {
		s.grantQueued = true
		h.grants = append(h.grants, s)
	}
	h.wake.kick()
}

// creditQueueFrames × StreamQueueFrames is how many payloads of at least
// partMin bytes a credit stream's queue holds before it merges them: 128
// of 64 KiB are 8 MiB, above what a grown window (MaxStreamWindow) lets
// the host send ahead.
const creditQueueFrames = 4

// mergeCreditPayload says whether a credit stream's payload of n bytes
// joins the last of the k queued ones (a copy) rather than taking an entry
// of its own. Many small frames: the queue stays at frames entries. Large
// ones each keep their own up to creditQueueFrames × frames (credit bounds
// their bytes): merged, a grown window's 64 KiB payloads made the last
// entry a buffer reallocated and copied at every append, megabytes of it
// per window.
func mergeCreditPayload(k, n, frames int) bool {
	return k >= frames && (n < partMin || k >= creditQueueFrames*frames)
}

// growLocked (h.mu held, credit stream s's client just drained bytes) lets
// the stream's window grow when the host uses it up faster than a grant
// round trip per window while the client keeps up (wire.RecvWindow.Grow):
// at 300-400 MB/s the 256 KiB initial window is about one grant round
// trip, and the host waited on zero credit about half the time. The window
// grows up to Config.MaxStreamWindow, and an increment fits the host's room
// beyond what is already promised: the bytes drained and not yet granted
// back (every window's Pending: the grants they are owed) and the initial
// windows of the streams the host may still open (they take theirs from
// the cap without asking: startCreditLocked). So HostCreditBytes holds as
// for any grant, however many streams open later and whichever windows
// grew. A slow client's window does not grow.
func (h *hostSession) growLocked(s *stream) {
	if s.end != nil {
		return // its credit is void (endStreamLocked)
	}
	c := &h.b.cfg
	owed := 0
	if !s.dueQueued {
		owed = int(s.downWin.Pending())
	}
	for _, d := range h.due { // the streams owed a grant (grantAllLocked)
		if d.end == nil {
			owed += int(d.downWin.Pending())
		}
	}
	unopened := max(0, c.MaxStreamsPerHost-len(h.streams))
	room := c.HostCreditBytes - h.downHeld - h.creditOut - owed - unopened*wire.InitialWindow
	if g := s.downWin.Grow(int64(c.MaxStreamWindow()), int64(room)); g > 0 {
		h.queueGrantLocked(s, g)
		h.b.count("credit:grow") // statsMu is a leaf lock
	}
}

// publish stores a credential and answers only once it is on disk, so the
// host is never told `published` for something a restart would forget; when
// the state file cannot be written the publish is undone and answered
// `unavailable`.
func (b *Broker) publish(ctx context.Context, h *hostSession, c store.Credential, now time.Time) error {
	b.mu.Lock()
	undo, err := b.state.Record(func() error {
		_, err := b.state.Publish(c, now)
		return err
	})
	var ch *change
	if err == nil {
		ch = b.commitLocked(undo)
	}
	b.mu.Unlock()
	if err != nil {
		return err
	}
	if err := b.await(ctx, &h.pause, ch); err != nil {
		return err
	}
	b.count("publish:" + string(c.Kind))
	return nil
}

// revoke deletes a route credential and remembers its digests as revoked;
// once that is on disk it closes the credential's live streams (clients get
// 1008, the host CLOSE) and answers `revoked`. Revoking an unknown
// credential changes nothing and is answered at once.
func (b *Broker) revoke(ctx context.Context, h *hostSession, credentialID string, now time.Time) error {
	b.mu.Lock()
	var digests []wire.Digest
	undo, err := b.state.Record(func() (err error) {
		digests, err = b.state.Revoke(h.id, credentialID, now)
		return err
	})
	if err != nil {
		b.mu.Unlock()
		return err
	}
	var ch *change
	if len(digests) > 0 {
		ch = b.commitLocked(undo)
	}
	b.mu.Unlock()
	if ch != nil {
		if err := b.await(ctx, &h.pause, ch); err != nil {
			return err
		}
	}
	b.mu.Lock()
	h.mu.Lock()
	b.endRevokedLocked(h, digests)
	h.mu.Unlock()
	b.mu.Unlock()
	b.count("revoke")
	return nil
}

// endRevokedLocked (b.mu and h.mu held) closes h's route streams of the
// revoked digests: clients get 1008, the host CLOSE.
func (b *Broker) endRevokedLocked(h *hostSession, digests []wire.Digest) {
	var victims []*stream
	for _, s := range h.streams {
		if s.kind != wire.KindRoute {
			continue
		}
		for _, d := range digests {
			if s.digest.Equal(d) {
				victims = append(victims, s)
				break
			}
		}
	}
	for _, s := range victims {
		b.endStreamLocked(s, streamEnd{code: wire.ClosePolicy, reason: "revoked", toHost: true, dropUp: true, stat: "revoked"})
	}
}

func (h *hostSession) replyError(ctx context.Context, err error) bool {
	code := wire.CodeUnauthorized
	var we *wire.Error
	if errors.As(err, &we) && we.Code.Known() {
		code = we.Code
	}
	h.b.count("control_error:" + string(code))
	if we != nil {
		h.log.Debug().Str("code", string(code)).Str("why", we.Detail).Msg("control message refused")
	}
	return h.reply(ctx, wire.ErrorMsg{Code: code})
}

// reply queues one answer to a control frame. When the host does not read
// its answers, the queue fills and this reader stops reading the host's
// socket until it does.
func (h *hostSession) reply(ctx context.Context, m wire.Message) bool {
	msg, err := wire.Marshal(m)
	if err != nil {
		h.log.Error().Err(err).Msg("cannot encode a control reply")
		return h.violation(err)
	}
	for {
		h.mu.Lock()
		if h.end != nil {
			h.mu.Unlock()
			return false
		}
		if h.replies < h.b.cfg.MaxPendingReplies {
			h.ctrl = append(h.ctrl, ctrlItem{msg: msg, reply: true})
			h.replies++
			h.mu.Unlock()
			h.wake.kick()
			return true
		}
		h.mu.Unlock()
		h.pause.Enter()
		select {
		case <-h.replySpace:
		case <-h.done:
		case <-ctx.Done():
		}
		h.pause.Leave()
		if ctx.Err() != nil {
			return false
		}
	}
}

// frame handles one binary frame from the host.
func (h *hostSession) frame(ctx context.Context, data []byte) bool {
	b := h.b
	f, err := h.dialect.ParseFrame(data)
	if err != nil {
		return h.violation(err)
	}
	h.mu.Lock()
	s := h.streams[f.StreamID]
	if f.Flags == wire.FlagWindow && s == nil {
		s = h.flushing[f.StreamID]
	}
	if s != nil && f.Flags == wire.FlagWindow {
		err := s.upWin.Grant(f.Increment())
		if err == nil && len(s.up) > 0 {
			h.rr.Add(s)
			h.wake.kick()
		}
		h.mu.Unlock()
		if err != nil {
			return h.violation(err)
		}
		signal(s.upCredit)
		return true
	}
	if s != nil && f.Flags == wire.FlagData && s.credit && !s.downWin.Receive(len(f.Payload)) {
		h.mu.Unlock()
		return h.violation(&wire.Error{Code: wire.CodeUnauthorized, Detail: "DATA beyond the credit the broker granted"})
	}
	h.mu.Unlock()
	if s == nil {
		// Not live: either this registration's stream that the broker
		// already closed (both ends often close at once: drop it), or a
		// stream it never had (a protocol error). Streams are removed from
		// h.streams and added to closedIDs in one b.mu section, so a miss
		// above is always visible here.
		b.mu.Lock()
		owner, ok := b.closedIDs.Get(f.StreamID, time.Now().UnixNano())
		b.mu.Unlock()
		if ok && owner == h.connID {
			// Includes WINDOW for a closed stream, which is ignored.
			b.count("drop:closed_stream")
			return true
		}
		return h.violation(&wire.Error{Code: wire.CodeUnauthorized, Detail: "frame for a stream this registration never opened"})
	}
	if f.Flags == wire.FlagClose {
		b.endStream(s, streamEnd{code: wire.CloseNormal, flush: true, stat: "host_close"})
		return true
	}
	s.touch()
	return h.enqueueDown(ctx, s, h.keepPayload(f.Payload))
}

// keepPayload returns a payload the queue may keep (the stream's writeLoop
// gives it back once written): the transport's read buffer itself when it
// hands it over (msgconn.Owner), the payload being its tail; else a copy,
// since the payload aliases a buffer lent only until the next Read.
func (h *hostSession) keepPayload(payload []byte) []byte {
	if o, ok := h.conn.(msgconn.Owner); ok {
		if buf := o.Take(); buf != nil {
			return buf[len(buf)-len(payload):]
		}
	}
	p := getFrame(len(payload))
	copy(p, payload)
	return p
}

// enqueueDown queues DATA for stream s's client. When that queue is full the
// host socket is not read until it drains (plain v1 has no better option);
// if the client makes no progress for SlowConsumerTimeout, its stream is
// closed with 1013 so the host's other streams continue.
//
// Under credit the queue never waits for the client: the host cannot send
// more than the window the broker granted as the client drained, so the
// queue is bounded by it, and the host socket goes on for the other
// streams. Only the broker-wide budget can pause the reader then.
func (h *hostSession) enqueueDown(ctx context.Context, s *stream, payload []byte) bool {
	b := h.b
	n := len(payload)
	var waitStart time.Time
	for {
		h.mu.Lock()
		if s.end != nil {
			if s.credit {
				h.creditOut -= n // see below
				h.grantAllLocked(nil)
			}
			h.mu.Unlock()
			return true // the stream ended meanwhile: drop, like a late frame
		}
		if s.credit {
			ok, ch := b.budget.acquire(n)
			if ok {
				// The bytes move from the host's credit to the queue in
				// one step (creditOut counts them until here, although
				// downWin took them when they arrived), so no grant
				// overtakes them.
				h.creditOut -= n
				if k := len(s.down); mergeCreditPayload(k, n, b.cfg.StreamQueueFrames) {
					s.down[k-1] = append(s.down[k-1], payload...)
					putFrame(payload) // copied
				} else {
					s.down = append(s.down, payload)
				}
				s.downBytes += n
				h.downHeld += n
				h.mu.Unlock()
				s.downWake.kick()
				return true
			}
			h.mu.Unlock()
			if waitStart.IsZero() {
				waitStart = time.Now()
				b.count("paused:host")
			}
			h.pause.Enter()
			select {
			case <-ch:
			case <-s.done:
			case <-h.done:
			case <-ctx.Done():
			}
			h.pause.Leave()
			if isDone(h.done) || ctx.Err() != nil {
				return false
			}
			continue
		}
		streamFits := len(s.down) == 0 ||
			(len(s.down) < b.cfg.StreamQueueFrames && s.downBytes+n <= b.cfg.StreamQueueBytes)
		// All of a host's plain client-bound queues together hold at most
		// HostQueueBytes, as its host-bound ones do: else its 16 streams
		// could keep 16 × 8 MiB queued.
		hostFits := h.downPlain == 0 || h.downPlain+n <= b.cfg.HostQueueBytes
		fits := streamFits && hostFits
		var wait <-chan struct{}
		// slow is the stream whose client must make progress for this one
		// to go on: this one when its own queue is full, else the host's
		// stream with queued bytes that progressed least recently.
		var slow *stream
		switch {
		case fits:
			ok, ch := b.budget.acquire(n)
			if ok {
				s.down = append(s.down, payload)
				s.downBytes += n
				h.downPlain += n
				h.mu.Unlock()
				s.downWake.kick()
				return true
			}
			wait = ch
		case !streamFits:
			wait, slow = s.downSpace, s
		default:
			wait, slow = h.downSpace.wait(), h.stalestPlainLocked()
		}
		h.mu.Unlock()

		now := time.Now()
		if waitStart.IsZero() {
			waitStart = now
			b.count("paused:host")
		}
		var timeout <-chan time.Time
		var timer *time.Timer
		if slow != nil {
			last := waitStart
			if p := time.Unix(0, slow.lastProgress.Load()); p.After(last) {
				last = p
			}
			stalled := now.Sub(last)
			if stalled >= b.cfg.SlowConsumerTimeout {
				slow.logged(slow.h.log.Info()).Dur("stalled", stalled).Msg("client made no progress on its full queue; closing its stream")
				// No cancel: the client's writer is stuck in a write, and
				// cutting it tears the socket down, so the 1013 would never
				// arrive. The write finishes if the client reads again (then
				// 1013 follows) or fails after WriteTimeout; the queued data
				// is released now either way.
				b.endSlow(slow)
				if slow == s {
					return true
				}
				continue // the host's queues have room again
			}
			timer = time.NewTimer(b.cfg.SlowConsumerTimeout - stalled)
			timeout = timer.C
		}
		h.pause.Enter()
		select {
		case <-wait:
		case <-timeout:
		case <-s.done:
		case <-h.done:
		case <-ctx.Done():
		}
		h.pause.Leave()
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-h.done:
			return false
		case <-ctx.Done():
			return false
		default:
		}
	}
}

// stalestPlainLocked (h.mu held) is the plain stream with client-bound
// bytes queued whose client progressed least recently, nil when none: a
// live one or one the host already closed whose queue still drains. Every
// byte in downPlain is queued for one of them, so while the host waits on
// its cap there is always one to time.
func (h *hostSession) stalestPlainLocked() *stream {
	var slow *stream
	var at int64
	pick := func(o *stream) {
		if o.credit || o.downBytes == 0 {
			return
		}
		if p := o.lastProgress.Load(); slow == nil || p < at {
			slow, at = o, p
		}
	}
	for _, o := range h.streams {
		pick(o)
	}
	for o := range h.drainingPlain {
		pick(o)
	}
	return slow
}

// endSlow closes stream s, whose client made no progress on the queue the
// host waits behind, with 1013 and drops that queue. A stream the host
// already closed, still delivering its queue, ends so too: its client gets
// 1013 instead of the rest, and the host, which closed it, no CLOSE.
func (b *Broker) endSlow(s *stream) {
	e := streamEnd{code: wire.CloseTryAgain, reason: "slow consumer", toHost: true, stat: "slow_consumer"}
	h := s.h
	b.mu.Lock()
	h.mu.Lock()
	if !b.endStreamLocked(s, e) && s.end.flush && s.downBytes > 0 {
		e.toHost = false
		s.end = &e
		s.dropDownLocked()
		s.downWake.kick()
		b.count("stream:" + e.stat)
	}
	h.mu.Unlock()
	b.mu.Unlock()
}

// ---------------------------------------------------------------------------
// Writing

type outItem struct {
	typ    msgconn.MessageType
	data   []byte
	budget int  // bytes to return to the broker budget once written
	whole  bool // data is a whole queued frame: its buffer goes back once written
}

// writeLoop is the only goroutine that writes to the host socket: control
// messages first, in order, then stream frames round-robin, one frame per
// turn, so one bulk upload cannot starve another stream. It runs while
// there is something to write (h.wake) and returns once there is not, true
// once the socket is closed.
//
// What is queued leaves in as few socket writes as the transport allows
// (msgconn.Batcher): held from the first item, sent once the queue is
// empty, before the writer returns.
func (h *hostSession) writeLoop() (closed bool) {
	b := h.b
	batch, _ := h.conn.(msgconn.Batcher)
	held := false
	send := func() {
		held = false
		if err := h.gate.SendHeld(b.cfg.WriteTimeout); err != nil {
			h.writeFailed()
		}
	}
	for !h.finished {
		item, fin := h.next(h.broken)
		if fin != nil {
			if held {
				send()
			}
			h.finished = true
			h.finish(fin, h.broken)
			close(h.writerDone)
			return true
		}
		if item == nil {
			if held {
				send()
				continue
			}
			return false
		}
		if batch != nil && !held && !h.broken {
			batch.HoldWrites()
			held = true
		}
		err := h.gate.Write(item.typ, item.data, b.cfg.WriteTimeout, nil)
		b.budget.release(item.budget)
		if item.whole {
			putFrame(item.data)
		}
		if err != nil {
			h.writeFailed()
		}
	}
	return true
}

// writeFailed (writer only) ends the registration once a write to the host
// failed; from then on only the close is attempted.
func (h *hostSession) writeFailed() {
	if h.broken {
		return
	}
	h.broken = true
	h.b.endHost(h, hostEnd{code: wire.CloseGoingAway, reason: "write failed", cancel: true})
}

// out is what next returns: the writer's one item, reused (writer only).
func (h *hostSession) out(it outItem) *outItem {
	h.item = it
	return &h.item
}

// next picks what to write. It returns the end decision once nothing more
// is to be written before the close (at once when a write already failed).
func (h *hostSession) next(broken bool) (*outItem, *hostEnd) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.end != nil && (broken || !h.end.flushCtrl) {
		return nil, h.end
	}
	if len(h.ctrl) > 0 {
		it := h.ctrl[0]
		h.ctrl[0] = ctrlItem{}
		h.ctrl = h.ctrl[1:]
		if it.reply {
			h.replies--
			signal(h.replySpace)
		}
		return h.out(outItem{typ: msgconn.Text, data: it.msg}), nil
	}
	if h.end != nil {
		return nil, h.end
	}
	for len(h.grants) > 0 {
		s := h.grants[0]
		h.grants[0] = nil
		h.grants = h.grants[1:]
		inc := s.grant
		s.grant, s.grantQueued = 0, false
		if s.end != nil {
			continue // its CLOSE follows or went out: no more credit needed
		}
		f, _ := wire.AppendWindow(nil, s.id, inc)
		return h.out(outItem{typ: msgconn.Binary, data: f}), nil
	}
	for h.rr.Len() > 0 {
		s := h.rr.Current()
		if len(s.up) > 0 {
			f := s.up[0]
			if s.upRehead {
				putDataHeader(f, s.id)
				s.upRehead = false
			}
			payload := len(f) - wire.HeaderLen
			if s.credit {
				avail := s.upWin.Avail()
				if avail == 0 {
					// Waits for a WINDOW (which queues it again); its
					// CLOSE waits behind its bytes.
					h.rr.Remove()
					continue
				}
				if k := avail; k < payload {
					// Cut the frame to the credit. The rest keeps its place;
					// its header is written over bytes of this frame once
					// this write is done (the next call).
					s.upWin.Take(k)
					s.upSent += int64(k)
					s.upPayload -= k
					s.up[0] = f[k:]
					s.upRehead = true
					s.upBytes -= k
					h.upBytes -= k
					h.upSpace.fire()
					h.rr.Advance()
					return h.out(outItem{typ: msgconn.Binary, data: f[:wire.HeaderLen+k], budget: k}), nil
				}
				s.upWin.Take(payload)
			}
			s.upSent += int64(payload)
			s.upPayload -= payload
			s.up = popFront(s.up)
			s.upBytes -= len(f)
			h.upBytes -= len(f)
			h.upSpace.fire()
			if len(s.up) == 0 && !s.upClose {
				h.rr.Remove()
			} else {
				h.rr.Advance()
			}
			return h.out(outItem{typ: msgconn.Binary, data: f, budget: len(f), whole: true}), nil
		}
		if s.upClose {
			s.upClose = false
			delete(h.flushing, s.id)
			h.rr.Remove()
			return h.out(outItem{typ: msgconn.Binary, data: wire.AppendClose(nil, s.id)}), nil
		}
		h.rr.Remove()
	}
	return nil, nil
}

func (h *hostSession) finish(e *hostEnd, broken bool) {
	b := h.b
	if broken {
		h.conn.Close(e.code, e.reason)
		return
	}
	write := func(typ msgconn.MessageType, data []byte) {
		ctx, cancel := context.WithTimeout(b.ctx, b.cfg.WriteTimeout)
		h.conn.Write(ctx, typ, data)
		cancel()
	}
	if e.errMsg != "" {
		msg, _ := wire.Marshal(wire.ErrorMsg{Code: e.errMsg})
		write(msgconn.Text, msg)
	}
	for _, f := range e.closeFrames {
		write(msgconn.Binary, f)
	}
	h.conn.Close(e.code, e.reason)
}

// dropUp discards stream s's host-bound frames (h.mu held).
func (h *hostSession) dropUp(s *stream) {
	if s.upBytes == 0 {
		return
	}
	h.b.budget.release(s.upBytes)
	h.upBytes -= s.upBytes
	s.up, s.upBytes, s.upPayload, s.upRehead = nil, 0, 0, false
	delete(h.flushing, s.id)
	h.upSpace.fire()
}

// releaseQueues returns the budget of frames that will never be written,
// once the writer has exited.
func (h *hostSession) releaseQueues() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.rr.Items() {
		h.dropUp(s)
	}
	h.rr.Clear()
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

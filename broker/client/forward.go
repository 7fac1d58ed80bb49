package client

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/broker/wire"
)

// Defaults of ForwardOptions.
const (
	DefaultMaxConns         = wire.MaxStreamsPerRoute
	DefaultHalfCloseTimeout = 30 * time.Second
	DefaultAcceptRetryDelay = 100 * time.Millisecond
)

// forwardBuffer is the copy buffer per direction and connection; it is
// also the largest message Forward writes to the broker.
const forwardBuffer = 32 << 10

// ForwardOptions configures Forward.
type ForwardOptions struct {
	// Candidate names the broker, host and credential (ParseCandidate).
	Candidate Candidate
	// MaxConns bounds concurrent local connections; more are accepted and
	// closed at once with a log line. Default 4, the broker's limit of
	// streams per route credential.
	MaxConns int
	// Log receives one line per connection and every refusal; never a token.
	Log zerolog.Logger
	// RootCAs verifies the broker; nil means the system roots.
	RootCAs *x509.CertPool
	// DialTimeout and RegisterTimeout are passed to Dial (0 = 10 s each).
	DialTimeout     time.Duration
	RegisterTimeout time.Duration
	// HalfCloseTimeout: the protocol has no half-close, so after one side
	// finished sending, the other is given this long without traffic to
	// finish too before the connection is closed. Default 30 s.
	HalfCloseTimeout time.Duration
	// AcceptRetryDelay is the first wait after a failed Accept (doubling up
	// to 1 s), e.g. when the process is out of file descriptors.
	// Default 100 ms.
	AcceptRetryDelay time.Duration
	// WrapOuter is passed to Config.WrapOuter (tests, diagnostics).
	WrapOuter func(net.Conn) net.Conn
}

func (o ForwardOptions) withDefaults() ForwardOptions {
	if o.MaxConns == 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.HalfCloseTimeout == 0 {
		o.HalfCloseTimeout = DefaultHalfCloseTimeout
	}
	if o.AcceptRetryDelay == 0 {
		o.AcceptRetryDelay = DefaultAcceptRetryDelay
	}
	return o
}

// Validate checks the options and the candidate.
func (o ForwardOptions) Validate() error {
	o = o.withDefaults()
	var errs []error
	if err := o.Candidate.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.MaxConns < 1 || o.MaxConns > 1024 {
		errs = append(errs, fmt.Errorf("max connections must be 1..1024, not %d", o.MaxConns))
	}
	if o.HalfCloseTimeout < 0 || o.AcceptRetryDelay < 0 || o.DialTimeout < 0 || o.RegisterTimeout < 0 {
		errs = append(errs, errors.New("forward timeouts must not be negative"))
	}
	return errors.Join(errs...)
}

func (o ForwardOptions) config() Config {
	cfg := CandidateConfig(o.Candidate)
	cfg.RootCAs = o.RootCAs
	cfg.DialTimeout = o.DialTimeout
	cfg.RegisterTimeout = o.RegisterTimeout
	cfg.Log = o.Log
	cfg.WrapOuter = o.WrapOuter
	return cfg
}

// errBootstrapSpent is why later connections of a bootstrap candidate are
// refused.
var errBootstrapSpent = errors.New("the bootstrap credential is spent: it serves exactly one connection; run `securelink pair` for a fresh one")

// forwarder is one running Forward.
type forwarder struct {
	o   ForwardOptions
	cfg Config
	log zerolog.Logger
	seq atomic.Uint64

	bootstrap bool
	attempt   chan struct{} // capacity 1: one bootstrap attempt at a time
	spentMu   sync.Mutex
	spent     error // non-nil once the bootstrap can serve nothing more
}

// Forward accepts local TCP connections on ln until ctx ends and turns each
// into one broker stream carrying its raw bytes; the local client speaks
// TLS to the front itself (e.g. curl --connect-to … --pinnedpubkey …). A
// bootstrap candidate serves exactly one connection; later ones are closed
// with a log line. Forward closes ln, ends every stream with close 1000,
// waits for its connections and returns nil when ctx ends; it returns an
// error when the options are invalid or ln fails.
func Forward(ctx context.Context, ln net.Listener, o ForwardOptions) error {
	if err := o.Validate(); err != nil {
		ln.Close()
		return err
	}
	o = o.withDefaults()
	f := &forwarder{
		o:         o,
		cfg:       o.config(),
		log:       o.Log,
		bootstrap: o.Candidate.Broker.CredentialKind == string(wire.KindBootstrap),
		attempt:   make(chan struct{}, 1),
	}
	host, port := o.Candidate.Authority()
	authority := net.JoinHostPort(host, strconv.Itoa(port))
	f.log.Info().Str("listen", ln.Addr().String()).Str("authority", authority).
		Str("credential_kind", o.Candidate.Broker.CredentialKind).
		Str("example", fmt.Sprintf("curl -k --pinnedpubkey '%s' --connect-to %s:%s https://%s/relay/health",
			o.Candidate.CurlPin(), authority, ln.Addr().String(), authority)).
		Msg("forwarding local connections through the Reach broker")
	if o.Candidate.Expired(time.Now()) {
		f.log.Warn().Time("expires_at", time.Unix(o.Candidate.Broker.ExpiresAt, 0)).
			Msg("the candidate's credential has expired; the broker will refuse it")
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()

	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, o.MaxConns)
	delay := time.Duration(0)
	for {
		local, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				cancel()
				return fmt.Errorf("reach forward: listener closed: %w", err)
			}
			delay = min(max(2*delay, o.AcceptRetryDelay), time.Second)
			f.log.Warn().Err(err).Dur("retry_in", delay).Msg("accepting a local connection failed")
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		delay = 0
		if err := f.spentErr(); err != nil {
			f.log.Warn().Str("local", local.RemoteAddr().String()).Msg("refusing local connection: " + err.Error())
			local.Close()
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			f.log.Warn().Str("local", local.RemoteAddr().String()).Int("max_conns", o.MaxConns).
				Msg("refusing local connection: too many connections at once")
			local.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			f.handle(ctx, local)
		}()
	}
}

func (f *forwarder) spentErr() error {
	f.spentMu.Lock()
	defer f.spentMu.Unlock()
	return f.spent
}

func (f *forwarder) markSpent(err error) {
	f.spentMu.Lock()
	defer f.spentMu.Unlock()
	if f.spent == nil {
		f.spent = err
	}
}

// dial opens the stream. A bootstrap credential is tried by one connection
// at a time and is spent by a match or by a refusal that cannot change
// (replayed, expired, revoked, unauthorized); host_offline, host_busy and
// network errors leave it usable, since the broker consumes it only at match.
func (f *forwarder) dial(ctx context.Context) (*Conn, error) {
	if !f.bootstrap {
		return dial(ctx, f.cfg)
	}
	select {
	case f.attempt <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-f.attempt }()
	if err := f.spentErr(); err != nil {
		return nil, err
	}
	c, err := dial(ctx, f.cfg)
	switch {
	case err == nil:
		f.markSpent(errBootstrapSpent)
	case errors.Is(err, wire.ErrReplayed):
		f.markSpent(errBootstrapSpent)
	case errors.Is(err, wire.ErrExpired), errors.Is(err, wire.ErrRevoked), errors.Is(err, wire.ErrUnauthorized):
		f.markSpent(fmt.Errorf("the broker refused the bootstrap credential (%w); run `securelink pair` for a fresh one", err))
	}
	return c, err
}

// handle serves one local connection.
func (f *forwarder) handle(ctx context.Context, local net.Conn) {
	log := f.log.With().Uint64("conn", f.seq.Add(1)).Str("local", local.RemoteAddr().String()).Logger()
	remote, err := f.dial(ctx)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn().Err(err).Msg("could not open a broker stream; closing the local connection")
		}
		reset(local)
		return
	}
	log = log.With().Str("stream_id", remote.StreamID().String()).Logger()
	log.Debug().Msg("broker stream open")
	up, down, outcome := f.pipe(ctx, local, remote)
	ev := log.Info()
	if outcome != nil {
		ev = log.Warn().Err(outcome)
	}
	ev.Int64("bytes_up", up).Int64("bytes_down", down).Msg("local connection finished")
}

// pipe copies both ways until both directions are done and returns the
// bytes sent and received and, for an abnormal end, why.
//
// The protocol has no half-close, so: when the local client stops sending
// (EOF), the stream stays open for the answer until the broker ends it or
// nothing arrives for HalfCloseTimeout. When the host ends the stream
// (close 1000), everything received is delivered, the local side gets a FIN,
// and what the local client still sends is read and dropped (so closing does
// not reset data it has yet to read) until its EOF or HalfCloseTimeout. Any
// other end of the stream resets the local connection, so a truncated
// stream never looks complete.
func (f *forwarder) pipe(ctx context.Context, local net.Conn, remote *Conn) (up, down int64, outcome error) {
	stop := context.AfterFunc(ctx, func() {
		remote.Close()
		local.Close()
	})
	defer stop()
	defer local.Close()
	defer remote.Close()

	halfClose := f.o.HalfCloseTimeout
	var sent, received atomic.Int64
	var localDone atomic.Bool
	upC := make(chan error, 1)
	downC := make(chan error, 1)

	go func() { // local → broker
		buf := make([]byte, forwardBuffer)
		remoteOK := true
		for {
			n, err := local.Read(buf)
			if n > 0 && remoteOK {
				if _, werr := remote.Write(buf[:n]); werr != nil {
					remoteOK = false // the stream ended; keep reading, drop the rest
				} else {
					sent.Add(int64(n))
				}
			}
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				upC <- err
				return
			}
		}
	}()
	go func() { // broker → local
		buf := make([]byte, forwardBuffer)
		for {
			n, err := remote.Read(buf)
			if n > 0 {
				if _, werr := local.Write(buf[:n]); werr != nil {
					downC <- &localWriteError{werr}
					return
				}
				received.Add(int64(n))
				if localDone.Load() {
					remote.SetReadDeadline(time.Now().Add(halfClose))
				}
			}
			if err != nil {
				downC <- err
				return
			}
		}
	}()

	abnormal := func(err error) {
		if outcome == nil && ctx.Err() == nil {
			outcome = err
		}
	}
	upOpen, downOpen := true, true
	for upOpen || downOpen {
		select {
		case err := <-upC:
			upOpen = false
			switch {
			case !downOpen:
			case err == nil:
				// Local EOF: wait for the answer, bounded by inactivity.
				localDone.Store(true)
				remote.SetReadDeadline(time.Now().Add(halfClose))
			default:
				abnormal(fmt.Errorf("local connection failed: %w", err))
				remote.Close()
			}
		case err := <-downC:
			downOpen = false
			var lw *localWriteError
			switch {
			case err == io.EOF:
				closeWrite(local)
				if upOpen {
					local.SetReadDeadline(time.Now().Add(halfClose))
				}
			case errors.Is(err, os.ErrDeadlineExceeded):
				// Nothing came back within the half-close timeout.
				local.Close()
			case errors.As(err, &lw) && localDone.Load():
				// The local client finished and left; what the host still
				// sent (typically its TLS close_notify) has no reader.
			default:
				abnormal(err)
				reset(local)
			}
		}
	}
	return sent.Load(), received.Load(), outcome
}

// localWriteError marks a failed write to the local client.
type localWriteError struct{ err error }

func (e *localWriteError) Error() string { return "write to the local client: " + e.err.Error() }
func (e *localWriteError) Unwrap() error { return e.err }

// closeWrite sends FIN on a TCP connection (or closes anything else).
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// reset closes a TCP connection with RST, so the local client sees an
// abort instead of a clean end of a stream that was cut short.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

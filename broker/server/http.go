package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/hermes-securelink/securelink/broker/msgconn"
	"github.com/hermes-securelink/securelink/broker/wire"
	"github.com/hermes-securelink/securelink/internal/tlsconf"
)

// Handler serves GET /v1/connect (the WebSocket endpoint) and GET /health.
// It only checks the request, upgrades and adapts; Serve does the rest.
func (b *Broker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", b.health)
	mux.HandleFunc("GET "+wire.ConnectPath, b.connect)
	return mux
}

func (b *Broker) health(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	hosts, streams := len(b.hosts), b.live
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	fmt.Fprintf(w, `{"ok":true,"service":%q,"protocol_version":%d,"hosts_online":%d,"active_streams":%d}`,
		wire.HealthService, wire.ProtocolVersion, hosts, streams)
}

func (b *Broker) connect(w http.ResponseWriter, r *http.Request) {
	// Credentials travel only inside the register message: a query string
	// or an Authorization header would put them in logs and proxies.
	if r.URL.RawQuery != "" || r.URL.ForceQuery || len(r.Header.Values("Authorization")) > 0 {
		b.count("http:400")
		http.Error(w, "credentials belong in the register message, never in the URL or headers", http.StatusBadRequest)
		return
	}
	if !forwarded(r.Context()) && !b.limiter.allow(sourceKey(r.RemoteAddr), time.Now()) {
		b.count("http:429")
		w.Header().Set("Retry-After", "60")
		http.Error(w, "too many connection attempts", http.StatusTooManyRequests)
		return
	}
	// The adapter's reader notes the pongs of the keepalive's pings, so
	// no goroutine waits for one (msgconn.Accept).
	wc, err := msgconn.Accept(smallBuffers{w}, r, &websocket.AcceptOptions{
		// Authentication is the register message, not cookies, so a
		// cross-origin page gains nothing; clients in browsers must work.
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionDisabled,
	}, r.RemoteAddr)
	if err != nil {
		return // Accept already answered the request
	}
	// The socket is served on a goroutine of its own and the handler
	// returns: net/http's connection goroutine then ends and lets go of
	// what an upgraded socket never needs again (the request, its
	// response writer and buffers, the stack that ran the TLS handshake).
	// The request's context ends when the handler returns, so the session
	// hangs off the broker's.
	if bc := batchOf(r.Context().Value(netConnKey{})); bc != nil {
		wc.SetBatch(bc)
		wc.SetWriteBuffer(socketWriteBuffer)
	}
	// Of the request's context only what Serve reads goes along: whether
	// another instance forwarded the socket (PeerHandler). The broker's
	// own context ends it (Serve then needs no watch of that one).
	ctx := b.ctx
	if forwarded(r.Context()) {
		ctx = context.WithValue(ctx, forwardedKey{}, true)
	}
	go func() {
		b.Serve(ctx, wc)
		wc.Release() // Serve's reader is done with it
	}()
}

// socketReadBuffer is the read buffer an upgraded socket keeps for its
// life. The WebSocket library reads frame headers through it and payload
// reads as large as it bypass it; below it, crypto/tls holds the decrypted
// record anyway, so a small one costs a call into tls per message above
// it, never a syscall. 128 bytes hold a ping, a pong or a close frame and
// a 64-byte message with their headers; net/http's is 4 KiB, per socket,
// idle or not.
const socketReadBuffer = 128

// socketWriteBuffer is the write buffer an upgraded socket with a
// BatchConn under its TLS keeps for its life, in place of net/http's
// 4 KiB: every control frame (a pong or a close with its 125-byte
// payload, a ping) and a message up to 114 bytes fit it and leave in one
// TLS record and one write; a larger message is gathered by the BatchConn
// (msgconn.WebSocket.SetWriteBuffer), so it still leaves in one write(2),
// in two records (its frame header and payload; a 64 KiB DATA frame was
// two already). An idle socket holds ~3.9 KiB less than with net/http's,
// 384 bytes less than with 512.
const socketWriteBuffer = 128

// batchOf is the BatchConn under a request's TLS connection, or nil.
func batchOf(c any) *msgconn.BatchConn {
	if tc, ok := c.(*tls.Conn); ok {
		bc, _ := tc.NetConn().(*msgconn.BatchConn)
		return bc
	}
	return nil
}

// smallBuffers hands the WebSocket library a socketReadBuffer-sized read
// buffer at the hijack in place of net/http's, and a socketWriteBuffer-
// sized write buffer when a BatchConn gathers the larger writes.
type smallBuffers struct{ http.ResponseWriter }

func (w smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("broker: the response writer cannot be hijacked")
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	bw := brw.Writer
	if batchOf(c) != nil {
		bw = bufio.NewWriterSize(c, socketWriteBuffer) // Hijack flushed brw.Writer
	}
	n := brw.Reader.Buffered()
	if n == 0 {
		return c, bufio.NewReadWriter(bufio.NewReaderSize(c, socketReadBuffer), bw), nil
	}
	// Bytes the client sent after its request (net/http's buffer holds
	// them) come first, buffered, as the library expects.
	early, _ := brw.Reader.Peek(n)
	rd := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(early)), c), max(socketReadBuffer, n))
	if _, err := rd.Peek(n); err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, bufio.NewReadWriter(rd, bw), nil
}

// netConnKey carries a request's connection in its context (ConnContext),
// so the upgraded socket finds the BatchConn under its TLS.
type netConnKey struct{}

// Listen opens the broker's TCP listener. Its sockets carry no TCP
// keepalive: every registered socket is pinged every PingInterval and
// dropped after PongTimeout, and the ones before it are bounded by
// ReadHeaderTimeout and RegisterTimeout, so the kernel's probes found
// nothing those do not, and setting them up cost four setsockopt(2) per
// connection (net.Listen's default is 15 s).
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	return lc.Listen(ctx, "tcp", addr)
}

// ListenAndServe listens on Config.Listen and serves until ctx ends, then
// stops the broker (Close) and returns nil.
func (b *Broker) ListenAndServe(ctx context.Context) error {
	ln, err := Listen(ctx, b.cfg.Listen)
	if err != nil {
		return fmt.Errorf("broker: listen: %w", err)
	}
	return b.ServeListener(ctx, ln)
}

// ServeListener serves on ln (TLS unless InsecurePlaintext) until ctx ends,
// then stops the broker (Close) and returns nil. A listener error returns
// that error, after Close.
func (b *Broker) ServeListener(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           b.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          log.New(b.log, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, netConnKey{}, c)
		},
	}
	if !b.cfg.InsecurePlaintext {
		srv.TLSConfig = &tls.Config{
			MinVersion:   tlsconf.MinVersion,
			CipherSuites: tlsconf.TLS12Suites,
			NextProtos:   []string{"http/1.1"}, // WebSocket upgrades are HTTP/1.1
		}
		if b.cfg.ACME.On() {
			m, err := b.startACME(ctx)
			if err != nil {
				ln.Close()
				return err
			}
			b.acme.Store(m)
			defer func() { b.acme.CompareAndSwap(m, nil); m.Close() }()
			srv.TLSConfig.GetCertificate = m.GetCertificate
		} else {
			cert, err := tls.LoadX509KeyPair(b.cfg.TLSCertFile, b.cfg.TLSKeyFile)
			if err != nil {
				ln.Close()
				return fmt.Errorf("broker: tls: %w", err)
			}
			srv.TLSConfig.Certificates = []tls.Certificate{cert}
		}
		ln = tls.NewListener(batchListener{ln}, srv.TLSConfig)
	}
	b.log.Info().Str("listen", ln.Addr().String()).Bool("tls", !b.cfg.InsecurePlaintext).Msg("reach broker listening")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var serveErr error
	select {
	case serveErr = <-errc:
	case <-ctx.Done():
	}
	shctx, cancel := context.WithTimeout(context.Background(), b.cfg.ShutdownGrace)
	defer cancel()
	shut := make(chan struct{})
	go func() { srv.Shutdown(shctx); close(shut) }()
	b.Close() // upgraded sockets are not tracked by http.Server
	<-shut
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("broker: serve: %w", serveErr)
	}
	return nil
}

// batchListener puts a BatchConn under every accepted connection's TLS.
type batchListener struct{ net.Listener }

func (l batchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return msgconn.NewBatchConn(c), nil
}

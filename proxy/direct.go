package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/hermes-securelink/securelink/internal/policy"
)

// The direct path forwards a request without a body that is not an upgrade
// (the common small API or Dashboard call) on the handler's own goroutine:
// it writes the request on a pooled upstream connection, reads the answer
// and copies it to the client. Every other request (bodies, WebSocket
// upgrades) takes the ReverseProxy path in forward.go.
//
// Why a second path: httputil.ReverseProxy over http.Transport costs a
// request clone, a context chain for our limits and its own tracing, and two
// goroutine handoffs per exchange (the Transport's writeLoop and readLoop);
// on the bench's small GET that was about a third of the front's CPU. A body
// keeps the Transport, which writes it while already reading the answer (an
// upstream that refuses before reading needs that) and knows
// Expect: 100-continue.
//
// What it keeps identical to the ReverseProxy path: the request head is
// what (*http.Request).Write writes (FuzzRequestHead holds the two equal)
// and the answer is what http.ReadResponse, which the Transport uses, makes
// of it (readResponse parses the common answer itself and leaves the rest
// to ReadResponse; FuzzReadResponse holds the two equal);
// header fields are validated as the Transport validates them; the same
// policy functions apply to both directions, hop-by-hop response headers are
// removed as ReverseProxy removes them; 1xx answers are relayed (under the
// response policy, see infoWriter), trailers forwarded (under the response
// policy too), bodies of
// unknown length and event streams flushed per write; the response head is
// bounded (64 KiB) and the limits (connect, idle read, total, response size)
// and failure answers (502, 499, a cut connection) are the same. A request
// that fails on a reused connection is retried under the Transport's rules.

// direct forwards one bodiless, non-upgrade request (see serve for the
// policy).
func (f *forwarder) direct(w http.ResponseWriter, r *http.Request, rawTail, rawQuery string) {
	l := f.limits
	var start time.Time
	if f.s.metrics != nil {
		start = time.Now()
	}
	h := r.Header
	// Validated as the Transport validates them on the other path.
	for k, vv := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			f.fail(w, r, fmt.Errorf("invalid header field name %q", k))
			return
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				f.fail(w, r, fmt.Errorf("invalid header field value for %q", k))
				return
			}
		}
	}
	// The exchange's parts come from a pool and go back when the handler
	// returns, except an event stream's (see below).
	ex := exchangePool.Get().(*directExchange)
	pooled := true
	defer func() {
		// Normally done already; not after a panic (an event stream's
		// exchange too: it must not stay listed).
		f.pool.gone.done(&ex.wait)
		if pooled {
			*ex = directExchange{slot: responseSlot{hdr: ex.slot.hdr}}
			exchangePool.Put(ex)
		}
	}()
	ex.target = f.target(rawTail, rawQuery)
	out := &ex.out
	*out = http.Request{
		Method:     r.Method,
		URL:        &ex.target,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     h,
		Host:       f.upstream.Host,
	}
	total := time.Now().Add(l.UpstreamTotal)
	ctx := r.Context()
	if ctx.Err() != nil {
		// The client left already: nothing goes upstream (the watch
		// below would only notice after a tick).
		f.fail(w, r, ctx.Err())
		return
	}
	var (
		pc   *upConn
		resp *http.Response
		err  error
	)
	for {
		if pc, err = f.pool.get(ctx, total); err != nil {
			f.fail(w, r, err)
			return
		}
		// A client that leaves cancels the exchange (see goneWatch).
		f.pool.gone.add(&ex.wait, ctx, pc)
		if resp, err = f.roundTrip(w, pc, out, &ex.slot, total); err == nil {
			break
		}
		f.pool.gone.done(&ex.wait)
		pc.conn.Close()
		if ctx.Err() != nil || !pc.reused || !retryable(out, pc, err) {
			f.fail(w, r, err)
			return
		}
	}
	b := &ex.body
	*b = directBody{f: f, pc: pc, rc: resp.Body, wait: &ex.wait, total: total,
		keep: !resp.Close && resp.StatusCode != http.StatusSwitchingProtocols}
	if resp.Body == http.NoBody || r.Method == http.MethodHead {
		b.finish(true)
	}
	if start != (time.Time{}) {
		f.s.metrics.UpstreamLatency(f.ns.String(), time.Since(start))
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// Only a request that asked for an upgrade may get one, and those
		// take the ReverseProxy path.
		b.Close()
		f.fail(w, r, errors.New("upstream switched protocols unasked"))
		return
	}
	policy.StripHopByHop(resp.Header) // as ReverseProxy does on the other path
	f.responseHead(resp)
	if resp.ContentLength > l.MaxResponseBody {
		b.Close()
		f.fail(w, r, errResponseTooLarge)
		return
	}
	sse := isEventStream(resp.Header.Get("Content-Type"))
	if sse {
		b.total = time.Time{} // only the idle read applies
		// Shutdown ends the stream (see directBody.end); its connection
		// is never pooled, so ending it can only touch this exchange.
		b.keep = false
		// Shutdown may call b.end after the handler returned (it ends
		// the streams it listed outside its lock): the parts are not
		// reused, so that call cannot reach another exchange.
		pooled = false
		defer f.s.trackStream(b.end)()
	}
	dst := w.Header()
	for k, vv := range resp.Header {
		if _, ok := dst[k]; ok {
			dst[k] = append(dst[k], vv...)
		} else {
			dst[k] = vv
		}
	}
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		dst.Add("Trailer", strings.Join(keys, ", "))
	}
	w.WriteHeader(resp.StatusCode)
	if err := f.copyBody(w, b, sse || resp.ContentLength == -1); err != nil {
		b.Close()
		if r.Context().Value(http.ServerContextKey) != nil {
			// As ReverseProxy: the only honest way to fail a response
			// already started is to cut it.
			panic(http.ErrAbortHandler)
		}
		return
	}
	b.Close()
	// Reading the body to its end filled in the trailers, announced or
	// not: they get the response policy too.
	f.responsePolicy(resp.Trailer)
	if len(resp.Trailer) > 0 {
		// Force chunking so net/http does not compute a length and drop
		// the trailers.
		http.NewResponseController(w).Flush()
	}
	if len(resp.Trailer) == announced {
		for k, vv := range resp.Trailer {
			for _, v := range vv {
				dst.Add(k, v)
			}
		}
		return
	}
	for k, vv := range resp.Trailer {
		k = http.TrailerPrefix + k
		for _, v := range vv {
			dst.Add(k, v)
		}
	}
}

// directExchange holds what one exchange of the direct path builds.
type directExchange struct {
	target url.URL
	out    http.Request
	body   directBody
	slot   responseSlot // the answer, when readResponse parsed it itself
	wait   clientWait   // the exchange's place in its pool's goneWatch
}

// exchangePool keeps directExchanges (about 1 KiB, and the answer's header
// map) between requests: nothing holds one once its handler has returned
// (the header values handed to the client's header map are allocated per
// answer, only the map is reused).
var exchangePool = sync.Pool{New: func() any { return new(directExchange) }}

// roundTrip writes out on pc (one write, see upConn.send) and reads the
// response head (readResponse, into rs), relaying 1xx answers. The read deadline bounds the wait by
// the idle read and the total.
func (f *forwarder) roundTrip(w http.ResponseWriter, pc *upConn, out *http.Request, rs *responseSlot, total time.Time) (*http.Response, error) {
	// The head starts empty whatever an earlier failed exchange left (its
	// connection was closed anyway).
	pc.head.Reset()
	pc.bw.Reset(&pc.head)
	if err := writeRequestHead(pc.bw, out); err != nil {
		return nil, err
	}
	pc.bw.Flush() // into pc.head: cannot fail
	// The deadline is set before the head goes out: send waits for the
	// answer under it.
	if err := pc.armRead(f.limits.UpstreamIdleRead, total); err != nil {
		return nil, err
	}
	if _, err := pc.send(); err != nil {
		if pc.reused && !pc.canceled.Load() {
			// A pooled connection that fails its first write delivered
			// nothing the upstream could act on.
			err = fmt.Errorf("%w: %w", errNothingWritten, err)
		}
		return nil, err
	}
	pc.limit = maxResponseHead
	for {
		resp, err := readResponse(pc.br, out, rs)
		if err != nil {
			if pc.limit <= 0 {
				err = fmt.Errorf("%w (%d bytes)", errHeadTooLarge, maxResponseHead)
			}
			return nil, err
		}
		if resp.StatusCode < 100 {
			// http.ReadResponse takes any three digits; no status below
			// 100 can be relayed (WriteHeader panics on it). The answer
			// has begun, so the exchange is not tried again.
			return nil, errBadStatus
		}
		if resp.StatusCode > 199 || resp.StatusCode == http.StatusSwitchingProtocols {
			pc.limit = math.MaxInt64
			return resp, nil
		}
		// An informational answer (103 Early Hints): relayed under the
		// response header policy, and the head limit starts over.
		f.responsePolicy(resp.Header)
		copyInto(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		clear(w.Header())
		pc.limit = maxResponseHead
	}
}

// maxResponseHead bounds an upstream response head, as
// http.Transport.MaxResponseHeaderBytes does on the other path.
const maxResponseHead = 64 << 10

func copyInto(dst, src http.Header) {
	for k, vv := range src {
		for _, v := range vv {
			dst.Add(k, v)
		}
	}
}

// retryable mirrors http.Transport: a request that failed on a reused
// connection goes again when nothing was written, or when it is replayable
// and the connection failed (closed, reset) before the first byte of an
// answer: the upstream dropped a keep-alive connection as it was reused.
func retryable(req *http.Request, pc *upConn, err error) bool {
	if errors.Is(err, errNothingWritten) {
		return true
	}
	var ne net.Error
	if pc.nRead > 0 || (errors.As(err, &ne) && ne.Timeout()) {
		// An answer had begun, or the upstream is slow rather than gone
		// (http.Transport does not retry its header timeout either).
		return false
	}
	switch req.Method {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

var errNothingWritten = errors.New("upstream connection failed before the request was written")

// copyBody streams the body to the client with a pooled 32 KiB buffer
// (256 KiB once a read fills it), flushing every write when flush is set
// (event streams and bodies of unknown length, as ReverseProxy does).
func (f *forwarder) copyBody(w http.ResponseWriter, b *directBody, flush bool) error {
	var ctl *http.ResponseController
	if flush {
		ctl = http.NewResponseController(w)
		// Headers go out now, not with the first event.
		ctl.Flush()
	}
	if b.done {
		return nil
	}
	bp := bufferPool.p.Get().(*[]byte)
	pool := &bufferPool.p
	defer func() { pool.Put(bp) }()
	buf := *bp
	for {
		n, rerr := b.Read(buf)
		if rerr != nil && rerr != io.EOF && rerr != context.Canceled {
			f.s.log.Debug().Str("ns", f.ns.String()).Str("event", "reverse_proxy").Str("error", errorKind(rerr)).Msg("upstream read failed during body copy")
		}
		if n > 0 {
			nw, werr := w.Write(buf[:n])
			if werr != nil {
				return werr
			}
			if nw != n {
				return io.ErrShortWrite
			}
			if flush {
				if err := ctl.Flush(); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
		if n == len(buf) && !flush && pool != &bulkBufferPool {
			// A full read: a bulk body (a download), not a trickle. Reads
			// of bulkBufferBytes cost a read syscall per 256 KiB instead
			// of per 32 KiB; only transfers moving at full speed hold one.
			pool.Put(bp)
			bp, pool = bulkBufferPool.Get().(*[]byte), &bulkBufferPool
			buf = *bp
		}
	}
}

// fail answers a request the upstream could not serve, as errorHandler does.
func (f *forwarder) fail(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		f.s.log.Debug().Str("ns", f.ns.String()).Str("event", "client_gone").Msg("client left before the upstream answered")
		w.WriteHeader(499)
		return
	}
	f.s.log.Warn().Str("ns", f.ns.String()).Str("event", "upstream_error").Str("error", errorKind(err)).Msg("upstream failed")
	plainError(w, http.StatusBadGateway)
}

// directBody reads a response body under the idle-read and total limits and
// the response size limit, and hands the connection back to the pool when
// the body was read to its end (closing it otherwise).
type directBody struct {
	f     *forwarder
	pc    *upConn
	rc    io.ReadCloser
	wait  *clientWait
	total time.Time
	keep  bool
	done  bool
	read  int64
	eof   bool
	ended atomic.Bool // Shutdown ended the stream: reads report its end
}

// end stops the exchange from another goroutine (Shutdown ending an event
// stream) so that the copy sees the body's end, not a failure.
func (b *directBody) end() {
	b.ended.Store(true)
	b.pc.cancel()
}

func (b *directBody) Read(p []byte) (int, error) {
	if b.done {
		if b.eof {
			return 0, io.EOF
		}
		return 0, errBodyClosed
	}
	if b.pc.br.Buffered() == 0 {
		// The read may wait on the upstream: time it. Time spent
		// writing to a slow client is not upstream idleness.
		if err := b.pc.armRead(b.f.limits.UpstreamIdleRead, b.total); err != nil {
			b.finish(false)
			return 0, b.endedOr(err)
		}
	}
	n, err := b.rc.Read(p)
	b.read += int64(n)
	if b.read > b.f.limits.MaxResponseBody {
		b.finish(false)
		return 0, errResponseTooLarge
	}
	if err == io.EOF {
		b.finish(true)
	} else if err != nil {
		canceled := b.pc.canceled.Load()
		b.finish(false)
		if canceled {
			err = context.Canceled
		}
		err = b.endedOr(err)
	}
	return n, err
}

// endedOr is io.EOF when Shutdown ended the stream, else err.
func (b *directBody) endedOr(err error) error {
	if b.ended.Load() {
		return io.EOF
	}
	return err
}

var errBodyClosed = errors.New("read on a closed upstream body")

// bulkBufferPool holds the copy buffers of bodies read at full speed (see
// copyBody).
const bulkBufferBytes = 256 << 10

var bulkBufferPool = sync.Pool{New: func() any { b := make([]byte, bulkBufferBytes); return &b }}

// Close ends the exchange; a body not read to its end closes the connection
// (reading the rest of a body nobody wants could wait on the upstream).
func (b *directBody) Close() error {
	if !b.done {
		b.finish(false)
	}
	return nil
}

func (b *directBody) finish(eof bool) {
	b.done, b.eof = true, eof
	if b.f.pool.gone.done(b.wait) && eof && b.keep && !b.pc.sawEOF {
		b.f.pool.put(b.pc)
		return
	}
	b.pc.conn.Close()
}

// writeRequestHead writes what (*http.Request).Write writes for a request
// without a body, as http.Transport sends it: the request line (refused
// unless it re-parses to the same method and target), Host,
// User-Agent only when present and not empty (ReverseProxy's rule: a client
// without one is not given Go's), "Content-Length: 0" for POST, PUT and
// PATCH, then the other fields in key order with
// CR and LF turned into spaces and the values trimmed, Content-Length,
// Transfer-Encoding and Trailer never taken from the map. It does without
// Request.Write's formatted printing and allocations; FuzzRequestHead holds
// the two byte for byte.
func writeRequestHead(bw *bufio.Writer, r *http.Request) error {
	ruri := r.URL.RequestURI()
	method := r.Method
	if method == "" {
		method = http.MethodGet
	}
	if err := checkRequestLine(method, ruri); err != nil {
		return err
	}
	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(ruri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(r.Host)
	bw.WriteString("\r\n")
	h := r.Header
	if ua := h["User-Agent"]; len(ua) > 0 && ua[0] != "" {
		bw.WriteString("User-Agent: ")
		bw.WriteString(headerValue(ua[0]))
		bw.WriteString("\r\n")
	}
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		// "Many servers expect a Content-Length for these methods."
		bw.WriteString("Content-Length: 0\r\n")
	}
	var arr [32]string
	keys := arr[:0]
	for k := range h {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range h[k] {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(headerValue(v))
			bw.WriteString("\r\n")
		}
	}
	_, err := bw.WriteString("\r\n")
	return err
}

// checkRequestLine refuses an upstream request line that would not re-parse
// to method and target, whatever transport the client spoke: both paths
// call it where the line is written (writeRequestHead, lineChecked), behind
// the same rules at the front's entry (route).
func checkRequestLine(method, target string) error {
	if !policy.ValidMethod(method) {
		return errInvalidMethod
	}
	return policy.CheckRequestTarget(target)
}

var errInvalidMethod = errors.New("method is not a token")

var newlineToSpace = strings.NewReplacer("\n", " ", "\r", " ")

// headerValue is a field value as net/http writes it: CR and LF become
// spaces, surrounding whitespace goes.
func headerValue(v string) string {
	if strings.ContainsAny(v, "\r\n") {
		v = newlineToSpace.Replace(v)
	}
	return textproto.TrimString(v)
}

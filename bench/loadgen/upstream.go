package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

func cmdUpstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:18767", "loopback address to listen on")
	fs.Parse(args)
	if err := loopbackOnly(*listen); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: upstreamHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute}
	go func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
		srv.Close()
	}()
	fmt.Printf("upstream listening %s\n", ln.Addr())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// upstreamHandler serves the routes both fronts forward to: /small, /big and
// /bulk for the HTTP figures (fixed Content-Length, bodies built once), /sse for
// the soak's event stream,
// /health and /api/health for the front's availability probes, /ws for the
// Relay bridge.
func upstreamHandler() http.Handler {
	small := bytes.Repeat([]byte("s"), smallBodySize)
	big := bytes.Repeat([]byte("b"), bigBodySize)
	// Shared header values: net/http only reads them.
	textPlain, octets := []string{"text/plain"}, []string{"application/octet-stream"}
	smallLen, bigLen := []string{strconv.Itoa(len(small))}, []string{strconv.Itoa(len(big))}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Content-Type"], h["Content-Length"] = textPlain, smallLen
		w.Write(small)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Content-Type"], h["Content-Length"] = octets, bigLen
		w.Write(big)
	})
	// /bulk?n=N is N copies of /big's body (1..maxBulkCopies) in one
	// response: a transfer larger than the broker's 8 MiB stream queue.
	mux.HandleFunc("/bulk", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 1 || n > maxBulkCopies {
			http.Error(w, "n must be 1..8", http.StatusBadRequest)
			return
		}
		h := w.Header()
		h["Content-Type"], h["Content-Length"] = octets, []string{strconv.Itoa(n * len(big))}
		for i := 0; i < n; i++ {
			if _, err := w.Write(big); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok","version":"bench"}`)
	})
	// The Dashboard's health, with its login gate on, so the front's prober
	// sees the same upstream as available and stays quiet in the logs.
	mux.HandleFunc("/api/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok","auth_required":true}`)
	})
	mux.HandleFunc("/sink", serveSink)
	mux.HandleFunc("/ws", serveRelayWS)
	mux.HandleFunc("/sse", serveSSE)
	return mux
}

// maxSinkBody bounds one upload; the front allows 16 MiB per request.
const maxSinkBody = 64 << 20

// serveSink is the upload figure's target: it reads the body to the end
// (bounded) and answers with the byte count, so the client can check that
// every byte it sent arrived.
func serveSink(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost && r.Method != http.MethodPut {
		w.Header().Set("Allow", "POST, PUT")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	buf := sinkBufs.Get().(*[]byte)
	defer sinkBufs.Put(buf)
	var n int64
	body := io.LimitReader(r.Body, maxSinkBody+1)
	for {
		m, err := body.Read(*buf)
		n += int64(m)
		if err == io.EOF {
			break
		}
		if err != nil {
			http.Error(w, "read error", http.StatusBadRequest)
			return
		}
	}
	if n > maxSinkBody {
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, strconv.FormatInt(n, 10))
}

var sinkBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// serveRelayWS mimics the Relay's first-frame protocol: the first message must
// be a system/auth frame, answered with auth.ok and the session "s-<id>"
// (any token is accepted: authentication is not what is measured);
// everything after is echoed with its own message type.
func serveRelayWS(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		InsecureSkipVerify: true, // the front and nginx do not forward a browser Origin
		CompressionMode:    websocket.CompressionDisabled,
	})
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(maxMessage)
	ctx := r.Context()
	typ, first, err := c.Read(ctx)
	if err != nil {
		return
	}
	id, ok := parseAuthFrame(first)
	if !ok {
		c.Write(ctx, websocket.MessageText, []byte(`{"channel":"system","type":"auth.fail","payload":{"reason":"bad auth frame"}}`))
		c.Close(4001, "auth failed")
		return
	}
	// One session per auth id, as the Relay issues one per login: the Reach
	// connector keys route credentials by session.
	reply := fmt.Sprintf(`{"channel":"system","type":"auth.ok","id":%s,"payload":{"session_token":%s,"expires_at":null}}`, strconv.Quote(id), strconv.Quote("s-"+id))
	if err := c.Write(ctx, typ, []byte(reply)); err != nil {
		return
	}
	buf := make([]byte, 0, 4096)
	for {
		typ, rd, err := c.Reader(ctx)
		if err != nil {
			return
		}
		buf, err = readAllBounded(rd, buf[:0], maxMessage)
		if err != nil {
			return
		}
		if err := c.Write(ctx, typ, buf); err != nil {
			return
		}
	}
}

// parseAuthFrame is deliberately a substring check, not a JSON parse: the fake
// Relay must stay cheap so the upstream's CPU does not shape the result.
func parseAuthFrame(b []byte) (id string, ok bool) {
	if !bytes.Contains(b, []byte(`"type":"auth"`)) || !bytes.Contains(b, []byte(`"channel":"system"`)) {
		return "", false
	}
	const key = `"id":"`
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return "", true
	}
	rest := b[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 || j > 64 {
		return "", true
	}
	return string(rest[:j]), true
}

func readAllBounded(r io.Reader, buf []byte, limit int) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= limit {
				return buf, errors.New("message too large")
			}
			nb := make([]byte, len(buf), min(2*cap(buf)+512, limit))
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// serveSSE is the fake Hermes API's event stream: one numbered event per
// sseInterval until the client leaves, so the client can check that none
// was lost or reordered on the way through the front.
func serveSSE(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "no streaming", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	ctx, cancel := context.WithTimeout(r.Context(), maxSSEStream)
	defer cancel()
	t := time.NewTicker(sseInterval)
	defer t.Stop()
	for n := 1; ; n++ {
		if _, err := fmt.Fprintf(w, "id: %d\ndata: tick %d\n\n", n, n); err != nil {
			return
		}
		fl.Flush()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

package relay

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/hermes-securelink/securelink/internal/rawsock"
)

// The two WebSocket handshakes of a bridged connection, done by the bridge
// so that it owns both byte streams from the first frame on (wsframe.go).
// Neither leg negotiates an extension: the upgrade to the Relay offers
// none and an answer that selects one is refused; the 101 to the client
// names none.

// Read buffer of the Relay leg: a plain TCP socket, where every read is a
// syscall, so it holds a typical frame (a 1 KiB message and its header)
// whole; larger payloads are read straight into the forwarding buffer.
const relayReadBufBytes = 2 << 10

// maxUpgradeResponse bounds the Relay's 101 (or refusal) head, as
// http.Transport's MaxResponseHeaderBytes did.
const maxUpgradeResponse = 64 << 10

const websocketGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

func acceptKey(key string) string {
	h := sha1.Sum([]byte(key + websocketGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

// errUpgradeStatus is the Relay answering its upgrade with a status other
// than 101; the response is returned with it.
var errUpgradeStatus = errors.New("relay answered the upgrade without switching protocols")

// relayConn is the Relay leg right after its handshake.
type relayConn struct {
	conn        net.Conn
	br          *bufio.Reader
	subprotocol string
}

// dialRelayWS opens the Relay's WebSocket at u ("ws://host/path?query")
// with the given request header (already through the namespace policy) and
// subprotocol offer, within ctx. A refusal returns the Relay's response
// (status and header; its body unread) with errUpgradeStatus.
func dialRelayWS(ctx context.Context, u string, h http.Header, offered []string) (*relayConn, *http.Response, error) {
	pu, err := url.Parse(u)
	if err != nil {
		return nil, nil, err
	}
	addr := pu.Host
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(strings.Trim(addr, "[]"), "80")
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	// The bridged leg's reads and writes are raw system calls
	// (internal/rawsock), as the client's side of the front.
	conn = rawsock.Wrap(conn)
	ok := false
	defer func() {
		if !ok {
			_ = conn.Close()
		}
	}()
	// Cancellation (the client leaving, Shutdown) closes the socket; the
	// deadline bounds the whole exchange.
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	if dl, has := ctx.Deadline(); has {
		_ = conn.SetDeadline(dl)
	}
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	hdr := h.Clone()
	if hdr == nil {
		hdr = http.Header{}
	}
	hdr["Upgrade"] = []string{"websocket"}
	hdr["Connection"] = []string{"Upgrade"}
	hdr["Sec-Websocket-Version"] = []string{"13"}
	hdr["Sec-Websocket-Key"] = []string{key}
	delete(hdr, "Sec-Websocket-Extensions")
	if len(offered) > 0 {
		hdr["Sec-Websocket-Protocol"] = []string{strings.Join(offered, ", ")}
	}
	pu.Scheme = "http"
	req := &http.Request{Method: http.MethodGet, URL: pu, Host: pu.Host, Header: hdr,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
	bw := bufio.NewWriterSize(conn, 1<<10)
	if err := req.Write(bw); err != nil {
		return nil, nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, nil, err
	}
	rr := &relayReader{conn: conn, left: maxUpgradeResponse}
	br := bufio.NewReaderSize(rr, relayReadBufBytes)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		if rr.left == 0 {
			err = fmt.Errorf("upgrade response head over %d bytes", maxUpgradeResponse)
		}
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return nil, resp, errUpgradeStatus
	}
	if !httpguts.HeaderValuesContainsToken(resp.Header["Connection"], "upgrade") ||
		!httpguts.HeaderValuesContainsToken(resp.Header["Upgrade"], "websocket") {
		return nil, resp, errors.New("relay's 101 is not a WebSocket upgrade")
	}
	if resp.Header.Get("Sec-WebSocket-Accept") != acceptKey(key) {
		return nil, resp, errors.New("relay's 101 has a wrong Sec-WebSocket-Accept")
	}
	if len(resp.Header.Values("Sec-WebSocket-Extensions")) > 0 {
		return nil, resp, errors.New("relay selected a WebSocket extension that was not offered")
	}
	proto := resp.Header.Get("Sec-WebSocket-Protocol")
	if proto != "" && !slices.Contains(offered, proto) {
		return nil, resp, errors.New("relay selected a subprotocol that was not offered")
	}
	if ctx.Err() != nil || !stop() {
		return nil, nil, context.Cause(ctx)
	}
	rr.left = -1
	_ = conn.SetDeadline(time.Time{})
	ok = true
	return &relayConn{conn: conn, br: br, subprotocol: proto}, resp, nil
}

// relayReader is what the Relay leg's read buffer reads: the connection,
// at most left bytes while left >= 0 (the upgrade's response head), then
// without bound; like every leg (abruptEOF) it reads the connection's end
// as io.ErrUnexpectedEOF, and so the bound's end too. One type rather than
// abruptEOF over an io.LimitedReader: every read of the leg passes here.
type relayReader struct {
	conn net.Conn
	left int64
}

func (r *relayReader) Read(p []byte) (int, error) {
	if r.left >= 0 {
		if r.left == 0 {
			return 0, io.ErrUnexpectedEOF
		}
		p = p[:min(int64(len(p)), r.left)]
	}
	n, err := r.conn.Read(p)
	if r.left >= 0 {
		r.left -= int64(n)
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// acceptClient answers the client's upgrade (already checked by
// checkClientHandshake) with a 101 naming subprotocol when not empty, and
// returns the connection and a reader holding whatever the client sent
// after its request (a first frame may come without waiting for the 101).
func acceptClient(w http.ResponseWriter, r *http.Request, subprotocol string, timeout time.Duration) (net.Conn, *bufio.Reader, error) {
	hj, ok := findHijacker(w)
	if !ok {
		return nil, nil, errors.New("connection cannot be taken over for a WebSocket")
	}
	conn, br, err := hijackSmall(hj)
	if err != nil {
		return nil, nil, err
	}
	// The server's header and body deadlines must not survive into a
	// long-lived WebSocket; the bridge pings instead.
	_ = conn.SetDeadline(time.Time{})
	var b strings.Builder
	b.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ")
	b.WriteString(acceptKey(strings.TrimSpace(r.Header.Get("Sec-WebSocket-Key"))))
	if subprotocol != "" {
		b.WriteString("\r\nSec-WebSocket-Protocol: ")
		b.WriteString(subprotocol)
	}
	b.WriteString("\r\n\r\n")
	_ = conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(conn, b.String()); err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, br, nil
}

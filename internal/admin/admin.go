// Package admin is the daemon's local control plane: HTTP over a unix socket
// in the state directory, reachable only by the daemon's own uid and root.
// The client applies the same rule the other way: it talks only to a socket
// served by root or the owner of the socket's directory.
//
// Commands that must act on what the running daemon serves (`status`,
// `pair`, `revoke`) ask it here rather than reading files the daemon may not
// be using, so an operator never pairs against the wrong identity.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// Server serves the admin API on a unix socket.
type Server struct {
	path string
	ln   net.Listener
	srv  *http.Server
	mux  *http.ServeMux
	uid  int
	log  zerolog.Logger
}

type peerKey struct{}

// peer is the credential of the process on the other end of the socket.
type peer struct {
	uid int
	ok  bool
}

// Listen creates the socket at path (mode 0600). A stale socket left by a
// crashed daemon is replaced; a live one means another daemon owns this
// state directory, which is refused.
func Listen(path string, log zerolog.Logger) (*Server, error) {
	// The client talks only to root or the owner of the socket's directory
	// (NewClient): a daemon of another uid in, say, /tmp would be refused
	// by its own commands, so it is refused here, at start, naming the key.
	if euid := os.Geteuid(); euid != 0 {
		o, err := atomicfile.OwnerOf(filepath.Dir(path))
		if err != nil {
			return nil, fmt.Errorf("admin socket: %w", err)
		}
		if o.UID != euid {
			return nil, fmt.Errorf("admin.socket %s: its directory belongs to uid %d, not to the daemon's uid %d, so status, pair and revoke would refuse this daemon; put the socket in a directory the daemon's user owns (the default is <state_dir>/admin.sock)",
				path, o.UID, euid)
		}
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("admin socket %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another securelink daemon is already serving %s", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale admin socket: %w", err)
		}
	}
	// No umask around the bind: it is process-wide (a directory another
	// goroutine creates meanwhile would lose its bits), and a connection
	// made before the Chmod still meets the per-connection peer check.
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{path: path, ln: ln, mux: http.NewServeMux(), uid: os.Getuid(), log: log}
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, peerKey{}, peerOf(c))
		},
	}
	return s, nil
}

// Handle registers a handler (Go 1.22 ServeMux patterns, e.g. "GET /status").
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// HandleJSON registers a handler whose result is written as JSON.
func (s *Server) HandleJSON(pattern string, f func(r *http.Request) (any, int, error)) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		v, code, err := f(r)
		if err != nil {
			if code == 0 {
				code = http.StatusInternalServerError
			}
			WriteJSON(w, code, map[string]string{"error": err.Error()})
			return
		}
		if code == 0 {
			code = http.StatusOK
		}
		WriteJSON(w, code, v)
	})
}

// WriteJSON writes v with status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// Path is the socket's path.
func (s *Server) Path() string { return s.path }

// Serve serves until Close.
func (s *Server) Serve() error {
	err := s.srv.Serve(s.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the server and removes the socket.
func (s *Server) Close() error {
	err := s.srv.Close()
	os.Remove(s.path)
	return err
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, _ := r.Context().Value(peerKey{}).(peer)
	if !PeerAllowed(p.uid, p.ok, s.uid) {
		s.log.Warn().Int("peer_uid", p.uid).Msg("admin socket: refused a peer that is neither the daemon's user nor root")
		WriteJSON(w, http.StatusForbidden, map[string]string{"error": "only the daemon's user or root may use the admin socket"})
		return
	}
	s.mux.ServeHTTP(w, r)
}

// PeerAllowed is the admin socket's access rule: the daemon's own uid or
// root. A peer whose credentials could not be read is refused.
func PeerAllowed(peerUID int, known bool, daemonUID int) bool {
	return known && (peerUID == 0 || peerUID == daemonUID)
}

func peerOf(c net.Conn) peer {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peer{}
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peer{}
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil || cred == nil {
		return peer{}
	}
	return peer{uid: int(cred.Uid), ok: true}
}

// Client talks to a daemon's admin socket.
type Client struct {
	path string
	hc   *http.Client
	// serverUID is the uid besides root that may serve the socket: the
	// owner of the socket's directory (the state directory unless
	// admin.socket moves it). A variable so a test can name another.
	serverUID func() (int, error)
}

// ErrNoDaemon means nothing listens on the admin socket.
var ErrNoDaemon = errors.New("no securelink daemon is running")

// ErrPermission means the caller may not open the admin socket.
var ErrPermission = errors.New("permission denied on the admin socket")

// ErrUntrustedServer means the socket is served by a process that is
// neither root nor the owner of the socket's directory: not our daemon
// (another user may have bound the path while the daemon was stopped).
var ErrUntrustedServer = errors.New("the admin socket is not served by the securelink daemon")

// NewClient returns a client for the socket at path. It talks only to a
// server that the admin socket's own peer rule (PeerAllowed) admits, with
// the owner of the socket's directory as the daemon's uid.
func NewClient(path string) *Client {
	c := &Client{path: path, serverUID: func() (int, error) {
		o, err := atomicfile.OwnerOf(filepath.Dir(path))
		return o.UID, err
	}}
	c.hc = &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			Proxy:       nil,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return c.dial(ctx) },
		},
	}
	return c
}

// dial connects and checks who serves the socket (SO_PEERCRED of the
// listening process) before a byte is sent.
func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.path)
	if err != nil {
		return nil, err
	}
	want, err := c.serverUID()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: cannot tell who owns the directory of %s: %v", ErrUntrustedServer, c.path, err)
	}
	if p := peerOf(conn); !PeerAllowed(p.uid, p.ok, want) {
		conn.Close()
		who := "a process whose credentials could not be read"
		if p.ok {
			who = fmt.Sprintf("uid %d", p.uid)
		}
		return nil, fmt.Errorf("%w: %s is served by %s, neither root nor uid %d (the owner of %s); not sending it anything",
			ErrUntrustedServer, c.path, who, want, filepath.Dir(c.path))
	}
	return conn, nil
}

// dialError turns a failed connection into what the caller can act on.
func (c *Client) dialError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && errors.Is(ue.Err, ErrUntrustedServer) {
		return ue.Err // without the request's URL, which names no real host
	}
	var ne *net.OpError
	if !errors.As(err, &ne) || ne.Op != "dial" {
		return err
	}
	if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
		return fmt.Errorf("%w (%s): only the daemon's user (the service user, which owns the state directory) and root may connect: run this as that user (sudo -u securelink ...) or as root",
			ErrPermission, c.path)
	}
	return fmt.Errorf("%w (admin socket %s)", ErrNoDaemon, c.path)
}

// Do sends a request with an optional JSON body and decodes a JSON answer
// into out. A non-2xx answer becomes an error carrying the daemon's message.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://admin"+path, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, c.dialError(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return resp.StatusCode, fmt.Errorf("daemon: %s", e.Error)
		}
		return resp.StatusCode, fmt.Errorf("daemon answered %s", resp.Status)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("daemon answer: %w", err)
		}
	}
	return resp.StatusCode, nil
}

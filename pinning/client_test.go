package pinning

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// tlsServer is a real TLS listener on 127.0.0.1 that answers "ok" and
// records the SNI and resumption state of every handshake.
type tlsServer struct {
	addr string
	mu   sync.Mutex
	snis []string
	res  []bool
}

func startTLSServer(t *testing.T, id *Identity, maxVersion uint16) *tlsServer {
	t.Helper()
	s := &tlsServer{}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{id.Certificate},
		MaxVersion:   maxVersion,
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			s.mu.Lock()
			s.snis = append(s.snis, h.ServerName)
			s.mu.Unlock()
			return nil, nil
		},
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tc := c.(*tls.Conn)
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if tc.Handshake() != nil {
					return
				}
				s.mu.Lock()
				s.res = append(s.res, tc.ConnectionState().DidResume)
				s.mu.Unlock()
				_, _ = tc.Write([]byte("ok"))
			}()
		}
	}()
	return s
}

func (s *tlsServer) seen() ([]string, []bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.snis...), append([]bool(nil), s.res...)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// readAll reads the server's answer; reading also processes the TLS 1.3
// session tickets the server sends after the handshake.
func readAll(t *testing.T, c net.Conn) string {
	t.Helper()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDialPinned(t *testing.T) {
	id, err := LoadOrCreate(selfSignedConfig(t, "127.0.0.1", "hermes.example"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := LoadOrCreate(selfSignedConfig(t, "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	srv := startTLSServer(t, id, 0)

	c, err := DialPinned(ctx(t), srv.addr, "127.0.0.1", id.Pin)
	if err != nil {
		t.Fatalf("right pin: %v", err)
	}
	if got := readAll(t, c); got != "ok" {
		t.Fatalf("read %q", got)
	}
	c, err = DialPinned(ctx(t), srv.addr, "hermes.example", id.Pin)
	if err != nil {
		t.Fatalf("right pin, DNS name: %v", err)
	}
	readAll(t, c)

	if _, err := DialPinned(ctx(t), srv.addr, "127.0.0.1", other.Pin); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("wrong pin: %v", err)
	}
	for _, name := range []string{"192.0.2.1", "other.example", "127.0.0.10"} {
		_, err := DialPinned(ctx(t), srv.addr, name, id.Pin)
		if err == nil || errors.Is(err, ErrPinMismatch) || !strings.Contains(err.Error(), "does not name") {
			t.Errorf("right pin, wrong name %s: %v", name, err)
		}
	}
	if _, err := DialPinned(ctx(t), srv.addr, "127.0.0.1", "sha256/nope"); !errors.Is(err, ErrBadPin) {
		t.Errorf("malformed pin: %v", err)
	}

	// Clients send no SNI for IP authorities and the name for DNS ones.
	snis, _ := srv.seen()
	want := []string{"", "hermes.example", "", "", "other.example", ""}
	if strings.Join(snis, ",") != strings.Join(want, ",") {
		t.Errorf("SNIs %q, want %q", snis, want)
	}
}

// The pin check must also run when a session is resumed: a resumed
// handshake presents the certificates of the original one, and
// VerifyPeerCertificate would not run at all.
func TestPinnedCheckRunsOnResumedSessions(t *testing.T) {
	for _, v := range []struct {
		name string
		max  uint16
	}{{"TLS1.3", 0}, {"TLS1.2", tls.VersionTLS12}} {
		t.Run(v.name, func(t *testing.T) {
			id, err := LoadOrCreate(selfSignedConfig(t, "127.0.0.1"))
			if err != nil {
				t.Fatal(err)
			}
			other, err := LoadOrCreate(selfSignedConfig(t, "127.0.0.1"))
			if err != nil {
				t.Fatal(err)
			}
			srv := startTLSServer(t, id, v.max)
			cache := tls.NewLRUClientSessionCache(8)

			type check struct {
				resumed bool
				err     error
			}
			var checks []check
			dial := func(pin string) (*tls.Conn, error) {
				cfg, err := PinnedTLSConfig("127.0.0.1", pin)
				if err != nil {
					t.Fatal(err)
				}
				cfg.ClientSessionCache = cache
				inner := cfg.VerifyConnection
				cfg.VerifyConnection = func(cs tls.ConnectionState) error {
					err := inner(cs)
					checks = append(checks, check{cs.DidResume, err})
					return err
				}
				d := tls.Dialer{Config: cfg}
				c, err := d.DialContext(ctx(t), "tcp", srv.addr)
				if err != nil {
					return nil, err
				}
				return c.(*tls.Conn), nil
			}

			c, err := dial(id.Pin)
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, c)
			c, err = dial(id.Pin)
			if err != nil {
				t.Fatal(err)
			}
			if !c.ConnectionState().DidResume {
				t.Fatal("second connection did not resume; the test would prove nothing")
			}
			readAll(t, c)

			// The client now expects another key; the cached session must
			// not let the old endpoint through.
			if _, err := dial(other.Pin); !errors.Is(err, ErrPinMismatch) {
				t.Fatalf("resumed session with a changed pin: %v", err)
			}
			if len(checks) != 3 || checks[0].resumed || !checks[1].resumed || checks[1].err != nil ||
				!checks[2].resumed || !errors.Is(checks[2].err, ErrPinMismatch) {
				t.Fatalf("checks = %+v", checks)
			}
			_, res := srv.seen()
			if len(res) < 2 || res[0] || !res[1] {
				t.Errorf("server saw resumptions %v", res)
			}
		})
	}
}

func TestPinnedTLSConfigWithHTTPClient(t *testing.T) {
	id, err := LoadOrCreate(selfSignedConfig(t, "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "pinned")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{id.Certificate}}
	srv.StartTLS()
	defer srv.Close()

	cfg, err := PinnedTLSConfig("127.0.0.1", id.Pin)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "pinned" {
		t.Errorf("body %q", body)
	}

	// httptest's own certificate is not the pinned one.
	plain := httptest.NewTLSServer(http.NotFoundHandler())
	defer plain.Close()
	if _, err := client.Get(plain.URL); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("unpinned server: %v", err)
	}
}

func TestInspectRemote(t *testing.T) {
	id, err := LoadOrCreate(selfSignedConfig(t, "127.0.0.1", "hermes.example"))
	if err != nil {
		t.Fatal(err)
	}
	srv := startTLSServer(t, id, 0)
	info, err := InspectRemote(ctx(t), "https://"+srv.addr+"/ignored")
	if err != nil {
		t.Fatal(err)
	}
	if info.Pin != id.Pin || info.CertSHA256 != CertSHA256Hex(id.CertDER) || info.Subject != "CN=127.0.0.1" ||
		strings.Join(info.SANs, ",") != "hermes.example,127.0.0.1" || !info.NotAfter.Equal(id.Leaf.NotAfter) ||
		!info.NotBefore.Equal(id.Leaf.NotBefore) {
		t.Errorf("info = %+v", info)
	}
	if err := info.CheckPin(id.Pin); err != nil {
		t.Error(err)
	}
	other, err := LoadOrCreate(selfSignedConfig(t, "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := info.CheckPin(other.Pin); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("other pin: %v", err)
	}
	if err := info.CheckPin("sha256/x"); !errors.Is(err, ErrBadPin) {
		t.Errorf("bad pin: %v", err)
	}
	if snis, _ := srv.seen(); len(snis) != 1 || snis[0] != "" {
		t.Errorf("SNI sent for an IP: %q", snis)
	}
	for _, u := range []string{"http://" + srv.addr, "https://u:p@" + srv.addr, "https://", "https://" + srv.addr[:strings.LastIndex(srv.addr, ":")] + ":0", "::"} {
		if _, err := InspectRemote(ctx(t), u); err == nil {
			t.Errorf("InspectRemote(%q) accepted", u)
		}
	}
}

package doctor

import (
	"crypto/tls"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quic-go/quic-go/http3"

	"github.com/hermes-securelink/securelink/pinning"
)

// serveQUIC answers /relay/health over HTTP/3 on pc with cert.
func serveQUIC(t *testing.T, pc net.PacketConn, cert tls.Certificate) {
	t.Helper()
	srv := &http3.Server{
		TLSConfig: http3.ConfigureTLSConfig(&tls.Config{Certificates: []tls.Certificate{cert}}),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/relay/health" {
				http.NotFound(w, r)
				return
			}
			w.Write([]byte(`{"status":"ok"}`))
		}),
	}
	go srv.Serve(pc)
	t.Cleanup(func() { srv.Close() })
}

func TestHTTP3Check(t *testing.T) {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	f := newFixture(t)
	f.cfg.HTTP3 = true
	id, err := pinning.LoadOrCreate(pinning.IdentityConfig{StateDir: f.stateDir, Authority: pinning.Authority{Host: "127.0.0.1", Port: 9443}})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("pinned answer", func(t *testing.T) {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		f.cfg.Listen = pc.LocalAddr().String()
		serveQUIC(t, pc, id.Certificate)
		if r := find(t, f.run(t), "http3"); r.Status != OK {
			t.Fatalf("serving HTTP/3: %+v", r)
		}
	})
	t.Run("another key on UDP", func(t *testing.T) {
		other, err := pinning.LoadOrCreate(pinning.IdentityConfig{StateDir: filepath.Join(t.TempDir(), "other"), Authority: pinning.Authority{Host: "127.0.0.1", Port: 9443}})
		if err != nil {
			t.Fatal(err)
		}
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		f.cfg.Listen = pc.LocalAddr().String()
		serveQUIC(t, pc, other.Certificate)
		if r := find(t, f.run(t), "http3"); r.Status != Fail {
			t.Fatalf("a QUIC server with another pin passed: %+v", r)
		}
	})
	t.Run("nothing on UDP", func(t *testing.T) {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		f.cfg.Listen = pc.LocalAddr().String()
		pc.Close()
		r := find(t, f.run(t), "http3")
		if r.Status != Fail || !strings.Contains(r.Fix, "open UDP") {
			t.Fatalf("silent UDP port: %+v", r)
		}
	})
}

func TestHTTP3CheckWithoutDaemon(t *testing.T) {
	dir := t.TempDir()
	f := &fixture{stateDir: dir}
	busy, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	f.cfg = newFixture(t).cfg
	f.cfg.StateDir = dir
	f.cfg.HTTP3 = true
	f.cfg.Listen = busy.LocalAddr().String()
	if r := find(t, f.run(t), "http3"); r.Status != Fail || !strings.Contains(r.Fix, "free the UDP port") {
		t.Fatalf("busy UDP port: %+v", r)
	}
	addr := busy.LocalAddr().String()
	busy.Close()
	f.cfg.Listen = addr
	if r := find(t, f.run(t), "http3"); r.Status != OK {
		t.Fatalf("free UDP port: %+v", r)
	}
}

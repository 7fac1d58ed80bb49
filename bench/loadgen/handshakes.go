package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"
)

func cmdHandshakes(args []string) error {
	fs := flag.NewFlagSet("handshakes", flag.ExitOnError)
	addr := fs.String("addr", "", "server host:port")
	pin := fs.String("pin", "", "sha256/<b64> SPKI pin of the server")
	conns := fs.Int("conns", 16, "concurrent handshake loops")
	curve := fs.String("curve", "x25519", "the one key exchange offered: x25519 (the issue's) or x25519mlkem768 (Go's default first choice, what the connector and broker/client offer)")
	var win window
	win.flags(fs, time.Second, "server pids for CPU accounting")
	fs.Parse(args)
	if err := loopbackOnly(*addr); err != nil {
		return err
	}
	if *conns < 1 || *conns > maxConns {
		return errors.New("bad -conns")
	}
	cfg, err := clientTLS(*pin, []string{"http/1.1"})
	if err != nil {
		return err
	}
	if cfg.CurvePreferences, err = curveFlag(*curve); err != nil {
		return err
	}
	var state atomic.Value
	res, err := win.loop(*conns, func(int) (int64, error) { return 0, oneHandshake(*addr, cfg, &state) })
	if err != nil {
		return err
	}
	n, secs, cpu := res.ok, res.secs, res.cpu
	if n == 0 {
		return fmt.Errorf("no handshake succeeded (%d failed; last: %v)", res.fail, res.lastErr)
	}
	st, _ := state.Load().(tls.ConnectionState)
	fmt.Printf("ops=%d fail=%d secs=%.2f rate=%.1f cpu_us=%.0f cpu_per_op_us=%.1f tls=%s cipher=%s curve=%s\n",
		n, res.fail, secs, float64(n)/secs, cpu, cpu/float64(n),
		strings.ReplaceAll(tls.VersionName(st.Version), " ", ""), tls.CipherSuiteName(st.CipherSuite), st.CurveID)
	return nil
}

func oneHandshake(addr string, cfg *tls.Config, state *atomic.Value) error {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	c := tls.Client(raw, cfg)
	err = c.HandshakeContext(ctx)
	if err == nil && state.Load() == nil {
		state.Store(c.ConnectionState())
	}
	c.Close() // sends close_notify, so the server ends the connection quietly
	return err
}

// curveFlag is -curve: the single key exchange a calibration handshake
// offers, so the server has no other to pick.
func curveFlag(name string) ([]tls.CurveID, error) {
	switch name {
	case "x25519":
		return []tls.CurveID{tls.X25519}, nil
	case "x25519mlkem768":
		return []tls.CurveID{tls.X25519MLKEM768}, nil
	}
	return nil, fmt.Errorf("bad -curve %q: x25519 or x25519mlkem768", name)
}

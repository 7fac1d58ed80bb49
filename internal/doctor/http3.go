package doctor

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/quic-go/quic-go/http3"

	"github.com/hermes-securelink/securelink/internal/admin"
	"github.com/hermes-securelink/securelink/internal/config"
	"github.com/hermes-securelink/securelink/pinning"
)

// checkHTTP3 checks the UDP side of `http3: true`. With the daemon up it
// completes a pinned QUIC handshake and a GET /relay/health over HTTP/3 on
// the listen port, checking the same pin as TCP (a firewall that passes TCP
// but drops UDP is the usual failure); with the daemon down it only checks
// that the UDP port can be bound.
func checkHTTP3(ctx context.Context, cfg *config.Config, st *admin.Status, o Options, add func(Result)) {
	host, port, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return // the config check already failed
	}
	if st == nil {
		pc, err := net.ListenPacket("udp", cfg.Listen)
		if err != nil {
			add(Result{"http3", Fail, "UDP " + cfg.Listen + " cannot be bound: " + err.Error(),
				"free the UDP port (another QUIC server?) or set http3: false"})
			return
		}
		pc.Close()
		add(Result{"http3", OK, "UDP " + cfg.Listen + " is free (the daemon is not running)", ""})
		return
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	target := net.JoinHostPort(host, port)
	authHost, _, err := net.SplitHostPort(st.Authority)
	if err != nil {
		authHost = host
	}
	tc, err := pinning.PinnedTLSConfig(authHost, st.PinSHA256)
	if err != nil {
		add(Result{"http3", Fail, "the daemon reports an unusable pin: " + err.Error(), "restart the daemon"})
		return
	}
	tr := &http3.Transport{TLSClientConfig: tc}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+target+"/relay/health", nil)
	req.Host = st.Authority
	resp, err := tr.RoundTrip(req)
	if err != nil {
		add(Result{"http3", Fail, fmt.Sprintf("no pinned HTTP/3 answer on UDP %s: %s", target, errKind(err)),
			"open UDP " + port + " in the firewall; a daemon started before http3 was set needs a restart"})
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		add(Result{"http3", Fail, fmt.Sprintf("GET /relay/health over HTTP/3 answered %d", resp.StatusCode), "see the daemon's log"})
		return
	}
	add(Result{"http3", OK, "pinned HTTP/3 on UDP " + target, ""})
}

package proxy

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/hermes-securelink/securelink/relay"
)

// ServeReach serves ln, the Reach connector's listener of broker streams,
// exactly as Serve does (same TLS, routes and policy) and marks every
// connection it accepts as arrived through Reach. This is the one place
// that origin is decided: the stream's remote address is synthetic and a
// request carries nothing trustworthy about it, so it comes from which
// listener accepted the connection. The /relay bridge reads the mark with
// relay.FromBrokerStream (the shared "reach" auth-failure source, the peer
// header, the route-credential handoff).
func (s *Server) ServeReach(ln net.Listener) error {
	return s.Serve(reachListener{ln})
}

// reachListener wraps every accepted connection in reachConn.
type reachListener struct{ net.Listener }

func (l reachListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return reachConn{c}, nil
}

// reachConn is a connection ServeReach accepted; only this package can
// make one.
type reachConn struct{ net.Conn }

// connContext is the http.Server's ConnContext: it marks the connections
// ServeReach accepted.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if _, ok := c.(reachConn); ok {
		return relay.WithBrokerStream(ctx)
	}
	return ctx
}

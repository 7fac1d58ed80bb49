package relay

import (
	"context"
	"net/http"

	"github.com/hermes-securelink/securelink/internal/policy"
)

type brokerStreamKey struct{}

// WithBrokerStream marks a connection context as having arrived through a
// Reach broker stream. The proxy's http.Server.ConnContext calls it for
// connections accepted from the Reach listener: that origin is invisible in
// the request itself (the stream's remote address is synthetic), yet it
// decides both the limiter source and whether the route-credential handoff
// runs, so it must come from the listener and never from a header.
func WithBrokerStream(ctx context.Context) context.Context {
	return context.WithValue(ctx, brokerStreamKey{}, true)
}

// FromBrokerStream reports whether ctx (a request's or connection's context)
// was marked by WithBrokerStream.
func FromBrokerStream(ctx context.Context) bool {
	v, _ := ctx.Value(brokerStreamKey{}).(bool)
	return v
}

// SourceReach is the single limiter source shared by every connection that
// arrived through the broker: the front cannot tell those clients apart.
const SourceReach = "reach"

// sourceUnknown groups requests whose RemoteAddr cannot be parsed. It should
// not happen with net/http listeners; grouping keeps such requests limited.
const sourceUnknown = "unknown"

// SourceOf names the auth-failure limiting source of r: "reach" for
// broker-arrived connections, else the client address as a prefix, IPv4 as
// /32 and IPv6 as its /64 (one subscriber usually owns a whole /64, so
// counting single IPv6 addresses would let one client rotate through
// billions of sources). IPv4-mapped IPv6 addresses count as IPv4.
func SourceOf(r *http.Request) string {
	if FromBrokerStream(r.Context()) {
		return SourceReach
	}
	addr, ok := policy.ClientAddr(r.RemoteAddr)
	if !ok {
		return sourceUnknown
	}
	bits := 64
	if addr.Is4() {
		bits = 32
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return sourceUnknown
	}
	return p.String()
}

// peerOf is the X-Hermes-Proxy-Peer value: the client's own address (not its
// prefix), so a Relay that reads it can apply its own policy, or "reach" for
// broker-arrived connections whose real address only the broker knows.
func peerOf(r *http.Request) string {
	if FromBrokerStream(r.Context()) {
		return SourceReach
	}
	addr, ok := policy.ClientAddr(r.RemoteAddr)
	if !ok {
		return sourceUnknown
	}
	return addr.String()
}

// Package wire is the Reach rendezvous protocol v1 and nothing else: the
// identifiers, tokens and digests, the JSON messages with their exact key
// sets, the 18-byte frame header of the host socket, the typed error codes
// and the limits. The broker, the host connector and the client all build on
// it, so a rule of the protocol is written down once, here, and the three
// cannot drift apart. The prose description is ../PROTOCOL.md; the
// authoritative contract is spec/reach.md.
//
// The package does no I/O and holds no state. Parsers take one WebSocket
// message (text or binary, as received) and either return a fully validated
// value or an *Error carrying the wire code the peer must be told. They are
// strict where the reference implementation was lax (exact key sets,
// protocol_version exactly the JSON integer 1, canonical identifiers,
// duplicate keys rejected) and lenient only where real peers need it
// (floating-point expires_at, whitespace in JSON, frames of 1 MiB + 18 bytes).
//
// Encoders are deterministic and emit compact JSON with the keys in the order
// the spec lists them; peers must still parse JSON rather than compare bytes,
// because the reference broker puts spaces after ':' and ','.
package wire

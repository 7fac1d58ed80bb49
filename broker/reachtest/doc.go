// Package reachtest holds end-to-end tests of Reach across its components:
// the rendezvous broker (broker/server), the host connector
// (broker/connector) serving the real Secure Link front (proxy) with a
// pinned identity, and the client (broker/client), all on real sockets on
// 127.0.0.1. Unit tests of each component live with it; these tests prove
// what only the assembly can show: flow control across every hop, pinning
// through a broker stream, restarts, and what the broker can see.
//
// The package has no code of its own: everything is in _test.go files.
package reachtest

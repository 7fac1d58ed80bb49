// Package pairing builds and checks the Hermes pairing payload that carries
// the Secure Link pin (and the Reach bootstrap route) to a phone or desktop
// client through a QR code shown on the host's own screen.
//
// The Relay, not this package, mints the pairing code and signs the payload:
// it alone reads the Hermes API key and the QR secret. This package gives the
// `securelink pair` command what it needs around that call: the endpoint
// candidates in the exact shape the clients accept, the request to the
// Relay's loopback /pairing/mint, the check that the signed payload carries
// our candidates unchanged, signature verification, the invite URL and the
// QR renderings.
//
// Everything that is compared or signed goes through a small JSON value tree
// of our own (see Parse and Canonical) instead of encoding/json, because the
// Relay signs Python's json.dumps(sort_keys=True, separators=(",", ":"),
// ensure_ascii=True) output: integers of any size stay integers, floats are
// written with Python's repr, keys sort by code point and no HTML escaping
// happens. Any difference of one byte would make every signature fail.
package pairing

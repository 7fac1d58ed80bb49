// Package relay serves the /relay namespace of the front: the JSON health
// document and the message-level WebSocket bridge to the Relay's /ws.
//
// The bridge is deliberately not a byte pipe. The Relay authenticates inside
// the WebSocket (its first frame), so the front must see message boundaries to
// observe the Relay's auth verdict (for per-source limiting), to cap message
// sizes, to translate close codes faithfully, and (Reach only) to extend the
// Relay's genuine auth.ok with a route credential. It never authenticates on
// the Relay's behalf and never fabricates a verdict.
package relay

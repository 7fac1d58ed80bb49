package wire

import "time"

// ProtocolVersion is the only version this package speaks; every message
// carries it as the JSON integer 1 and every frame as its first byte.
const ProtocolVersion = 1

// ConnectPath is the only path of the broker's WebSocket endpoint. Clients
// reject any other path, so it is not configurable (spec/reach.md, "Host
// connector" and pairing.md).
const ConnectPath = "/v1/connect"

// HealthService is the "service" value of the broker's GET /health body.
const HealthService = "hermes_reach"

// Sizes of messages and frames (spec/reach.md "Registration" and "Data").
const (
	// MaxControlBytes bounds every JSON text message in both directions: a
	// larger registration is unauthorized, a larger host control frame is a
	// framing violation.
	MaxControlBytes = 4096

	// HeaderLen is the fixed header of a host-socket frame: version (1 byte),
	// flags (1 byte), stream id (16 bytes).
	HeaderLen = 18

	// MaxClientFrame bounds one binary message on a client socket (raw
	// inner-TLS bytes). Larger messages close the client with 1009.
	MaxClientFrame = 1 << 20

	// MaxHostFrameIn is the largest host-socket frame a receiver accepts:
	// a full client message plus the header, which is what the reference
	// broker sends.
	MaxHostFrameIn = MaxClientFrame + HeaderLen

	// MaxHostFrameOut is the largest host-socket frame we send, header
	// included, because the reference connector refuses whole frames above
	// 1 MiB. A 1 MiB client message therefore becomes two DATA frames.
	MaxHostFrameOut = 1 << 20

	// MaxConnectorChunk is the payload size in which the connector cuts
	// broker-bound DATA, so one bulk stream cannot starve the small messages
	// of another stream sharing the host socket.
	MaxConnectorChunk = 64 << 10
)

// Identifier and credential sizes (spec/reach.md "Identifiers and tokens").
const (
	IDLen           = 22  // characters of a host_id, connection_id or stream_id
	TokenLen        = 43  // characters of a token we mint (32 random bytes)
	DigestLen       = 43  // characters of a token_sha256 value
	MinWireToken    = 32  // shortest token the broker accepts, in characters
	MaxWireToken    = 512 // longest token the broker accepts, in characters
	MaxLabelLen     = 128 // pairing_id / credential_id
	MaxExtensions   = 16  // names in one "extensions" list
	MaxExtensionLen = 32  // characters of one extension name
)

// Timers of the protocol (spec/reach.md). They are defaults: every consumer
// copies them into its own options struct so tests can shorten them.
const (
	// RegisterTimeout: the first frame must arrive within it, else unauthorized.
	RegisterTimeout = 10 * time.Second
	// PingInterval: both sides ping this often.
	PingInterval = 15 * time.Second
	// PongTimeout: a socket without a pong for this long is dropped.
	PongTimeout = 45 * time.Second
	// IdleTimeout: a stream without payload bytes in either direction for
	// this long is closed (pings do not count).
	IdleTimeout = 5 * time.Minute
	// SlowConsumerTimeout: a client that reads nothing from its full
	// client-bound queue for this long loses that stream (1013).
	SlowConsumerTimeout = 10 * time.Second
	// ReplayTTL: how long a connection_id stays in the replay cache, 24 h
	// plus 5 minutes of clock skew — not the credential's lifetime, so a
	// connect loop cannot pile up entries for 30–90 days.
	ReplayTTL = 24*time.Hour + 5*time.Minute
	// PublishTimeout: the connector waits this long for a publish reply
	// before releasing auth.ok without a route credential.
	PublishTimeout = 5 * time.Second
)

// Credential lifetimes (spec/reach.md "Identifiers and tokens", "Route
// credential handoff", "Admin socket endpoints").
const (
	// MaxRouteLifetime: a route expiry further ahead is clamped to now + this.
	MaxRouteLifetime = 90 * 24 * time.Hour
	// MaxBootstrapAhead: a bootstrap expiry further ahead is unauthorized.
	MaxBootstrapAhead = time.Hour
	// DefaultRouteLifetime applies when the Relay session has no expiry.
	DefaultRouteLifetime = 30 * 24 * time.Hour
	// RouteRenewBefore: a cached route credential is reused only while more
	// than this much of its lifetime remains.
	RouteRenewBefore = 7 * 24 * time.Hour
	// DefaultBootstrapTTL is the lifetime `securelink pair` asks for.
	DefaultBootstrapTTL = 600 * time.Second
)

// Queues of plain v1 flow control (spec/reach.md "Flow control in plain v1").
const (
	StreamQueueFrames = 32        // per stream and direction
	StreamQueueBytes  = 8 << 20   // per stream and direction
	HostQueueBytes    = 8 << 20   // all host-bound queues of one host together
	BrokerQueueBytes  = 512 << 20 // every queue of the broker together (configurable)
	// AuthOKHoldBytes bounds the Relay messages that wait behind an auth.ok
	// while its route credential is being published.
	AuthOKHoldBytes = 1 << 20
)

// Broker and connector limits (spec/reach.md "Broker state, limits,
// operation" and "Host connector"); the configurable ones are defaults.
const (
	// MaxHosts is 10,000, not the spec's 256: a public broker serves
	// thousands of households (docs/decisions.md "Broker defaults for a
	// public broker"); each idle host costs ~70 KiB and one socket.
	MaxHosts              = 10_000
	MaxStreamsPerHost     = 16
	MaxStreamsPerRoute    = 4
	MaxCredentialsPerHost = 1024
	AttemptsPerMinute     = 30
	// TrackingTableEntries bounds each of the replay, consumed, revoked and
	// closed-id tables.
	TrackingTableEntries = 1_000_000
	// ReplayPerCredential and ReplayPerHost bound the live client replay
	// entries of one credential and of all of one host's credentials
	// together; past either, that credential's or host's matches get
	// quota_exceeded until entries expire. The client table as a whole is
	// bounded by max_hosts × ReplayPerHost. ReplayPerHost is 2,000, not the
	// spec's 50,000: at 10,000 hosts the spec's share would bound the table
	// at 500 million entries (~72 GB); 2,000 stream opens per host per day
	// (1.4 a minute around the clock) bound it at 20 million (~2.9 GB).
	// ReplayPerCredential is a quarter of it (the spec's 10,000 was above
	// the per-host share, so it never bound and one device in a reconnect
	// loop could spend its household's whole day): a credential must stay
	// below its host's share (Config.Validate), so the host's other
	// credentials keep at least three quarters of it.
	ReplayPerHost       = 2_000
	ReplayPerCredential = ReplayPerHost / 4
)

// Connector reconnect policy (spec/reach.md "Host connector" and "Host
// registration while the host is already online").
const (
	// MaxReconnectDelay caps min(60 s, 2ⁿ s); a uniform jitter of up to a
	// quarter of the delay is added on top.
	MaxReconnectDelay = 60 * time.Second
	// BackoffResetAfter: only a registration that lasted this long resets
	// the attempt counter.
	BackoffResetAfter = 60 * time.Second
	// AuthFailureBackoff follows unauthorized or revoked.
	AuthFailureBackoff = 10 * time.Minute
	// ReplacedBackoff follows a close with reason "replaced".
	ReplacedBackoff = 60 * time.Second
)

// The "credit" extension (spec/reach.md last section, window.go); nothing
// in plain v1 uses them.
const (
	// ExtensionCredit is the name advertised in registered.extensions.
	ExtensionCredit = "credit"
	// InitialWindow is the per-stream, per-direction credit in payload bytes.
	InitialWindow = 256 << 10
	// MaxWindow: a window above it is a protocol error.
	MaxWindow = 1<<31 - 1
)

package wire

import (
	"encoding/json"
	"errors"

	"github.com/hermes-securelink/securelink/internal/strictjson"
)

// Role is the "role" of a registration.
type Role string

const (
	RoleHost   Role = "host"
	RoleClient Role = "client"
)

// Kind is a "credential_kind".
type Kind string

const (
	KindHost      Kind = "host"      // host registration token, role host only
	KindBootstrap Kind = "bootstrap" // one-use pairing token, role client
	KindRoute     Kind = "route"     // durable per-session token, role client
)

// Message type names, the "type" key of every JSON message.
const (
	TypeRegister         = "register"
	TypeRegistered       = "registered"
	TypePublishBootstrap = "publish_bootstrap"
	TypePublishRoute     = "publish_route"
	TypeRevoke           = "revoke"
	TypePublished        = "published"
	TypeRevoked          = "revoked"
	TypeOpen             = "open"
	TypeMatched          = "matched"
	TypeError            = "error"
	// TypeExtensions is the connector's answer to the extensions offered in
	// registered ("credit" extension); plain v1 has no such message.
	TypeExtensions = "extensions"
)

// Message is one JSON message of the protocol. The set is closed: only the
// types of this package implement it.
type Message interface {
	// Type returns the "type" value.
	Type() string
	appendJSON(b []byte) ([]byte, error)
}

// Register is the first frame of every connection (client or host → broker).
type Register struct {
	Role           Role
	HostID         ID
	ConnectionID   ID
	CredentialKind Kind
	Token          Secret
}

// Registered answers a host's successful registration. Extensions lists the
// extensions this broker offers (empty in plain v1); the key is sent only
// when the list is non-empty, so reference connectors see the exact v1 shape.
type Registered struct {
	Extensions []string
}

// Extensions is the host's answer to the extensions a broker offered in
// registered: the ones it agrees to (host → broker, never answered).
type Extensions struct {
	Names []string
}

// Has reports whether name is in the list.
func (m Extensions) Has(name string) bool { return hasName(m.Names, name) }

// Has reports whether the broker offers the extension name.
func (m Registered) Has(name string) bool { return hasName(m.Extensions, name) }

func hasName(list []string, name string) bool {
	for _, x := range list {
		if x == name {
			return true
		}
	}
	return false
}

// PublishBootstrap publishes the digest of a one-use pairing token
// (host → broker). max_uses is always 1 on the wire and has no field.
type PublishBootstrap struct {
	PairingID   string
	TokenSHA256 Digest
	ExpiresAt   int64
}

// PublishRoute publishes (or replaces, per credential_id) the digest of a
// route token (host → broker).
type PublishRoute struct {
	CredentialID string
	TokenSHA256  Digest
	ExpiresAt    int64
	DeviceIDHash Digest
}

// Revoke revokes a route credential (host → broker). credential_kind is
// always "route" on the wire and has no field.
type Revoke struct {
	CredentialID string
}

// Published acknowledges a publish (broker → host). Label is the pairing_id
// for KindBootstrap and the credential_id for KindRoute; the kind decides
// which key carries it.
type Published struct {
	CredentialKind Kind
	Label          string
}

// Revoked acknowledges a revoke (broker → host).
type Revoked struct {
	CredentialID string
}

// Open asks the host to accept a stream (broker → host). A host whose
// current connection_id differs from HostConnectionID answers CLOSE.
type Open struct {
	StreamID         ID
	HostConnectionID ID
}

// Matched tells a client its stream is ready (broker → client); binary
// frames follow.
type Matched struct {
	StreamID ID
}

// ErrorMsg is {"type":"error",...} (broker → peer). Err gives the Go error.
type ErrorMsg struct {
	Code Code
}

// Err returns the error the code stands for (a sentinel for known codes).
func (m ErrorMsg) Err() error { return m.Code.Err() }

func (Register) Type() string         { return TypeRegister }
func (Registered) Type() string       { return TypeRegistered }
func (PublishBootstrap) Type() string { return TypePublishBootstrap }
func (PublishRoute) Type() string     { return TypePublishRoute }
func (Revoke) Type() string           { return TypeRevoke }
func (Published) Type() string        { return TypePublished }
func (Revoked) Type() string          { return TypeRevoked }
func (Open) Type() string             { return TypeOpen }
func (Matched) Type() string          { return TypeMatched }
func (ErrorMsg) Type() string         { return TypeError }
func (Extensions) Type() string       { return TypeExtensions }

// Exact key sets. A received message must carry exactly these keys (the one
// optional key, registered.extensions, is handled by its parser).
var (
	keysRegister         = []string{"type", "protocol_version", "role", "host_id", "connection_id", "credential_kind", "token"}
	keysRegistered       = []string{"type", "protocol_version"}
	keysExtensions       = []string{"type", "protocol_version", "extensions"}
	keysPublishBootstrap = []string{"type", "protocol_version", "pairing_id", "token_sha256", "expires_at", "max_uses"}
	keysPublishRoute     = []string{"type", "protocol_version", "credential_id", "token_sha256", "expires_at", "device_id_hash"}
	keysRevoke           = []string{"type", "protocol_version", "credential_kind", "credential_id"}
	keysPublishedBoot    = []string{"type", "protocol_version", "credential_kind", "pairing_id"}
	keysPublishedRoute   = []string{"type", "protocol_version", "credential_kind", "credential_id"}
	keysRevoked          = []string{"type", "protocol_version", "credential_kind", "credential_id"}
	keysOpen             = []string{"type", "protocol_version", "stream_id", "host_connection_id"}
	keysMatched          = []string{"type", "protocol_version", "stream_id"}
	keysError            = []string{"type", "protocol_version", "code"}
)

// ---------------------------------------------------------------------------
// Encoding

// Marshal encodes m as compact JSON with exactly the spec's keys in the
// spec's order. It refuses a message the receiving side would reject (bad
// label, unknown kind, token length, over MaxControlBytes), so a bug shows up
// as an error here rather than as a disconnect at the peer.
func Marshal(m Message) ([]byte, error) {
	b := make([]byte, 0, 160)
	b = append(b, `{"type":"`...)
	b = append(b, m.Type()...)
	b = append(b, `","protocol_version":1`...)
	b, err := m.appendJSON(b)
	if err != nil {
		return nil, err
	}
	b = append(b, '}')
	if len(b) > MaxControlBytes {
		return nil, errf(CodeUnauthorized, "encoded message exceeds 4096 bytes")
	}
	return b, nil
}

// appendField appends ,"key":"value" for values that need no escaping (IDs,
// digests, labels, kinds, codes — all validated to a safe alphabet).
func appendField(b []byte, key, value string) []byte {
	b = append(b, `,"`...)
	b = append(b, key...)
	b = append(b, `":"`...)
	b = append(b, value...)
	return append(b, '"')
}

func appendInt(b []byte, key string, v int64) []byte {
	b = append(b, `,"`...)
	b = append(b, key...)
	b = append(b, `":`...)
	return appendInt64(b, v)
}

func appendInt64(b []byte, v int64) []byte {
	var tmp [20]byte
	i := len(tmp)
	u := uint64(v)
	if v < 0 {
		u = uint64(-v) // wraps correctly for MinInt64
	}
	for {
		i--
		tmp[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			break
		}
	}
	if v < 0 {
		b = append(b, '-')
	}
	return append(b, tmp[i:]...)
}

func (m Register) appendJSON(b []byte) ([]byte, error) {
	switch {
	case m.Role == RoleHost && m.CredentialKind == KindHost:
	case m.Role == RoleClient && (m.CredentialKind == KindBootstrap || m.CredentialKind == KindRoute):
	default:
		return nil, errf(CodeUnauthorized, "role and credential_kind do not match")
	}
	if !ValidWireToken(string(m.Token)) {
		return nil, errf(CodeUnauthorized, "token length outside 32..512")
	}
	b = appendField(b, "role", string(m.Role))
	b = appendField(b, "host_id", m.HostID.String())
	b = appendField(b, "connection_id", m.ConnectionID.String())
	b = appendField(b, "credential_kind", string(m.CredentialKind))
	b = append(b, `,"token":`...)
	return appendString(b, string(m.Token)), nil
}

// appendString writes s as a JSON string, escaping only what JSON requires
// (quote, backslash, control characters) so the output is deterministic and
// never longer than necessary. s is valid UTF-8 (ValidWireToken checked it).
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func (m Registered) appendJSON(b []byte) ([]byte, error) {
	if len(m.Extensions) == 0 {
		return b, nil
	}
	return appendExtensions(b, m.Extensions)
}

// Extensions always carries its list, even an empty one.
func (m Extensions) appendJSON(b []byte) ([]byte, error) {
	if len(m.Names) == 0 {
		return append(b, `,"extensions":[]`...), nil
	}
	return appendExtensions(b, m.Names)
}

func appendExtensions(b []byte, names []string) ([]byte, error) {
	if len(names) > MaxExtensions {
		return nil, errf(CodeUnauthorized, "too many extensions")
	}
	b = append(b, `,"extensions":[`...)
	for i, e := range names {
		if !ValidExtension(e) {
			return nil, errf(CodeUnauthorized, "bad extension name")
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, e...)
		b = append(b, '"')
	}
	return append(b, ']'), nil
}

func (m PublishBootstrap) appendJSON(b []byte) ([]byte, error) {
	if !ValidLabel(m.PairingID) {
		return nil, errf(CodeUnauthorized, "bad pairing_id")
	}
	b = appendField(b, "pairing_id", m.PairingID)
	b = appendField(b, "token_sha256", m.TokenSHA256.String())
	b = appendInt(b, "expires_at", m.ExpiresAt)
	return append(b, `,"max_uses":1`...), nil
}

func (m PublishRoute) appendJSON(b []byte) ([]byte, error) {
	if !ValidLabel(m.CredentialID) {
		return nil, errf(CodeUnauthorized, "bad credential_id")
	}
	b = appendField(b, "credential_id", m.CredentialID)
	b = appendField(b, "token_sha256", m.TokenSHA256.String())
	b = appendInt(b, "expires_at", m.ExpiresAt)
	return appendField(b, "device_id_hash", m.DeviceIDHash.String()), nil
}

func (m Revoke) appendJSON(b []byte) ([]byte, error) {
	if !ValidLabel(m.CredentialID) {
		return nil, errf(CodeUnauthorized, "bad credential_id")
	}
	b = appendField(b, "credential_kind", string(KindRoute))
	return appendField(b, "credential_id", m.CredentialID), nil
}

func (m Published) appendJSON(b []byte) ([]byte, error) {
	if !ValidLabel(m.Label) {
		return nil, errf(CodeUnauthorized, "bad label")
	}
	switch m.CredentialKind {
	case KindBootstrap:
		b = appendField(b, "credential_kind", string(KindBootstrap))
		return appendField(b, "pairing_id", m.Label), nil
	case KindRoute:
		b = appendField(b, "credential_kind", string(KindRoute))
		return appendField(b, "credential_id", m.Label), nil
	}
	return nil, errf(CodeUnauthorized, "published kind is neither bootstrap nor route")
}

func (m Revoked) appendJSON(b []byte) ([]byte, error) {
	if !ValidLabel(m.CredentialID) {
		return nil, errf(CodeUnauthorized, "bad credential_id")
	}
	b = appendField(b, "credential_kind", string(KindRoute))
	return appendField(b, "credential_id", m.CredentialID), nil
}

func (m Open) appendJSON(b []byte) ([]byte, error) {
	b = appendField(b, "stream_id", m.StreamID.String())
	return appendField(b, "host_connection_id", m.HostConnectionID.String()), nil
}

func (m Matched) appendJSON(b []byte) ([]byte, error) {
	return appendField(b, "stream_id", m.StreamID.String()), nil
}

func (m ErrorMsg) appendJSON(b []byte) ([]byte, error) {
	if !m.Code.Known() {
		return nil, errf(CodeUnauthorized, "error code unknown to protocol v1")
	}
	return appendField(b, "code", string(m.Code)), nil
}

// ---------------------------------------------------------------------------
// Decoding

// object is one top-level JSON object with raw member values.
type object map[string]json.RawMessage

// decodeObject reads a text frame as exactly one JSON object
// (internal/strictjson). Any failure is a framing violation: over the size
// limit, not UTF-8 or not JSON (trailing data included), not an object, or
// a repeated key at any depth (two parsers could otherwise disagree on
// which value counts).
func decodeObject(frame []byte) (object, *Error) {
	obj, err := strictjson.ParseObject(frame, MaxControlBytes)
	switch {
	case err == nil:
		return object(obj), nil
	case errors.Is(err, strictjson.ErrTooLarge):
		return nil, violation("text frame exceeds 4096 bytes")
	case errors.Is(err, strictjson.ErrDuplicate):
		return nil, violation("duplicate key")
	case errors.Is(err, strictjson.ErrNotObject):
		return nil, violation("JSON is not an object")
	default:
		return nil, violation("text frame is not JSON")
	}
}

// typ returns the "type" value, or "" when it is missing or not a string.
func (o object) typ() string {
	s, _ := strictjson.String(o["type"])
	return s
}

// hasKeys reports whether o has exactly the given keys plus any of the
// optional ones.
func (o object) hasKeys(keys []string, optional ...string) bool {
	n := 0
	for _, k := range optional {
		if _, ok := o[k]; ok {
			n++
		}
	}
	if len(o) != len(keys)+n {
		return false
	}
	for _, k := range keys {
		if _, ok := o[k]; !ok {
			return false
		}
	}
	return true
}

// version checks protocol_version byte for byte: only the JSON integer 1.
// true, 1.0, 1e0, "1" and 2 are all unsupported_version.
func (o object) version() *Error {
	if string(o["protocol_version"]) != "1" {
		return errf(CodeUnsupportedVersion, "protocol_version is not the integer 1")
	}
	return nil
}

// str reads a string member; a non-string is a field error.
func (o object) str(key string) (string, bool) {
	return strictjson.String(o[key])
}

func (o object) id(key string) (ID, bool) {
	s, ok := o.str(key)
	if !ok {
		return ID{}, false
	}
	id, err := ParseID(s)
	return id, err == nil
}

func (o object) digest(key string) (Digest, bool) {
	s, ok := o.str(key)
	if !ok {
		return Digest{}, false
	}
	d, err := ParseDigest(s)
	return d, err == nil
}

func (o object) label(key string) (string, bool) {
	s, ok := o.str(key)
	return s, ok && ValidLabel(s)
}

// ParseRegister decodes the first frame of a connection. Checks run in the
// spec's order — structure and exact key set first, then protocol_version,
// then the fields — so a frame with an extra key and a bad version is
// unauthorized, not unsupported_version. Every error is followed by close
// 1008, whatever its code. A binary first message never reaches this parser:
// the caller answers it unauthorized itself.
func ParseRegister(frame []byte) (Register, error) {
	obj, e := decodeObject(frame)
	if e != nil {
		return Register{}, e
	}
	if obj.typ() != TypeRegister || !obj.hasKeys(keysRegister) {
		return Register{}, violation("not a register message with the exact key set")
	}
	if e := obj.version(); e != nil {
		return Register{}, e
	}
	var r Register
	role, _ := obj.str("role")
	kind, _ := obj.str("credential_kind")
	r.Role, r.CredentialKind = Role(role), Kind(kind)
	switch {
	case r.Role == RoleHost && r.CredentialKind == KindHost:
	case r.Role == RoleClient && (r.CredentialKind == KindBootstrap || r.CredentialKind == KindRoute):
	default:
		return Register{}, errf(CodeUnauthorized, "role and credential_kind do not match")
	}
	var ok bool
	if r.HostID, ok = obj.id("host_id"); !ok {
		return Register{}, errf(CodeUnauthorized, "host_id is not a canonical id")
	}
	if r.ConnectionID, ok = obj.id("connection_id"); !ok {
		return Register{}, errf(CodeUnauthorized, "connection_id is not a canonical id")
	}
	tok, ok := obj.str("token")
	if !ok || !ValidWireToken(tok) {
		return Register{}, errf(CodeUnauthorized, "token is not a string of 32..512 characters")
	}
	r.Token = Secret(tok)
	return r, nil
}

// ParseHostControl decodes a text frame a host sends after a plain-v1
// registered: PublishBootstrap, PublishRoute or Revoke. Errors with
// Violation set (oversize, not JSON, unknown type, wrong key set) end the
// registration; the others (version, field values) are answered with an
// error message and the host stays connected. Time-dependent checks are
// CheckExpiry's job. An "extensions" message is an unknown type here.
func ParseHostControl(frame []byte) (Message, error) { return parseHostControl(frame, false) }

// ParseHostControlOffering is ParseHostControl for a broker whose
// registered offered extensions: it also decodes the host's Extensions
// answer. Every error in an Extensions message is a violation; whether it
// came at the right moment, and names only offered extensions, is the
// caller's check.
func ParseHostControlOffering(frame []byte) (Message, error) { return parseHostControl(frame, true) }

func parseHostControl(frame []byte, offering bool) (Message, error) {
	obj, e := decodeObject(frame)
	if e != nil {
		return nil, e
	}
	switch obj.typ() {
	case TypeExtensions:
		if !offering {
			break
		}
		if !obj.hasKeys(keysExtensions) {
			return nil, violation("extensions key set")
		}
		if e := obj.version(); e != nil {
			e.Violation = true
			return nil, e
		}
		names, ok := parseExtensionList(obj["extensions"])
		if !ok {
			return nil, violation("bad extensions list")
		}
		return Extensions{Names: names}, nil
	case TypePublishBootstrap:
		if !obj.hasKeys(keysPublishBootstrap) {
			return nil, violation("publish_bootstrap key set")
		}
		if e := obj.version(); e != nil {
			return nil, e
		}
		var m PublishBootstrap
		var ok bool
		if m.PairingID, ok = obj.label("pairing_id"); !ok {
			return nil, errf(CodeUnauthorized, "bad pairing_id")
		}
		if m.TokenSHA256, ok = obj.digest("token_sha256"); !ok {
			return nil, errf(CodeUnauthorized, "bad token_sha256")
		}
		var err error
		if m.ExpiresAt, err = ParseExpiresAt(obj["expires_at"]); err != nil {
			return nil, err
		}
		if string(obj["max_uses"]) != "1" {
			return nil, errf(CodeUnauthorized, "max_uses is not the integer 1")
		}
		return m, nil
	case TypePublishRoute:
		if !obj.hasKeys(keysPublishRoute) {
			return nil, violation("publish_route key set")
		}
		if e := obj.version(); e != nil {
			return nil, e
		}
		var m PublishRoute
		var ok bool
		if m.CredentialID, ok = obj.label("credential_id"); !ok {
			return nil, errf(CodeUnauthorized, "bad credential_id")
		}
		if m.TokenSHA256, ok = obj.digest("token_sha256"); !ok {
			return nil, errf(CodeUnauthorized, "bad token_sha256")
		}
		var err error
		if m.ExpiresAt, err = ParseExpiresAt(obj["expires_at"]); err != nil {
			return nil, err
		}
		if m.DeviceIDHash, ok = obj.digest("device_id_hash"); !ok {
			return nil, errf(CodeUnauthorized, "bad device_id_hash")
		}
		return m, nil
	case TypeRevoke:
		if !obj.hasKeys(keysRevoke) {
			return nil, violation("revoke key set")
		}
		if e := obj.version(); e != nil {
			return nil, e
		}
		if k, _ := obj.str("credential_kind"); k != string(KindRoute) {
			return nil, errf(CodeUnauthorized, "only route credentials are revoked")
		}
		id, ok := obj.label("credential_id")
		if !ok {
			return nil, errf(CodeUnauthorized, "bad credential_id")
		}
		return Revoke{CredentialID: id}, nil
	}
	return nil, violation("unknown host control type")
}

// ParseBrokerMessage decodes a text frame received from the broker: what a
// connector gets (registered, published, revoked, open, error) and what a
// client gets (matched, error). Every key set is exact, except that
// registered may carry "extensions". Each caller rejects the types it does
// not expect. All errors mean the broker broke the protocol.
func ParseBrokerMessage(frame []byte) (Message, error) {
	obj, e := decodeObject(frame)
	if e != nil {
		return nil, e
	}
	typ := obj.typ()
	var keys []string
	var optional []string
	switch typ {
	case TypeRegistered:
		keys, optional = keysRegistered, []string{"extensions"}
	case TypePublished:
		keys = keysPublishedRoute
		if k, _ := obj.str("credential_kind"); k == string(KindBootstrap) {
			keys = keysPublishedBoot
		}
	case TypeRevoked:
		keys = keysRevoked
	case TypeOpen:
		keys = keysOpen
	case TypeMatched:
		keys = keysMatched
	case TypeError:
		keys = keysError
	default:
		return nil, violation("unknown broker message type")
	}
	if !obj.hasKeys(keys, optional...) {
		return nil, violation(typ + " key set")
	}
	if e := obj.version(); e != nil {
		e.Violation = true
		return nil, e
	}
	bad := func(detail string) (Message, error) { return nil, violation(detail) }
	switch typ {
	case TypeRegistered:
		var m Registered
		if raw, ok := obj["extensions"]; ok {
			if m.Extensions, ok = parseExtensionList(raw); !ok {
				return bad("bad extensions list")
			}
		}
		return m, nil
	case TypePublished:
		k, _ := obj.str("credential_kind")
		key := "credential_id"
		switch Kind(k) {
		case KindBootstrap:
			key = "pairing_id"
		case KindRoute:
		default:
			return bad("published kind is neither bootstrap nor route")
		}
		label, ok := obj.label(key)
		if !ok {
			return bad("bad " + key)
		}
		return Published{CredentialKind: Kind(k), Label: label}, nil
	case TypeRevoked:
		if k, _ := obj.str("credential_kind"); k != string(KindRoute) {
			return bad("revoked kind is not route")
		}
		id, ok := obj.label("credential_id")
		if !ok {
			return bad("bad credential_id")
		}
		return Revoked{CredentialID: id}, nil
	case TypeOpen:
		sid, ok1 := obj.id("stream_id")
		hid, ok2 := obj.id("host_connection_id")
		if !ok1 || !ok2 {
			return bad("open ids are not canonical")
		}
		return Open{StreamID: sid, HostConnectionID: hid}, nil
	case TypeMatched:
		sid, ok := obj.id("stream_id")
		if !ok {
			return bad("stream_id is not canonical")
		}
		return Matched{StreamID: sid}, nil
	default: // TypeError
		// A code v1 does not know is accepted when it is well-formed, so a
		// newer broker's reason still reaches the operator's status output.
		c, ok := obj.str("code")
		if !ok || !ValidExtension(c) {
			return bad("bad error code")
		}
		return ErrorMsg{Code: Code(c)}, nil
	}
}

// parseExtensionList decodes a JSON array of at most MaxExtensions valid
// extension names.
func parseExtensionList(raw json.RawMessage) ([]string, bool) {
	var names []string
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &names) != nil || len(names) > MaxExtensions {
		return nil, false
	}
	for _, x := range names {
		if !ValidExtension(x) {
			return nil, false
		}
	}
	return names, true
}

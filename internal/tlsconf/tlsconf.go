// Package tlsconf is the server TLS policy the front and the broker share,
// so the two listeners cannot drift apart.
package tlsconf

import "crypto/tls"

// MinVersion is the oldest protocol either server speaks.
const MinVersion = tls.VersionTLS12

// TLS12Suites are the TLS 1.2 suites offered: ECDHE with an AEAD cipher
// only, for either key type (Go's default list adds CBC-SHA1 suites).
// TLS 1.3 suites are not configurable and are Go's.
var TLS12Suites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

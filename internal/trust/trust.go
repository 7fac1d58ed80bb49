// Package trust builds the certificate pool used to verify a Reach broker:
// the system roots plus an operator-supplied CA file (private brokers,
// tests). The connector, `securelink connect` and doctor must agree on it,
// or doctor would bless a broker the connector then refuses.
package trust

import (
	"crypto/x509"
	"fmt"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

// maxCAFile bounds the CA file read.
const maxCAFile = 1 << 20

// BrokerRoots returns the system roots plus the certificates in caFile
// (PEM) when it is set.
func BrokerRoots(caFile string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if caFile == "" {
		return pool, nil
	}
	// ReadPrivate refuses what is not a regular file and stops at the
	// bound while reading, so a FIFO cannot hang a start and a file that
	// grows after a stat is not read whole. The CA file is public: no mode
	// is refused.
	pem, _, err := atomicfile.ReadPrivate(caFile, maxCAFile, 0)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
	}
	return pool, nil
}

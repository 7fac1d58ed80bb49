// Package trust builds the certificate pool used to verify a Reach broker:
// the system roots plus an operator-supplied CA file (private brokers,
// tests). The connector, `securelink connect` and doctor must agree on it,
// or doctor would bless a broker the connector then refuses.
package trust

import (
	"crypto/x509"
	"fmt"
	"os"
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
	fi, err := os.Stat(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	if fi.Size() > maxCAFile {
		return nil, fmt.Errorf("CA file %s is larger than %d bytes", caFile, maxCAFile)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
	}
	return pool, nil
}

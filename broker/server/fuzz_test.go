package server

import (
	"strings"
	"testing"
)

// FuzzParseConfig: any input either fails with an error that names the file
// or yields a configuration that validates.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("hosts_file: h\nstate_file: s\ninsecure_plaintext: true\nlisten: 127.0.0.1:1\n"))
	f.Add([]byte("listen: \":9444\"\ntls: {cert_file: c, key_file: k, acme: {email: \"\", ca: \"\", domains: []}}\nhosts_file: h\nstate_file: s\nmax_hosts: 256\nmetrics: {listen: \"\"}\nlog: {level: info, format: auto}\n"))
	f.Add([]byte("max_hosts: -1\n"))
	f.Add([]byte("tls: [1, 2]\n"))
	f.Add([]byte("listen: &a x\nhosts_file: *a\n"))
	f.Add([]byte("hosts_file: h\nhosts_file: h\n"))
	f.Add([]byte("\t"))
	f.Add([]byte(""))
	f.Add([]byte("max_queue_bytes: 99999999999999999999999\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig("fuzz.yaml", data)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed config does not validate: %v", err)
		}
	})
}

package main

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"time"
)

// tlsRecord is the plaintext of a full TLS record: what crypto/tls seals
// and opens at a time on a bulk stream.
const tlsRecord = 16 << 10

// cmdAEADFloor is the calibration under the broker's CPU per byte: every
// byte a stream carries is opened once (the sender's TLS) and sealed once
// (the receiver's), so two AES-128-GCM passes per byte are what no relay
// of TLS sockets can go below. It seals and opens full records in this
// process (bench/reach.sh runs it on the broker's core) for -duration and
// prints the CPU both passes cost per 10^9 bytes.
func cmdAEADFloor(args []string) error {
	fs := flag.NewFlagSet("aead-floor", flag.ExitOnError)
	dur := fs.Duration("duration", time.Second, "how long to seal and open records")
	fs.Parse(args)
	if *dur <= 0 || *dur > maxDuration {
		return errors.New("bad -duration")
	}
	res, err := aeadFloor(*dur)
	if err != nil {
		return err
	}
	fmt.Println(res.line())
	return nil
}

type aeadResult struct {
	bytes int64   // plaintext bytes, each sealed and opened once
	secs  float64 // wall time
	cpuUS float64 // this process's CPU over the loop
}

func (r aeadResult) perGB() float64 { return r.cpuUS / 1e6 / (float64(r.bytes) / 1e9) }

func (r aeadResult) line() string {
	return fmt.Sprintf("bytes=%d secs=%.2f cpu_us=%.0f gbs_per_pass=%.2f cpu_s_per_gb=%.3f",
		r.bytes, r.secs, r.cpuUS, 2*float64(r.bytes)/1e9/max(r.cpuUS/1e6, 1e-9), r.perGB())
}

// aeadFloor seals and opens tlsRecord-byte records with AES-128-GCM (the
// suite crypto/tls picks first on CPUs with AES instructions), in place
// and with a fresh nonce per record as TLS does, for about d.
func aeadFloor(d time.Duration) (aeadResult, error) {
	key := make([]byte, 16)
	if _, err := rand.Read(key); err != nil {
		return aeadResult{}, err
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		return aeadResult{}, err
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return aeadResult{}, err
	}
	buf := make([]byte, tlsRecord, tlsRecord+aead.Overhead())
	nonce := make([]byte, aead.NonceSize())
	var r aeadResult
	cpu0, t0 := selfCPUMicros(), time.Now()
	for seq := uint64(0); ; seq++ {
		for i := range 8 {
			nonce[len(nonce)-1-i] = byte(seq >> (8 * i))
		}
		sealed := aead.Seal(buf[:0], nonce, buf, nil)
		opened, err := aead.Open(sealed[:0], nonce, sealed, nil)
		if err != nil {
			return r, fmt.Errorf("open: %w", err)
		}
		buf = opened
		r.bytes += tlsRecord
		if seq%64 == 63 && time.Since(t0) >= d {
			break
		}
	}
	r.secs = time.Since(t0).Seconds()
	r.cpuUS = selfCPUMicros() - cpu0
	if r.cpuUS <= 0 {
		return r, errors.New("no CPU time measured (the loop was too short for the clock)")
	}
	return r, nil
}

//go:build pgoprofile

// The CPU profile behind cmd/securelink/default.pgo (`make pgo`,
// bench/pgo.sh). Only a binary built with -tags pgoprofile has it: the
// shipped build exposes no profiler. With SECURELINK_CPUPROFILE_DIR set, the
// process CPU-profiles itself from start-up; on SIGUSR1 it stops and writes
// DIR/securelink-PID.pprof (atomically, so a file that exists is whole).
// A process that ends without SIGUSR1 writes nothing.

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"

	"github.com/hermes-securelink/securelink/internal/atomicfile"
)

func init() {
	if dir := os.Getenv("SECURELINK_CPUPROFILE_DIR"); dir != "" {
		if err := startPGOProfile(dir, os.Getpid()); err != nil {
			fmt.Fprintln(os.Stderr, "securelink: cpu profile:", err)
			os.Exit(1)
		}
	}
}

// startPGOProfile starts the CPU profile and writes it to
// dir/securelink-PID.pprof on the first SIGUSR1.
func startPGOProfile(dir string, pid int) error {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return err
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		<-usr1
		signal.Stop(usr1)
		pprof.StopCPUProfile()
		path := filepath.Join(dir, fmt.Sprintf("securelink-%d.pprof", pid))
		if err := atomicfile.WriteFile(path, buf.Bytes(), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "securelink: cpu profile:", err)
		}
	}()
	return nil
}

package metrics

import (
	"context"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// FDUsage counts the process's open file descriptors and reads its soft
// RLIMIT_NOFILE (Go raises the soft limit to the hard one at start; under
// systemd that is the unit's LimitNOFILE).
func FDUsage() (open, limit int, err error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, err
	}
	open, err = OpenFDs(os.Getpid())
	if err != nil {
		return 0, 0, err
	}
	return open, int(min(rl.Cur, 1<<31-1)), nil
}

// OpenFDs counts the open file descriptors of process pid (/proc/PID/fd;
// for this process, not counting the one it reads the directory with).
func OpenFDs(pid int) (int, error) {
	d, err := os.Open("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return 0, err
	}
	defer d.Close()
	open := 0
	for {
		names, err := d.Readdirnames(4096)
		open += len(names)
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if pid == os.Getpid() {
		open-- // d itself
	}
	return open, nil
}

// FDWarnRatio is the share of the descriptor limit past which WatchFDs warns.
const FDWarnRatio = 0.8

// RegisterFDUsage exports securelink_<prefix>_fd_usage_ratio: open
// descriptors over the soft limit, the figure to alert on before accept(2)
// starts failing with EMFILE (process_open_fds and process_max_fds hold
// the two parts).
func (f *Front) RegisterFDUsage(prefix string) {
	f.GaugeFunc("securelink_"+prefix+"_fd_usage_ratio", "Open file descriptors over the soft RLIMIT_NOFILE; warned in the log past 0.8.", nil, func() float64 {
		open, limit, err := FDUsage()
		if err != nil || limit == 0 {
			return 0
		}
		return float64(open) / float64(limit)
	})
}

// WatchFDs checks the descriptor use every interval until ctx ends and logs
// a warning when it crosses FDWarnRatio of the limit (once per crossing,
// and an info line when it falls back under).
func WatchFDs(ctx context.Context, log zerolog.Logger, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	warned := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		open, limit, err := FDUsage()
		if err != nil || limit == 0 {
			continue
		}
		over := float64(open) >= FDWarnRatio*float64(limit)
		switch {
		case over && !warned:
			log.Warn().Int("open_fds", open).Int("fd_limit", limit).Str("event", "fds_low").
				Msg("open file descriptors past 80 % of the limit; new sockets will fail at the limit (raise LimitNOFILE or lower max_hosts)")
		case !over && warned:
			log.Info().Int("open_fds", open).Int("fd_limit", limit).Msg("open file descriptors back under 80 % of the limit")
		}
		warned = over
	}
}

// FDReserve is what a broker holds besides its sockets: listeners, the
// hosts, state and journal files, the metrics listener, log and runtime
// descriptors, with room for a reload.
const FDReserve = 1024

// BrokerFDsNeeded is the soft RLIMIT_NOFILE a broker needs to hold every
// socket its limits allow: one per host registration and one per client
// stream (max_streams_per_host for each of max_hosts), plus FDReserve. The
// start-up warning and doctor use this one figure, and the unit's
// LimitNOFILE covers it at the defaults.
func BrokerFDsNeeded(maxHosts, maxStreamsPerHost int) int {
	return maxHosts*(1+maxStreamsPerHost) + FDReserve
}

// Package sdnotify reports readiness, reloads and shutdown to systemd and
// feeds its watchdog, using go-systemd's implementation of the protocol.
//
// Outside systemd (no $NOTIFY_SOCKET) every call is a cheap no-op, so the
// daemon calls it unconditionally.
package sdnotify

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/rs/zerolog"
)

// Notifier sends state changes to the service manager.
type Notifier struct {
	log zerolog.Logger
}

// New returns a notifier; log receives send failures only.
func New(log zerolog.Logger) *Notifier { return &Notifier{log: log} }

func (n *Notifier) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warn().Err(err).Str("event", "sd_notify").Msg("could not notify the service manager")
	}
}

// Ready reports that the listeners are up.
func (n *Notifier) Ready() { n.send(daemon.SdNotifyReady) }

// Reloading reports that a SIGHUP reload started; Ready must follow.
func (n *Notifier) Reloading() { n.send(daemon.SdNotifyReloading) }

// Stopping reports that shutdown started.
func (n *Notifier) Stopping() { n.send(daemon.SdNotifyStopping) }

// Status sets the free-text line `systemctl status` shows. Newlines are
// flattened: the protocol is line-based.
func (n *Notifier) Status(format string, args ...any) {
	s := strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", " ")
	n.send("STATUS=" + s)
}

// Watchdog feeds the systemd watchdog at half its interval, but only while
// check succeeds: a daemon whose listener stopped answering must be
// restarted, not kept alive by a goroutine that still runs. It returns at
// once when no watchdog is configured, and when ctx ends.
func (n *Notifier) Watchdog(ctx context.Context, check func(context.Context) error) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil || interval <= 0 {
		return
	}
	tick := time.NewTicker(interval / 2)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, interval/4)
		err := check(cctx)
		cancel()
		if err == nil {
			n.send(daemon.SdNotifyWatchdog)
		} else {
			n.log.Error().Err(err).Str("event", "watchdog").Msg("self-check failed; not feeding the watchdog")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

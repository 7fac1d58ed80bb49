package acme

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	legolog "github.com/go-acme/lego/v5/log"
)

// zapCore writes certmagic's zap records into zerolog (certmagic logs only
// through zap; its default would print to stderr in its own format). Fields
// whose name suggests a secret are dropped. observe sees every record first,
// so the Manager can read the retry delay certmagic logs with "will retry".
type zapCore struct {
	log     zerolog.Logger
	fields  []zapcore.Field
	observe func(msg string, fields map[string]any)
}

func newZapLogger(log zerolog.Logger, observe func(string, map[string]any)) *zap.Logger {
	return zap.New(&zapCore{log: log.With().Str("component", "certmagic").Logger(), observe: observe})
}

func (c *zapCore) Enabled(l zapcore.Level) bool {
	return c.observe != nil || zerologLevel(l) >= c.log.GetLevel()
}

func (c *zapCore) With(fs []zapcore.Field) zapcore.Core {
	cp := *c
	cp.fields = append(append([]zapcore.Field(nil), c.fields...), fs...)
	return &cp
}

func (c *zapCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *zapCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fs {
		f.AddTo(enc)
	}
	for k := range enc.Fields {
		if secretField(k) {
			delete(enc.Fields, k)
		}
	}
	if c.observe != nil {
		c.observe(e.Message, enc.Fields)
	}
	lvl := zerologLevel(e.Level)
	if lvl < c.log.GetLevel() {
		return nil
	}
	ev := c.log.WithLevel(lvl)
	if e.LoggerName != "" {
		ev = ev.Str("logger", e.LoggerName)
	}
	ev.Fields(enc.Fields).Msg(e.Message)
	return nil
}

func (c *zapCore) Sync() error { return nil }

// secretField reports field names that may carry key material or
// credentials; certmagic logs none today, this keeps it so.
func secretField(k string) bool {
	k = strings.ToLower(k)
	for _, s := range []string{"key", "secret", "token", "password", "pem", "eab", "credential"} {
		if strings.Contains(k, s) && k != "issuer_key" {
			return true
		}
	}
	return false
}

func zerologLevel(l zapcore.Level) zerolog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return zerolog.DebugLevel
	case l == zapcore.InfoLevel:
		// certmagic's info lines (locks, each ACME step) are debug detail
		// for the daemon; the Manager logs its own events at info.
		return zerolog.DebugLevel
	case l == zapcore.WarnLevel:
		return zerolog.WarnLevel
	default:
		return zerolog.ErrorLevel
	}
}

// durationField reads a zap duration field from a map encoder (stored as
// time.Duration by zapcore.MapObjectEncoder).
func durationField(fields map[string]any, k string) (time.Duration, bool) {
	d, ok := fields[k].(time.Duration)
	return d, ok
}

// setLegoLogger sends lego's package-level slog logger (stdout by default)
// into zerolog at warn and above.
func setLegoLogger(log zerolog.Logger) {
	h := zerolog.NewSlogHandler(log.With().Str("component", "lego").Logger())
	legolog.SetDefault(slog.New(levelFilter{h, slog.LevelWarn}))
}

type levelFilter struct {
	slog.Handler
	min slog.Level
}

func (f levelFilter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= f.min && f.Handler.Enabled(ctx, l)
}

func (f levelFilter) WithAttrs(a []slog.Attr) slog.Handler {
	return levelFilter{f.Handler.WithAttrs(a), f.min}
}

func (f levelFilter) WithGroup(n string) slog.Handler {
	return levelFilter{f.Handler.WithGroup(n), f.min}
}

package pairing

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Bounds of the --ttl and --grants values.
const (
	// MaxDurationSeconds is ten years; longer "session lifetimes" are
	// typing mistakes, and 0 already means never.
	MaxDurationSeconds = 10 * 365 * 24 * 3600
	// MaxGrants bounds the channels of one --grants value.
	MaxGrants    = 32
	maxSpecBytes = 1024
)

var grantName = regexp.MustCompile(`^[a-z_]{1,32}$`)

var durationUnits = map[byte]int64{'s': 1, 'm': 60, 'h': 3600, 'd': 86400, 'w': 7 * 86400}

// ParseDuration reads a --ttl style duration into seconds: plain seconds
// ("3600"), "never" or "0" for no expiry, or one or more number+unit parts
// with units s, m, h, d and w ("30d", "12h", "1d12h", "90m", "45s").
func ParseDuration(s string) (int64, error) {
	if s == "" {
		return 0, errors.New("empty duration")
	}
	if len(s) > 64 {
		return 0, errors.New("duration is too long")
	}
	if s == "never" {
		return 0, nil
	}
	var total int64
	rest := s
	for rest != "" {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 || i > 10 {
			return 0, fmt.Errorf("duration %q: want seconds, \"never\", or a number with s, m, h, d or w (e.g. 30d, 12h)", s)
		}
		n, _ := strconv.ParseInt(rest[:i], 10, 64)
		mult := int64(1)
		if i < len(rest) {
			var ok bool
			if mult, ok = durationUnits[rest[i]]; !ok {
				return 0, fmt.Errorf("duration %q: unknown unit %q (use s, m, h, d or w)", s, rest[i])
			}
			i++
		} else if rest != s {
			return 0, fmt.Errorf("duration %q: the last number has no unit", s)
		}
		total += n * mult
		if total > MaxDurationSeconds {
			return 0, fmt.Errorf("duration %q is longer than ten years (use 0 or never for no expiry)", s)
		}
		rest = rest[i:]
	}
	return total, nil
}

// ParseGrants reads --grants "terminal=7d,bridge=1d" into per-channel
// lifetimes in seconds. Channel names are [a-z_]{1,32}, each at most once;
// the Relay applies its own list of channels.
func ParseGrants(s string) (map[string]int64, error) {
	if s == "" {
		return nil, errors.New("empty --grants (want CHANNEL=DURATION[,CHANNEL=DURATION...])")
	}
	if len(s) > maxSpecBytes {
		return nil, errors.New("--grants value is too long")
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxGrants {
		return nil, fmt.Errorf("--grants has more than %d channels", MaxGrants)
	}
	out := make(map[string]int64, len(parts))
	for _, p := range parts {
		name, dur, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("--grants entry %q: want CHANNEL=DURATION", p)
		}
		if !grantName.MatchString(name) {
			return nil, fmt.Errorf("--grants channel %q: want 1-32 characters a-z or _", name)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--grants names channel %q twice", name)
		}
		n, err := ParseDuration(dur)
		if err != nil {
			return nil, fmt.Errorf("--grants %s: %w", name, err)
		}
		out[name] = n
	}
	return out, nil
}

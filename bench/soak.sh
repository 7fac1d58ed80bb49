#!/usr/bin/env bash
# `make soak`: the built daemons under steady, mixed, bounded load on
# loopback for SOAK_MINUTES (default 10), failing on any client error or on
# resource growth after warm-up.
#
# Processes, started as an operator would (bench/reach.sh does the set-up):
#   - `loadgen upstream`: fake Relay (/ws: auth, then echo), API (/small)
#     and SSE (/sse) on one loopback port;
#   - `securelink broker serve` with a self-signed certificate;
#   - `securelink serve` with a `reach:` block (front + connector in one
#     process) and `metrics.listen`;
#   - `loadgen soak`: 100 /relay/ws connections exchanging echoes, /api GETs
#     over HTTP/2, one SSE stream, 16 Reach streams (4 route credentials x 4)
#     — every client verifies the front's pin — while it samples RSS, open
#     descriptors and goroutines of both daemons from their /metrics.
#
# Verdict (printed under the table): for each daemon and series, the median
# of the last quarter of the samples must not exceed the median of the first
# quarter (the warm-up; every client is connected before the first sample)
# by more than pct percent + slack: RSS 25% + 16 MiB, descriptors 10% + 16,
# goroutines 10% + 32. Any client error fails the run too.
#
#   SOAK_MINUTES=10     soak length (1 is a smoke run; decimals allowed)
#   SOAK_INTERVAL=5s    sampling interval
#   SOAK_WS=100 SOAK_REACH=16 SOAK_API=4   client counts
#
# The table goes to stdout and bench/results/soak-latest.txt; daemon logs of
# the last run to bench/results/logs/.
set -euo pipefail
export LC_ALL=C

cd "$(dirname "$0")/.."
ROOT=$PWD
GO=${GO:-go}
FRONT_BIN=${BIN:-bin/securelink}
RESULTS=$ROOT/bench/results
MINUTES=${SOAK_MINUTES:-10}
INTERVAL=${SOAK_INTERVAL:-5s}
QUICK=0 PPROF=0

log() { printf '[soak] %s\n' "$*" >&2; }
die() {
	printf '[soak] error: %s\n' "$*" >&2
	exit 1
}

[[ $MINUTES =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v m="$MINUTES" 'BEGIN{exit !(m > 0 && m <= 1440)}' ||
	die "SOAK_MINUTES must be a number of minutes, 0 < m <= 1440"
SECS=$(awk -v m="$MINUTES" 'BEGIN{printf "%d", m * 60}')
for t in jq openssl taskset; do
	command -v $t >/dev/null || die "$t is needed (apt-get install jq openssl util-linux)"
done
[[ -x $FRONT_BIN ]] || die "$FRONT_BIN missing: run make build"

# The soak measures growth, not CPU: every process may use every core.
NCPU=$(nproc)
SERVER_CPU=0-$((NCPU - 1)) LOAD_CPU=$SERVER_CPU
load() { "$@"; }
fail() { die "$*"; }
# 100 WebSockets are 200 descriptors in the front, plus the Reach streams.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
WORK=$(mktemp -d /tmp/securelink-soak.XXXXXX)
BG_PIDS=()
declare -A PID PIN
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_pids "${BG_PIDS[@]}"
	mkdir -p "$RESULTS/logs"
	cp -f "$WORK"/*.log "$RESULTS/logs/" 2>/dev/null || true
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$RESULTS"
log "building bench/loadgen"
CGO_ENABLED=0 $GO build -trimpath -o "$WORK/loadgen" ./bench/loadgen
LG=$WORK/loadgen
read -r UP_PORT BROKER_PORT RFRONT_PORT FRONT_METRICS BROKER_METRICS < <("$LG" freeports -n 5)

log "starting the fake upstream on 127.0.0.1:$UP_PORT"
"$LG" upstream -listen "127.0.0.1:$UP_PORT" >"$WORK/upstream.log" 2>&1 &
UP_PID=$!
BG_PIDS+=($UP_PID)
"$LG" waitport -addr "127.0.0.1:$UP_PORT" -timeout 20s

REACH_IDLE_HOSTS=0
REACH_BROKER_YAML="metrics: {listen: \"127.0.0.1:$BROKER_METRICS\"}"
REACH_FRONT_YAML="metrics: {listen: \"127.0.0.1:$FRONT_METRICS\"}"
# shellcheck source=bench/reach.sh
source "$ROOT/bench/reach.sh"
reach_start_broker
reach_start_front # also trades one bootstrap for $REACH_DIR/route.json
CREDS=$REACH_DIR/route.json
for i in 2 3 4; do # a route credential carries 4 streams at a time; one per device
	out=$("$LG" reach-route -admin "$REACH_DIR/state/admin.sock" -addr "$RFRONT" -pin "${PIN[rfront]}" \
		-ca-file "$REACH_DIR/broker.crt" -device "soak-$i" -out "$REACH_DIR/route$i.json") || die "could not obtain route credential $i"
	log "reach: $out"
	CREDS+=,$REACH_DIR/route$i.json
done

log "soaking for $MINUTES min (front pid ${PID[rfront]}, broker pid ${PID[broker]})"
rc=0
{
	echo "securelink soak — $(date -u +%Y-%m-%dT%H:%M:%SZ), SOAK_MINUTES=$MINUTES, $($GO version | awk '{print $3}'), $NCPU cores"
	echo "binary: securelink $(git describe --always --dirty 2>/dev/null || echo unknown) ($FRONT_BIN)"
	"$LG" soak -addr "$RFRONT" -pin "${PIN[rfront]}" -metrics "127.0.0.1:$FRONT_METRICS" \
		-broker-metrics "127.0.0.1:$BROKER_METRICS" -reach "$CREDS" -ca-file "$REACH_DIR/broker.crt" \
		-duration "${SECS}s" -interval "$INTERVAL" -ws "${SOAK_WS:-100}" -api "${SOAK_API:-4}" \
		-reach-streams "${SOAK_REACH:-16}" 2>&1
} | tee "$RESULTS/soak-latest.txt" || rc=$?
grep -q '^soak: ok$' "$RESULTS/soak-latest.txt" || rc=1
kill -0 "${PID[rfront]}" 2>/dev/null || {
	log "the front exited during the soak"
	rc=1
}
kill -0 "${PID[broker]}" 2>/dev/null || {
	log "the broker exited during the soak"
	rc=1
}
log "table written to bench/results/soak-latest.txt"
exit "$rc"

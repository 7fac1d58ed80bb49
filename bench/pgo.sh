#!/usr/bin/env bash
# `make pgo`: writes cmd/securelink/default.pgo, the CPU profile `go build`
# uses for profile-guided optimization (-pgo=auto, the default; see
# docs/decisions.md). Loopback only, about 3 minutes.
#
# The profile comes from a build with -tags pgoprofile (cmd/securelink/
# pgoprofile.go; the shipped binary has no profiler) and -pgo=off (the new
# profile does not depend on the old one). Every `securelink serve` and
# `securelink broker serve` started here profiles itself from start-up and
# writes its profile on SIGUSR1; the loads are the bench's, in its layout
# (bench/reach.sh and bench/scale.sh start the processes):
#   - the front with Reach (front + connector, one process): small GET,
#     /relay/health, 8 MiB download, /relay/ws 1 KiB echo (32 conns),
#     TLS handshakes, all direct; then Reach download, upload and 64 B echo
#     through the broker (inner TLS), and the raw 1 MiB-message stream;
#   - the broker of those Reach figures;
#   - a second broker under registration and match churn (loadgen
#     reach-scale at small stream tables).
# The three profiles are merged (`go tool pprof -proto`), so each path
# weighs what it cost in CPU.
#
#   PGO_DUR=N   seconds per load (default 8)
#   PGO_OUT=F   where to write the profile (default cmd/securelink/default.pgo)
set -euo pipefail
export LC_ALL=C

cd "$(dirname "$0")/.."
ROOT=$PWD
GO=${GO:-go}
DUR=${PGO_DUR:-8}
OUT=${PGO_OUT:-$ROOT/cmd/securelink/default.pgo}
[[ $DUR =~ ^[1-9][0-9]?$ ]] || {
	echo "PGO_DUR must be 1..99" >&2
	exit 2
}
# What bench/reach.sh and bench/scale.sh read.
WARM=1 QUICK=0 SETTLE=1s PPROF=0
REACH_IDLE_HOSTS=0

log() { printf '[pgo] %s\n' "$*" >&2; }
die() {
	printf '[pgo] error: %s\n' "$*" >&2
	exit 1
}
FAILED=0
fail() {
	log "$*"
	FAILED=1
}
kv() { tr ' ' '\n' <<<"$2" | awk -F= -v k="$1" '$1 == k {print $2; exit}'; }

for t in wrk jq openssl taskset; do
	command -v "$t" >/dev/null || die "$t not found (make bench installs wrk, jq, openssl and util-linux)"
done
if (($(nproc) >= 2)); then
	SERVER_CPU=0 LOAD_CPU=1
else
	SERVER_CPU=0 LOAD_CPU=0
fi
load() { taskset -c "$LOAD_CPU" "$@"; }
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
WORK=$(mktemp -d /tmp/securelink-pgo.XXXXXX)
RESULTS=$WORK # reach.sh names its logs under $RESULTS/logs in messages
BG_PIDS=()
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_pids "${BG_PIDS[@]}"
	if ((rc)); then
		tail -n 5 "$WORK"/*.log 2>/dev/null >&2 || true
	fi
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "building bench/loadgen and securelink -tags pgoprofile -pgo=off"
CGO_ENABLED=0 $GO build -trimpath -o "$WORK/loadgen" ./bench/loadgen
CGO_ENABLED=0 $GO build -trimpath -tags pgoprofile -pgo=off -o "$WORK/securelink" ./cmd/securelink
LG=$WORK/loadgen FRONT_BIN=$WORK/securelink
PROF=$WORK/profiles
mkdir -m 700 "$PROF"
export SECURELINK_CPUPROFILE_DIR=$PROF

read -r UP_PORT BROKER_PORT RFRONT_PORT SCALE_PORT SMETRICS_PORT < <("$LG" freeports -n 5)
# taskset itself, not load(): a backgrounded function is a subshell, and
# stopping its pid would leave the upstream running.
taskset -c "$LOAD_CPU" "$LG" upstream -listen "127.0.0.1:$UP_PORT" >"$WORK/upstream.log" 2>&1 &
UP_PID=$!
BG_PIDS+=($UP_PID)
"$LG" waitport -addr "127.0.0.1:$UP_PORT" -timeout 20s

declare -A PID PIN R
# shellcheck source=bench/reach.sh
source "$ROOT/bench/reach.sh"
# shellcheck source=bench/scale.sh
source "$ROOT/bench/scale.sh"
reach_start_broker
reach_start_front
F="127.0.0.1:$RFRONT_PORT"

# wrk_load PATH CONNS: DUR s of wrk; fails on errors or non-2xx answers.
wrk_load() {
	local out
	log "front: wrk -c$2 $1 (${DUR}s)"
	out=$(load wrk -t1 -c"$2" -d"${DUR}s" --timeout 10s "https://$F$1")
	if grep -q 'Non-2xx\|Socket errors' <<<"$out"; then fail "wrk $1: $(grep 'Non-2xx\|Socket errors' <<<"$out")"; fi
	true
}
wrk_load /api/small 32
wrk_load /relay/health 32
wrk_load /api/big 1
log "front: /relay/ws 1 KiB echo, 32 conns (${DUR}s)"
load "$LG" echo -url "wss://$F/relay/ws" -pin "${PIN[rfront]}" -conns 32 -size 1024 \
	-duration "${DUR}s" -warmup 0s -pids "${PID[rfront]}" >/dev/null || fail "echo failed"
log "front: TLS handshakes (${DUR}s)"
load "$LG" handshakes -addr "$F" -pin "${PIN[rfront]}" -conns 16 \
	-duration "${DUR}s" -warmup 0s -pids "${PID[rfront]}" >/dev/null || fail "handshakes failed"
reach_xfer download broker
reach_xfer upload broker
reach_echo broker
reach_bulk download
reach_bulk upload
reach_bulk echo

# Registrations and matches: a broker of its own (bench/scale.sh), small
# tables, churn DUR s per level.
SCALE_HOSTS=64
scale_start_broker
log "scale: registration and match churn at 256 and 512 streams"
load "$LG" reach-scale -broker-url "$SCALE_URL" -ca-file "$SCALE_DIR/broker.crt" \
	-hosts "$SCALE_DIR/hosts.jsonl" -pids "${PID[scale_broker]}" -metrics "127.0.0.1:$SMETRICS_PORT" \
	-idle-hosts "$SCALE_HOSTS" -levels 256,512 -streams-per-host "$SCALE_PER_HOST" \
	-reg-hosts "$SCALE_REG_HOSTS" -match-hosts "$SCALE_MATCH_HOSTS" -workers "$SCALE_WORKERS" -parallel "$SCALE_PARALLEL" \
	-duration "${DUR}s" -warmup "${WARM}s" -settle 1s -baseline 1s >"$WORK/scale.out" 2>>"$WORK/scale-loadgen.log" ||
	fail "reach-scale failed: $(tail -n 3 "$WORK/scale-loadgen.log")"
((FAILED == 0)) || die "a load failed: no profile written"

# Every profiled process writes securelink-PID.pprof on SIGUSR1.
files=()
for k in rfront broker scale_broker; do
	p=${PID[$k]}
	kill -USR1 "$p"
	f=$PROF/securelink-$p.pprof
	for i in $(seq 1 100); do
		[[ -s $f ]] && break
		sleep 0.1
	done
	[[ -s $f ]] || die "$k (pid $p) wrote no profile"
	files+=("$f")
done
$GO tool pprof -proto "${files[@]}" >"$WORK/merged.pgo" 2>"$WORK/pprof.log" || die "go tool pprof: $(cat "$WORK/pprof.log")"
[[ -s $WORK/merged.pgo ]] || die "the merged profile is empty"
cp "$WORK/merged.pgo" "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
log "wrote $OUT ($(wc -c <"$OUT") bytes from ${#files[@]} processes)"
log "every go build of cmd/securelink now uses it: keep it only if it measures better (docs/decisions.md)"
$GO tool pprof -top -nodecount=15 "$OUT" 2>/dev/null | sed -n '1,22p' >&2 || true

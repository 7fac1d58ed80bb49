# shellcheck shell=bash
# The broker-at-scale figures of `make bench` (issue 15), sourced by
# bench/run.sh after reach.sh (broker_cert, broker_serve, reach_verdict);
# alone: BENCH_ONLY=scale bench/run.sh.
#
# One broker (`securelink broker serve`, core $SERVER_CPU, GOMAXPROCS 1) of
# its own; `loadgen reach-scale` on the load core holds the other end of
# every socket: real connectors (the package `securelink serve` runs) for
# the hosts and real clients (broker/client) for the streams.
#
#   1. idle hosts register (CPU per registration at table 0..N);
#   2. per stream-table level (default 5,000 and ~20,000): fill the table
#      with idle streams, each a bootstrap the host publishes and a client
#      match on it; then a registration churn (a fresh connector registers
#      and leaves) and a match churn (a client opens a stream with a route
#      credential and closes it), each ${DUR} s after ${WARM} s warm-up;
#   3. at the largest level: RSS and goroutines per idle socket, and the
#      broker's CPU over an idle minute (keepalive);
#   4. calibration: a bare TLS server holding as many idle sockets with the
#      same pings and pongs (loadgen keepalive-server / keepalive-floor).
#
#   BENCH_SCALE_FULL=1  the issue's size: 10,000 hosts and 50,000 streams
#                       (needs RLIMIT_NOFILE >= ~61,000 per process)
#   BENCH_SCALE_LEVELS=A,B BENCH_SCALE_HOSTS=N BENCH_SCALE_KEEPALIVE=D
#                       other stream-table sizes, idle hosts, keepalive window
#
# The broker closes a stream idle for 5 min (wire.IdleTimeout, not
# configurable), so the fill of the largest level and its figures must end
# within 5 min of the first stream: a loaded machine that fills at a few
# dozen streams per second needs smaller levels.
#
# Descriptors: the broker and loadgen each hold one per socket, so the
# largest level is bounded by the hard RLIMIT_NOFILE (run.sh raises the soft
# one to it); the table says when a size did not fit. The broker's config
# raises attempts_per_minute (every connection comes from 127.0.0.1) and
# max_hosts (the churn hosts come on top of the idle ones); nothing else.

SCALE_DIR=$WORK/scale
SCALE_FULL=${BENCH_SCALE_FULL:-0}
SCALE_PER_HOST=16 # the broker's default max_streams_per_host
SCALE_REG_HOSTS=16 SCALE_MATCH_HOSTS=64 SCALE_WORKERS=16
SCALE_PARALLEL=8 # stream opens in flight while filling
SCALE_URL="wss://127.0.0.1:$SCALE_PORT/v1/connect"
SCALE_NOTE="" SCALE_HS=""
declare -A S

scale_plan() {
	local want_hosts want_top limit fit
	if [[ $SCALE_FULL == 1 ]]; then
		want_hosts=10000 want_top=50000 SCALE_LEVELS_BASE="5000,20000"
	else
		want_hosts=1250 want_top=20000 SCALE_LEVELS_BASE="5000"
	fi
	[[ $QUICK == 1 ]] && want_hosts=200 want_top=2000 SCALE_LEVELS_BASE="500"
	SCALE_KEEPALIVE=60s
	[[ $QUICK == 1 ]] && SCALE_KEEPALIVE=16s
	limit=$(ulimit -n)
	# Each side holds hosts + streams + churn sockets, plus ~300 of its own.
	fit=$(((limit - want_hosts - SCALE_REG_HOSTS - SCALE_MATCH_HOSTS - 300) / SCALE_PER_HOST * SCALE_PER_HOST))
	SCALE_HOSTS=$want_hosts SCALE_TOP=$want_top
	if ((fit < want_top)); then
		SCALE_TOP=$fit
		SCALE_NOTE="RLIMIT_NOFILE is $limit here (hard limit $(ulimit -Hn)): the largest level is $SCALE_TOP streams, not $want_top"
	fi
	((SCALE_TOP > ${SCALE_LEVELS_BASE##*,})) || die "RLIMIT_NOFILE $limit leaves no room for a second level"
	SCALE_LEVELS="$SCALE_LEVELS_BASE,$SCALE_TOP"
	if [[ -n ${BENCH_SCALE_LEVELS:-} ]]; then
		[[ $BENCH_SCALE_LEVELS =~ ^[0-9]+(,[0-9]+)+$ ]] || die "BENCH_SCALE_LEVELS must be sizes like 2000,6000"
		SCALE_LEVELS=$BENCH_SCALE_LEVELS SCALE_TOP=${BENCH_SCALE_LEVELS##*,} SCALE_NOTE=""
		SCALE_HOSTS=${BENCH_SCALE_HOSTS:-$(((SCALE_TOP + SCALE_PER_HOST - 1) / SCALE_PER_HOST))}
	fi
	SCALE_KEEPALIVE=${BENCH_SCALE_KEEPALIVE:-$SCALE_KEEPALIVE}
}

scale_start_broker() {
	local d=$SCALE_DIR
	broker_cert "$d"
	cat >"$d/broker.yaml" <<EOF
listen: "127.0.0.1:$SCALE_PORT"
tls: {cert_file: "$d/broker.crt", key_file: "$d/broker.key"}
hosts_file: "$d/hosts.json"
state_file: "$d/state.json"
attempts_per_minute: 1048576
max_hosts: 16384
metrics: {listen: "127.0.0.1:$SMETRICS_PORT"}
log: {level: warn, format: json}
EOF
	local n=$((SCALE_HOSTS + SCALE_REG_HOSTS + SCALE_MATCH_HOSTS))
	log "scale: $n hosts in the broker's hosts file (loadgen reach-hosts: one write, not $n add-host runs)"
	load "$LG" reach-hosts -n "$n" -hosts-file "$d/hosts.json" -out "$d/hosts.jsonl" >/dev/null 2>>"$WORK/scale-loadgen.log" ||
		die "loadgen reach-hosts failed (see $RESULTS/logs/scale-loadgen.log)"
	log "scale: starting the broker on 127.0.0.1:$SCALE_PORT (core $SERVER_CPU)"
	broker_serve scale_broker "$d/broker.yaml"
}

# scale_get PHASE LEVEL KEY: one value of reach-scale's output.
scale_get() {
	local line
	line=$(awk -v p="phase=$1" -v l="level=$2" '$1 == p && $2 == l' <<<"$SCALE_OUT" | head -n1)
	if [[ -n $line ]]; then kv "$3" "$line"; fi
}

scale_run() {
	[[ -x $FRONT_BIN ]] || die "$FRONT_BIN missing: run make build"
	scale_plan
	scale_start_broker
	log "scale: $SCALE_HOSTS idle hosts, stream levels $SCALE_LEVELS, keepalive window $SCALE_KEEPALIVE"
	if SCALE_OUT=$(load "$LG" reach-scale -broker-url "$SCALE_URL" -ca-file "$SCALE_DIR/broker.crt" \
		-hosts "$SCALE_DIR/hosts.jsonl" -pids "${PID[scale_broker]}" -metrics "127.0.0.1:$SMETRICS_PORT" \
		-idle-hosts "$SCALE_HOSTS" -levels "$SCALE_LEVELS" -streams-per-host "$SCALE_PER_HOST" \
		-reg-hosts "$SCALE_REG_HOSTS" -match-hosts "$SCALE_MATCH_HOSTS" -workers "$SCALE_WORKERS" -parallel "$SCALE_PARALLEL" \
		-duration "${DUR}s" -warmup "${WARM}s" -settle "$SETTLE" -keepalive "$SCALE_KEEPALIVE" 2>>"$WORK/scale-loadgen.log"); then
		:
	else
		tail -n 3 "$WORK/scale-loadgen.log" >&2 || true
		fail "scale figures failed (see $RESULTS/logs/scale-loadgen.log)"
	fi
	log "scale: $(tr '\n' ';' <<<"$SCALE_OUT")"
	printf '%s\n' "$SCALE_OUT" >"$RESULTS/scale-raw.txt"
	# Calibration on the same broker, still holding every socket: a bare TLS
	# handshake (the floor under a registration and a match) on this
	# machine and in this minute.
	local pin hs
	pin="sha256/$(openssl x509 -in "$SCALE_DIR/broker.crt" -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64)"
	if hs=$(load "$LG" handshakes -addr "127.0.0.1:$SCALE_PORT" -pin "$pin" -conns "$SCALE_WORKERS" \
		-duration "${DUR}s" -warmup "${WARM}s" -pids "${PID[scale_broker]}" 2>>"$WORK/scale-loadgen.log"); then
		log "scale: handshakes $hs"
		SCALE_HS=$(scale_fmt "$(kv cpu_per_op_us "$hs")")
	else
		fail "scale: the calibration handshakes failed"
	fi
	# The same with the key exchange the connectors and clients really
	# negotiate (Go's default first choice, hybrid post-quantum).
	if hs=$(load "$LG" handshakes -addr "127.0.0.1:$SCALE_PORT" -pin "$pin" -conns "$SCALE_WORKERS" -curve x25519mlkem768 \
		-duration "${DUR}s" -warmup "${WARM}s" -pids "${PID[scale_broker]}" 2>>"$WORK/scale-loadgen.log"); then
		log "scale: hybrid handshakes $hs"
		SCALE_HS_PQ=$(scale_fmt "$(kv cpu_per_op_us "$hs")")
	else
		fail "scale: the hybrid calibration handshakes failed"
	fi
	stop_pids "${PID[scale_broker]}"
	scale_floor
}

# scale_floor: the keepalive's calibration, after the broker stopped: a
# bare Go TLS server (loadgen keepalive-server, on the broker's core)
# holding as many idle sockets as the keepalive figure, each doing per ping
# interval what the spec asks of the broker (its peer's ping read and
# answered, its own ping written and the answer read) and nothing else.
scale_floor() {
	local n out
	n=$(kv sockets "$(awk '$1 == "phase=keepalive"' <<<"$SCALE_OUT" | head -n1)")
	[[ $n =~ ^[0-9]+$ ]] || return 0
	taskset -c "$SERVER_CPU" "$LG" keepalive-server -listen "127.0.0.1:$SCALE_PORT" \
		-cert "$SCALE_DIR/broker.crt" -key "$SCALE_DIR/broker.key" >"$WORK/scale_floor.out" 2>>"$WORK/scale-loadgen.log" &
	PID[scale_floor]=$!
	BG_PIDS+=(${PID[scale_floor]})
	"$LG" waitport -addr "127.0.0.1:$SCALE_PORT" -timeout 10s >/dev/null || die "loadgen keepalive-server did not start"
	if out=$(load "$LG" keepalive-floor -addr "127.0.0.1:$SCALE_PORT" -ca-file "$SCALE_DIR/broker.crt" -n "$n" \
		-pids "${PID[scale_floor]}" -window "$SCALE_KEEPALIVE" 2>>"$WORK/scale-loadgen.log"); then
		log "scale: keepalive floor $out"
		SCALE_OUT+=$'\n'"$out"
	else
		fail "scale: the keepalive calibration failed (see $RESULTS/logs/scale-loadgen.log)"
	fi
	stop_pids "${PID[scale_floor]}"
}

# ------------------------------------------------------------------ table

# scale_flat LOW HIGH: CPU per operation at the largest level over the
# smallest; "flat" within 1.5x.
scale_flat() {
	awk -v a="$1" -v b="$2" 'BEGIN{ if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || a+0 == 0) print "not measured";
		else { r = b/a; printf "%.2fx: %s", r, (r <= 1.5 ? "flat" : "GROWS with the table") } }'
}
scale_row() { # LABEL LOW HIGH TARGET
	printf "%-$(reach_pad "$1")s %10s %10s   %s\n" "$1" "${2:--}" "${3:--}" "$4"
}
# scale_hs US: US divided by this run's calibration handshake (SCALE_HS).
# scale_hs_pq US: the same per hybrid handshake (SCALE_HS_PQ).
scale_hs_pq() { SCALE_HS=${SCALE_HS_PQ:-} scale_hs "$1"; }
scale_hs() { awk -v v="$1" -v h="${SCALE_HS:-}" 'BEGIN{ if (v ~ /^[0-9.]+$/ && h ~ /^[0-9.]+$/ && h+0 > 0) printf "%.2f", v/h; else print "" }'; }
scale_fmt() { awk -v v="$1" -v f="${2:-%.0f}" 'BEGIN{ if (v ~ /^-?[0-9.]+$/) printf f, v; else print "" }'; }

scale_table() {
	local lo hi p
	# The levels reached (a fill that fails on a loaded machine stops at the
	# size it got to, and the figures are taken there).
	lo=$(awk '$1 == "phase=match" {sub("level=", "", $2); print $2; exit}' <<<"$SCALE_OUT")
	hi=$(awk '$1 == "phase=match" {sub("level=", "", $2); v = $2} END {print v}' <<<"$SCALE_OUT")
	lo=${lo:-${SCALE_LEVELS%%,*}} hi=${hi:-$SCALE_TOP}
	[[ $hi == "$SCALE_TOP" ]] || SCALE_NOTE+="${SCALE_NOTE:+; }the fill to $SCALE_TOP streams stopped at $hi (see bench/results/logs/scale-loadgen.log): the largest level is $hi"
	echo "Reach broker at scale: securelink broker serve (core $SERVER_CPU, GOMAXPROCS 1), loadgen reach-scale on core $LOAD_CPU"
	echo "          (real connectors for the hosts, real broker/client streams; broker CPU from /proc)"
	echo
	printf "%-46s %10s %10s   %s\n" "figure" "@$lo" "@$hi" "target (at the largest level)"
	for p in register match fill; do
		S[us.$p.lo]=$(scale_fmt "$(scale_get "$p" "$lo" net_us_per_op)")
		S[us.$p.hi]=$(scale_fmt "$(scale_get "$p" "$hi" net_us_per_op)")
		S[raw.$p]="$(scale_fmt "$(scale_get "$p" "$lo" us_per_op)")/$(scale_fmt "$(scale_get "$p" "$hi" us_per_op)")"
		S[core.$p.lo]=$(scale_fmt "$(scale_get "$p" "$lo" per_core_s)")
		S[core.$p.hi]=$(scale_fmt "$(scale_get "$p" "$hi" per_core_s)")
		S[rate.$p.lo]=$(scale_fmt "$(scale_get "$p" "$lo" per_s)")
		S[rate.$p.hi]=$(scale_fmt "$(scale_get "$p" "$hi" per_s)")
		S[busy.$p.lo]=$(scale_get "$p" "$lo" busy_pct)
		S[busy.$p.hi]=$(scale_get "$p" "$hi" busy_pct)
		S[err.$p]="$(scale_get "$p" "$lo" errors)/$(scale_get "$p" "$hi" errors) failed, $(scale_get "$p" "$lo" retries)/$(scale_get "$p" "$hi" retries) retried"
	done
	S[base]="$(scale_get baseline "$lo" core_pct)/$(scale_get baseline "$hi" core_pct)"
	S[base_after]="$(scale_get baseline_after "$lo" core_pct)/$(scale_get baseline_after "$hi" core_pct)"
	S[err.fill]="$(scale_get fill "$lo" retries)/$(scale_get fill "$hi" retries)"
	scale_row "TLS handshake alone: broker CPU µs" "" "${SCALE_HS:-}" "calibration, X25519 (issue 15: ~145 on a quiet core)"
	scale_row "TLS handshake, X25519MLKEM768: broker CPU µs" "" "${SCALE_HS_PQ:-}" "calibration, the key exchange connectors and clients negotiate (Go's default)"
	scale_row "registration: broker CPU µs each" "${S[us.register.lo]}" "${S[us.register.hi]}" "flat: $(scale_flat "${S[us.register.lo]}" "${S[us.register.hi]}")"
	scale_row "registrations/s per broker core (1e6/µs)" "${S[core.register.lo]}" "${S[core.register.hi]}" "≥ 3,000: $(reach_verdict "${S[core.register.hi]}" ">=" 3000)"
	scale_row "registrations/s measured (broker core busy)" "${S[rate.register.lo]}" "${S[rate.register.hi]}" "busy ${S[busy.register.lo]:--}% / ${S[busy.register.hi]:--}%"
	scale_row "match (route credential): broker CPU µs each" "${S[us.match.lo]}" "${S[us.match.hi]}" "flat: $(scale_flat "${S[us.match.lo]}" "${S[us.match.hi]}")"
	scale_row "matches/s per broker core (1e6/µs)" "${S[core.match.lo]}" "${S[core.match.hi]}" "≥ 2,000: $(reach_verdict "${S[core.match.hi]}" ">=" 2000)"
	scale_row "matches/s measured (broker core busy)" "${S[rate.match.lo]}" "${S[rate.match.hi]}" "busy ${S[busy.match.lo]:--}% / ${S[busy.match.hi]:--}%"
	# The issue's rates assume a ~145 µs handshake; this machine's differs,
	# so the same targets are also given in handshakes: 1e6/3000 = 333 µs =
	# 2.30 handshakes per registration, 1e6/2000 = 500 µs = 3.45 per match.
	scale_row "registration: in X25519 handshakes" "$(scale_hs "${S[us.register.lo]}")" "$(scale_hs "${S[us.register.hi]}")" "issue's target in these units ≤ 2.30: $(reach_verdict "$(scale_hs "${S[us.register.hi]}")" "<=" 2.30)"
	scale_row "match: in X25519 handshakes" "$(scale_hs "${S[us.match.lo]}")" "$(scale_hs "${S[us.match.hi]}")" "issue's target in these units ≤ 3.45: $(reach_verdict "$(scale_hs "${S[us.match.hi]}")" "<=" 3.45)"
	# Like for like: a registration's own handshake is the hybrid one.
	scale_row "registration: in hybrid handshakes" "$(scale_hs_pq "${S[us.register.lo]}")" "$(scale_hs_pq "${S[us.register.hi]}")" "≤ 2.30: $(reach_verdict "$(scale_hs_pq "${S[us.register.hi]}")" "<=" 2.30)"
	scale_row "match: in hybrid handshakes" "$(scale_hs_pq "${S[us.match.lo]}")" "$(scale_hs_pq "${S[us.match.hi]}")" "≤ 3.45: $(reach_verdict "$(scale_hs_pq "${S[us.match.hi]}")" "<=" 3.45)"
	scale_row "stream open, bootstrap publish + match: µs" "${S[us.fill.lo]}" "${S[us.fill.hi]}" "flat: $(scale_flat "${S[us.fill.lo]}" "${S[us.fill.hi]}") (while the table fills)"
	local il ka
	il=$(awk '$1 == "phase=idle"' <<<"$SCALE_OUT" | head -n1)
	ka=$(awk '$1 == "phase=keepalive"' <<<"$SCALE_OUT" | head -n1)
	local kib gor sockets pct rss_mib est
	kib=$(scale_fmt "$(kv kib_per_socket "$il")" "%.1f")
	gor=$(scale_fmt "$(kv goroutines_per_socket "$il")" "%.2f")
	sockets=$(kv sockets "$il")
	pct=$(scale_fmt "$(kv core_pct "$ka")" "%.2f")
	rss_mib=$(scale_fmt "$(awk -v r="$(kv rss_kib "$il")" 'BEGIN{if (r != "") print r/1024}')")
	# The same after the keepalive window: the pings' garbage has had a
	# minute to grow the heap to its GC target (the steady state).
	local kib_late
	kib_late=$(awk -v r="$(kv rss_kib "$ka")" -v b="$(kv rss_base_kib "$il")" -v n="$(kv sockets "$il")" \
		'BEGIN{ if (r ~ /^[0-9]+$/ && b ~ /^[0-9]+$/ && n+0 > 0) printf "%.1f", (r-b)/n }')
	# The estimate takes the larger of the two.
	est=$(awk -v k="$kib" -v l="$kib_late" 'BEGIN{ if (l ~ /^[0-9.]+$/ && l+0 > k+0) k = l; if (k ~ /^[0-9.]+$/) printf "%.2f", k*60000/1048576 }')
	local held="" ok_held="not measured"
	if [[ -n $(kv broker_streams "$il") ]]; then
		held="$(kv broker_streams "$il")/$(kv broker_hosts "$il")"
		ok_held=$([[ $(kv broker_streams "$il") == "$(kv streams "$il")" && $(kv broker_hosts "$il") == "$(kv hosts "$il")" ]] && echo "all held" || echo "LOST some (idle timeout or missed pongs): per-socket figures are off")
	fi
	scale_row "streams/hosts the broker holds at the sample" "" "$held" "of $(kv streams "$il")/$(kv hosts "$il") opened: $ok_held"
	scale_row "RSS KiB per idle socket (hosts + streams)" "" "$kib" "≤ 32: $(reach_verdict "$kib" "<=" 32)"
	scale_row "RSS KiB per idle socket, after keepalive" "" "${kib_late:-}" "≤ 32: $(reach_verdict "${kib_late:-}" "<=" 32) (steady state: ${SCALE_KEEPALIVE} of pings later)"
	scale_row "goroutines per idle socket" "" "$gor" "≤ 1: $(reach_verdict "$gor" "<=" 1)"
	scale_row "keepalive: % of a core over ${SCALE_KEEPALIVE} idle" "" "$pct" "≤ 5: $(reach_verdict "$pct" "<=" 5) (at ${sockets:--} sockets)"
	# Per socket and ping interval, and in units of the bare TLS floor.
	local fl ka_us floor_us
	fl=$(awk '$1 == "phase=keepalive_floor"' <<<"$SCALE_OUT" | head -n1)
	ka_us=$(awk -v c="$(kv cpu_us "$ka")" -v s="$(kv secs "$ka")" -v n="$(kv sockets "$ka")" \
		'BEGIN{ if (c ~ /^[0-9.]+$/ && s+0 > 0 && n+0 > 0) printf "%.1f", c/n/(s/15) }')
	floor_us=$(scale_fmt "$(kv us_per_socket_interval "$fl")" "%.1f")
	scale_row "keepalive: broker CPU µs per socket per 15 s" "" "${ka_us:-}" "≤ 5 % at 60,000 sockets is ≤ 12.5"
	scale_row "keepalive floor: bare TLS server, µs per socket" "" "${floor_us:-}" "calibration: the same pings and pongs, nothing else ($(kv sockets "$fl") sockets)"
	scale_row "keepalive: in bare-TLS floors" "" "$(SCALE_HS=$floor_us scale_hs "$ka_us")" "1.00 = only TLS records and the runtime"
	scale_row "broker RSS MiB at the largest level" "" "$rss_mib" "${sockets:--} sockets"
	if [[ $(kv hosts "$il") -ge 10000 && $(kv streams "$il") -ge 50000 ]] 2>/dev/null; then
		scale_row "10k hosts + 50k streams: RSS GiB" "" "$(awk -v r="$(kv rss_kib "$il")" 'BEGIN{printf "%.2f", r/1048576}')" "≤ 2: $(reach_verdict "$(awk -v r="$(kv rss_kib "$il")" 'BEGIN{printf "%.2f", r/1048576}')" "<=" 2)"
	else
		scale_row "10k hosts + 50k streams: RSS GiB (est.)" "" "${est:--}" "≤ 2: $(reach_verdict "$est" "<=" 2) (60,000 × the larger KiB per socket; not measured)"
	fi
	echo
	echo "notes:"
	echo "- levels: streams in the broker's table during the figure; $(kv hosts "$il") hosts registered"
	echo "  ($SCALE_HOSTS idle, the first $((SCALE_TOP / SCALE_PER_HOST)) holding $SCALE_PER_HOST idle streams each, + $SCALE_MATCH_HOSTS match hosts), idle"
	echo "  host registrations: $(scale_fmt "$(scale_get hosts 0 us_per_op)") µs broker CPU each ($(scale_get hosts 0 ops) hosts, table 0..N)."
	echo "- registration = a fresh connector (TLS + WebSocket upgrade + register) until registered, then"
	echo "  dropped: $SCALE_WORKERS in flight on $SCALE_REG_HOSTS hosts. match = broker/client.Dial with a route credential"
	echo "  (from the connector's auth.ok handoff) until matched, then closed: $SCALE_WORKERS in flight over"
	echo "  $SCALE_MATCH_HOSTS hosts. ${DUR} s each after ${WARM} s warm-up. Operations (low/high level):"
	echo "  register ${S[err.register]} (connector reconnects before registered), match ${S[err.match]}."
	echo "- broker CPU per operation is net of the idle baseline: the broker's CPU with nothing but"
	echo "  keepalive moving, measured over one ping interval (15 s) before and after the churn at each"
	echo "  level, the lower of the two (before: ${S[base]} % of a core; after: ${S[base_after]} %), times"
	echo "  the window, is taken out before dividing. Raw µs each (low/high level):"
	echo "  register ${S[raw.register]}, match ${S[raw.match]}, stream open ${S[raw.fill]}."
	echo "  per core = 1e6 / net µs: the load core (client TLS handshakes) is the limit of the measured"
	echo "  rate when the broker core is not busy."
	echo "- stream open: the fill of each level, $SCALE_PARALLEL in flight: PublishBootstrap on the host, then a"
	echo "  client match with it (two journal records); CPU over the whole fill; opens tried again"
	echo "  (publish reply past 30 s or a failed dial; at most 6 tries): ${S[err.fill]}."
	echo "- idle: VmRSS and go_goroutines of the broker at the largest level minus a baseline before the"
	echo "  first host, over hosts + streams ($SETTLE after the fill; the first level's churn ran before)."
	echo "  keepalive: broker CPU over $SCALE_KEEPALIVE with nothing moving, after the last churn."
	echo "- keepalive floor: after the broker stopped, loadgen keepalive-server (a bare Go TLS server, one"
	echo "  reader goroutine and one timer per socket, on the broker's core) holds as many sockets; per"
	echo "  socket and 15 s it reads its peer's 14-byte ping and writes a 10-byte pong, and writes its"
	echo "  own ping and reads the answer: the spec's keepalive with no WebSocket and no session. Its"
	echo "  CPU over $SCALE_KEEPALIVE after one interval of settling."
	echo "- the broker closes a stream idle for 5 min (not configurable): each level's figures must end"
	echo "  within 5 min of its first stream; the held row checks it at the sample."
	echo "- broker config: attempts_per_minute raised (all sockets come from 127.0.0.1) and max_hosts"
	echo "  16384 (the churn hosts); every other limit at its default."
	[[ -n $SCALE_NOTE ]] && echo "- $SCALE_NOTE."
	true
}

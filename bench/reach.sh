# shellcheck shell=bash
# The Reach figures of `make bench`, sourced by bench/run.sh (which provides
# WORK, LG, FRONT_BIN, load, log, fail, kv, the R table, PID, BG_PIDS, the
# ports, DUR/WARM/SETTLE/QUICK and the core numbers).
#
# What runs where:
#   core $SERVER_CPU : the broker (`securelink broker serve`), GOMAXPROCS 1 —
#                      the process under test;
#   core $LOAD_CPU   : bench/loadgen (the client), the fake upstream, and the
#                      front with Reach enabled (`securelink serve`, which is
#                      front and connector in ONE process).
# Every piece is started as an operator would: a self-signed certificate for
# 127.0.0.1, `broker add-host --json`, the broker's YAML, the front's
# `reach:` block, `securelink status --json` until reach.state is
# "connected", and a bootstrap from the admin socket turned into a route
# credential by one /relay/ws connection through the broker.

# bench/soak.sh sources this file too, for reach_start_broker and
# reach_start_front: it sets REACH_IDLE_HOSTS=0 and adds its metrics
# listeners with REACH_BROKER_YAML and REACH_FRONT_YAML (appended verbatim).

REACH_DIR=$WORK/reach
if [[ $QUICK == 1 ]]; then
	REACH_IDLE_HOSTS=${REACH_IDLE_HOSTS:-50} REACH_STREAM_HOSTS=16
else
	# As many idle hosts as idle streams (64 x 16): with a few hundred, the
	# per-host figure carried the process's warm-up (runtime metadata, code
	# pages, the handshake burst's garbage) rather than what a host holds.
	REACH_IDLE_HOSTS=${REACH_IDLE_HOSTS:-1024} REACH_STREAM_HOSTS=64
fi
# Hosts registered (and kept) before the idle figure's baseline, so the
# per-host RSS is what one more host costs, without the broker's first-use
# costs (code paged in, runtime arenas); none when no idle figure runs.
REACH_IDLE_WARM=${REACH_IDLE_WARM:-64}
((REACH_IDLE_HOSTS > 0)) || REACH_IDLE_WARM=0
REACH_STREAMS_PER_HOST=16 # the broker's per-host limit
# The idle CPU window: two keepalive rounds (one in a quick run).
REACH_IDLE_HOLD=${REACH_IDLE_HOLD:-$([[ $QUICK == 1 ]] && echo 16s || echo 30s)}
REACH_ECHO_SIZE=64
BROKER_URL="wss://127.0.0.1:$BROKER_PORT/v1/connect"
RFRONT="127.0.0.1:$RFRONT_PORT"
# The credit figures: a second front on the same broker whose connector
# declines the extension (reach.credit: false), so "off" is plain v1 on the
# same broker process in the same run. run.sh sets ROFF_PORT; soak.sh does
# not start it.
REACH_OFF_FRONT=${REACH_OFF_FRONT:-0}
ROFF="127.0.0.1:${ROFF_PORT:-0}"
REACH_SLOW_RATE=4000000 # bytes/s of the slow reader in the ping-pong figure

# broker_cert DIR: a private DIR with a self-signed certificate for
# 127.0.0.1 (DIR/broker.crt, DIR/broker.key).
broker_cert() {
	# add-host refuses a world-readable place for secrets; keep it private.
	mkdir -p "$1"
	chmod 700 "$1"
	(umask 077 && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
		-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
		-keyout "$1/broker.key" -out "$1/broker.crt" 2>/dev/null) || die "openssl could not make the broker certificate"
}

# broker_serve KEY YAML: `securelink broker serve` on the server core
# (PID[KEY], stdout $WORK/KEY.out, log $WORK/KEY.log) until it prints its
# listening line.
broker_serve() {
	local key=$1 yaml=$2 i
	taskset -c "$SERVER_CPU" "$FRONT_BIN" broker serve --config "$yaml" >"$WORK/$key.out" 2>"$WORK/$key.log" &
	PID[$key]=$!
	BG_PIDS+=(${PID[$key]})
	for i in $(seq 1 300); do
		grep -q '^broker listening ' "$WORK/$key.out" 2>/dev/null && break
		kill -0 "${PID[$key]}" 2>/dev/null || break
		sleep 0.1
	done
	grep -q '^broker listening ' "$WORK/$key.out" 2>/dev/null || {
		tail -n 20 "$WORK/$key.log" >&2 || true
		die "the broker ($key) did not start"
	}
}

reach_start_broker() {
	local d=$REACH_DIR
	broker_cert "$d"
	# attempts_per_minute: the idle figure registers a few hundred hosts and
	# a thousand streams from 127.0.0.1 within seconds; the default (30 per
	# source and minute) is for the Internet, not for this.
	cat >"$d/broker.yaml" <<EOF
listen: "127.0.0.1:$BROKER_PORT"
tls: {cert_file: "$d/broker.crt", key_file: "$d/broker.key"}
hosts_file: "$d/hosts.json"
state_file: "$d/state.json"
attempts_per_minute: 1048576
log: {level: warn, format: json}
${REACH_BROKER_YAML:-}
EOF
	log "reach: broker add-host for the front and $REACH_IDLE_HOSTS idle hosts"
	(umask 077 && "$FRONT_BIN" broker add-host --config "$d/broker.yaml" --json >"$d/front-host.json" 2>>"$WORK/broker-admin.log") ||
		die "broker add-host failed (see $RESULTS/logs/broker-admin.log)"
	# The host that loadgen reach-bulk registers as itself (issue 14's
	# 1 MiB-message figure; see reach_bulk).
	(umask 077 && "$FRONT_BIN" broker add-host --config "$d/broker.yaml" --json >"$d/bulk-host.json" 2>>"$WORK/broker-admin.log") ||
		die "broker add-host failed (see $RESULTS/logs/broker-admin.log)"
	local i
	if ((REACH_OFF_FRONT)); then
		(umask 077 && "$FRONT_BIN" broker add-host --config "$d/broker.yaml" --json >"$d/front-off-host.json" 2>>"$WORK/broker-admin.log") ||
			die "broker add-host failed (see $RESULTS/logs/broker-admin.log)"
	fi
	(
		umask 077
		for ((i = 0; i < REACH_IDLE_WARM + REACH_IDLE_HOSTS; i++)); do
			"$FRONT_BIN" broker add-host --config "$d/broker.yaml" --json || exit 1
		done >"$d/idle-hosts.jsonl" 2>>"$WORK/broker-admin.log"
	) || die "broker add-host failed (see $RESULTS/logs/broker-admin.log)"
	log "reach: starting the broker on 127.0.0.1:$BROKER_PORT (core $SERVER_CPU)"
	broker_serve broker "$d/broker.yaml"
}

# reach_start_front [off]: the front with Reach (PID/PIN key rfront, listen
# $RFRONT, route credential $REACH_DIR/route.json); with "off" the second
# one, reach.credit: false (key rfront_off, $ROFF, route-off.json).
reach_start_front() {
	local d=$REACH_DIR host_id sfx="" key=rfront addr=$RFRONT credit=true
	if [[ ${1:-} == off ]]; then
		sfx=-off key=rfront_off addr=$ROFF credit=false
	fi
	host_id=$(jq -r .host_id "$d/front$sfx-host.json")
	(umask 077 && jq -r .host_token "$d/front$sfx-host.json" >"$d/host$sfx.token")
	cat >"$d/front$sfx.yaml" <<EOF
listen: "$addr"
advertise: "127.0.0.1"
state_dir: "$d/state$sfx"
upstreams:
  relay: "http://127.0.0.1:$UP_PORT"
  api: "http://127.0.0.1:$UP_PORT"
  dashboard: "http://127.0.0.1:$UP_PORT"
reach:
  enabled: true
  broker_url: "$BROKER_URL"
  host_id: "$host_id"
  host_token_file: "$d/host$sfx.token"
  ca_file: "$d/broker.crt"
  credit: $credit
log: {level: warn, format: json}
${REACH_FRONT_YAML:-}
EOF
	log "reach: starting the front with Reach (credit: $credit) on $addr (front + connector, core $LOAD_CPU)"
	taskset -c "$LOAD_CPU" "$FRONT_BIN" serve --config "$d/front$sfx.yaml" >"$WORK/reach-front$sfx.out" 2>"$WORK/reach-front$sfx.log" &
	PID[$key]=$!
	BG_PIDS+=(${PID[$key]})
	local i line="" state="" st=""
	for i in $(seq 1 300); do
		line=$(grep -m1 '^listening ' "$WORK/reach-front$sfx.out" 2>/dev/null || true)
		[[ -n $line ]] && break
		kill -0 "${PID[$key]}" 2>/dev/null || break
		sleep 0.1
	done
	[[ -n $line ]] || {
		tail -n 20 "$WORK/reach-front$sfx.log" >&2 || true
		die "the Reach front did not print its listening line within 30 s"
	}
	PIN[$key]=$(awk '{print $6}' <<<"$line")
	for i in $(seq 1 300); do
		st=$("$FRONT_BIN" status --json --config "$d/front$sfx.yaml" 2>/dev/null | jq -c '.reach // empty' || true)
		state=$(jq -r '.state // empty' <<<"${st:-null}" 2>/dev/null || true)
		[[ $state == connected ]] && break
		sleep 0.1
	done
	[[ $state == connected ]] || {
		"$FRONT_BIN" status --json --config "$d/front$sfx.yaml" 2>&1 | jq -c .reach >&2 || true
		die "the front's connector never reached reach.state connected (last: ${state:-none})"
	}
	[[ $(jq -r .credit <<<"$st") == "$credit" ]] || die "reach.credit: $credit, but the connector reports credit $(jq -r .credit <<<"$st")"
	log "reach: connector connected, credit $credit ($line)"
	# One bootstrap serves exactly one stream; the figures need several, so
	# trade it for the route credential a phone gets in its first auth.ok.
	local out
	out=$(load "$LG" reach-route -admin "$d/state$sfx/admin.sock" -addr "$addr" -pin "${PIN[$key]}" \
		-ca-file "$d/broker.crt" -out "$d/route$sfx.json") || die "could not obtain a route credential through the broker"
	log "reach: $out"
}

# reach_figure NAME ARGS...: loadgen on the load core; prints its line. It
# runs in a command substitution, so the caller records a failure (fail).
reach_figure() {
	local name=$1 out
	shift
	if out=$(load "$LG" "$@" 2>>"$WORK/reach-loadgen.log"); then
		log "reach $name: $out"
		printf '%s\n' "$out"
	else
		tail -n 3 "$WORK/reach-loadgen.log" >&2 || true
		return 1
	fi
}

# Shares of each core during a window: broker on the server core; front,
# upstream and loadgen on the load core.
reach_busy() { # KEY OUT
	local k=$1 out=$2 secs
	secs=$(kv secs "$out")
	R[busy_broker.$k]=$(awk -v c="$(kv cpu_us "$out")" -v s="$secs" 'BEGIN{printf "%.0f", c/s/1e4}')
	R[busy_load.$k]=$(awk -v a="$(kv cpu_front_us "$out")" -v b="$(kv cpu_upstream_us "$out")" -v c="$(kv cpu_self_us "$out")" -v s="$secs" \
		'BEGIN{printf "%.0f%% (front %.0f%%, upstream %.0f%%, client %.0f%%)", (a+b+c)/s/1e4, a/s/1e4, b/s/1e4, c/s/1e4}')
}

# reach_via VIA: the loadgen arguments of a path. broker = the credit-on
# front through the broker, broker_off = the credit-off front through the
# same broker, direct = TLS straight to the credit-on front.
reach_via() {
	case $1 in
	broker) REACH_ARGS=(-pin "${PIN[rfront]}" -pids "${PID[broker]}" -watch "front=${PID[rfront]},upstream=$UP_PID"
		-reach "$REACH_DIR/route.json" -ca-file "$REACH_DIR/broker.crt") REACH_ADDR=$RFRONT ;;
	broker_off) REACH_ARGS=(-pin "${PIN[rfront_off]}" -pids "${PID[broker]}" -watch "front=${PID[rfront_off]},upstream=$UP_PID"
		-reach "$REACH_DIR/route-off.json" -ca-file "$REACH_DIR/broker.crt") REACH_ADDR=$ROFF ;;
	direct) REACH_ARGS=(-pin "${PIN[rfront]}" -pids "${PID[broker]}" -watch "front=${PID[rfront]},upstream=$UP_PID") REACH_ADDR=$RFRONT ;;
	esac
}

reach_xfer() { # MODE VIA
	local mode=$1 via=$2 out
	reach_via "$via"
	out=$(reach_figure "$mode $via" xfer -mode "$mode" -addr "$REACH_ADDR" -duration "${DUR}s" -warmup "${WARM}s" "${REACH_ARGS[@]}") || {
		fail "reach $mode $via failed (see $RESULTS/logs/reach-loadgen.log)"
		return 0
	}
	R[${mode}_mbs.$via]=$(printf '%.0f' "$(kv mbs "$out")")
	R[${mode}_cut.$via]=$(kv cut "$out")
	R[${mode}_err.$via]=$(sed -n 's/.* error=//p' <<<"$out")
	R[${mode}_n.$via]=$(kv transfers "$out")
	if [[ $via != direct ]]; then
		R[${mode}_cpugb.$via]=$(printf '%.2f' "$(kv cpu_s_per_gb "$out")")
		(($(kv dials "$out") == 1)) || fail "reach $mode $via: $(kv dials "$out") broker streams, want exactly 1"
	fi
	reach_busy "$mode.$via" "$out"
	[[ $(kv cut "$out") == 0 ]] || fail "reach $mode $via: the stream was cut: ${R[${mode}_err.$via]}"
}

# reach_bulk MODE (upload | download | echo): issue 14's broker figure on
# its own workload. loadgen registers as a host itself (a real connector,
# the package securelink serve runs, on the load core) and opens one client
# stream to it; upload/download move raw bytes in 1 MiB writes on that
# stream (the client's Writes are 1 MiB binary messages), echo sends one
# 64 B message each way at a time. No front, no inner TLS, no HTTP.
reach_bulk() {
	local mode=$1 out args=()
	args=(reach-bulk -mode "$mode" -broker-url "$BROKER_URL" -ca-file "$REACH_DIR/broker.crt" -host "$REACH_DIR/bulk-host.json"
		-pids "${PID[broker]}" -duration "${DUR}s" -warmup "${WARM}s")
	[[ $mode == echo ]] && args+=(-msg-size "$REACH_ECHO_SIZE")
	out=$(reach_figure "bulk $mode" "${args[@]}") || {
		fail "reach bulk $mode failed (see $RESULTS/logs/reach-loadgen.log)"
		return 0
	}
	if [[ $mode == echo ]]; then
		R[bulk_msg_us]=$(printf '%.1f' "$(kv cpu_per_msg_us "$out")")
		R[bulk_rtt_p50]=$(kv p50_us "$out")
		return 0
	fi
	R[bulk_${mode}_cpugb]=$(printf '%.2f' "$(kv cpu_s_per_gb "$out")")
	R[bulk_${mode}_mbs]=$(printf '%.0f' "$(kv mbs "$out")")
	R[bulk_${mode}_cut]=$(kv cut "$out")
	[[ $(kv cut "$out") == 0 ]] || fail "reach bulk $mode: the stream was cut: $(sed -n 's/.* error=//p' <<<"$out")"
}

# reach_aead_floor: the calibration under every broker s/GB row, in the
# same run: two AES-128-GCM passes per byte (each byte is opened from the
# sender's TLS and sealed into the receiver's) on the broker's core, while
# the broker is idle between figures.
reach_aead_floor() {
	local out
	if out=$(taskset -c "$SERVER_CPU" "$LG" aead-floor -duration 1s 2>>"$WORK/reach-loadgen.log"); then
		log "reach aead floor: $out"
		R[aead_floor]=$(printf '%.3f' "$(kv cpu_s_per_gb "$out")")
	else
		fail "reach: the AEAD floor calibration failed (see $RESULTS/logs/reach-loadgen.log)"
	fi
}

reach_echo() { # VIA
	local via=$1 out args=()
	args=(echo -url "wss://$RFRONT/relay/ws" -pin "${PIN[rfront]}" -conns 1 -size "$REACH_ECHO_SIZE"
		-duration "${DUR}s" -warmup "${WARM}s" -pids "${PID[broker]}" -watch "front=${PID[rfront]},upstream=$UP_PID")
	[[ $via == broker ]] && args+=(-reach "$REACH_DIR/route.json" -ca-file "$REACH_DIR/broker.crt")
	out=$(reach_figure "echo $via" "${args[@]}") || {
		fail "reach echo $via failed (see $RESULTS/logs/reach-loadgen.log)"
		return 0
	}
	R[rtt_p50.$via]=$(printf '%.0f' "$(kv p50_us "$out")")
	R[rtt_p99.$via]=$(printf '%.0f' "$(kv p99_us "$out")")
	[[ $via == broker ]] && R[rtt_cpu]=$(printf '%.1f' "$(kv cpu_per_op_us "$out")")
	reach_busy "echo.$via" "$out"
}

# broker_count KIND OUTCOME: one securelink_broker_events_total counter
# from the broker's /metrics (loopback); empty when it cannot be read.
broker_count() {
	curl -fsS --max-time 5 "http://127.0.0.1:$BMETRICS_PORT/metrics" 2>/dev/null |
		awk -v k="securelink_broker_events_total{kind=\"$1\",outcome=\"$2\"}" '$1 == k {print $2; f=1} END {if (!f) print 0}'
}

# reach_pingpong VIA (broker | broker_off): the 64 B /relay/ws echo on one
# stream while another stream of the same host downloads /api/bulk back to
# back (32 MiB each) into a client that reads at $REACH_SLOW_RATE bytes/s.
reach_pingpong() {
	local via=$1 out p0 p1
	reach_via "$via"
	p0=$(broker_count paused host)
	out=$(reach_figure "ping-pong $via" echo -url "wss://$REACH_ADDR/relay/ws" -conns 1 -size "$REACH_ECHO_SIZE" \
		-bulk-rate "$REACH_SLOW_RATE" -duration "${DUR}s" -warmup "${WARM}s" "${REACH_ARGS[@]}") || {
		fail "reach ping-pong $via failed (see $RESULTS/logs/reach-loadgen.log)"
		return 0
	}
	p1=$(broker_count paused host)
	R[pp_p50.$via]=$(printf '%.0f' "$(kv p50_us "$out")")
	R[pp_p99.$via]=$(printf '%.0f' "$(kv p99_us "$out")")
	R[pp_p999.$via]=$(printf '%.0f' "$(kv p999_us "$out")")
	R[pp_max.$via]=$(printf '%.0f' "$(kv max_us "$out")")
	R[pp_ops.$via]=$(kv ops "$out")
	R[pp_bulk.$via]=$(printf '%.1f' "$(kv bulk_mbs "$out")")
	[[ -n $p0 && -n $p1 ]] && R[pp_paused.$via]=$((p1 - p0))
	reach_busy "pingpong.$via" "$out"
	[[ $(kv bulk_cut "$out") == 0 ]] || fail "reach ping-pong $via: the bulk stream was cut: $(sed -n 's/.* bulk_error=//p' <<<"$out")"
}

reach_idle() {
	local out
	out=$(reach_figure idle reach-idle -broker-url "$BROKER_URL" -ca-file "$REACH_DIR/broker.crt" \
		-hosts "$REACH_DIR/idle-hosts.jsonl" -warm "$REACH_IDLE_WARM" -hosts-n "$REACH_IDLE_HOSTS" -stream-hosts "$REACH_STREAM_HOSTS" \
		-streams-per-host "$REACH_STREAMS_PER_HOST" -settle "$SETTLE" -pids "${PID[broker]}" \
		-metrics "127.0.0.1:$BMETRICS_PORT" -hold "$REACH_IDLE_HOLD") || {
		fail "reach idle hosts/streams failed (see $RESULTS/logs/reach-loadgen.log)"
		return 0
	}
	R[idle_host_kib]=$(printf '%.1f' "$(kv kib_per_host "$out")")
	R[idle_stream_kib]=$(printf '%.1f' "$(kv kib_per_stream "$out")")
	R[idle_host_g]=$(kv goroutines_per_host "$out")
	R[idle_stream_g]=$(kv goroutines_per_stream "$out")
	R[idle_cpu]=$(kv idle_cpu_pct "$out")
	R[idle_streams]=$(kv streams "$out")
	R[idle_hosts]=$(kv hosts "$out")
}

# BENCH_PPROF=1: perf of the broker and of the front+connector during one
# extra download and one extra upload through the broker.
REACH_PPROF_NOTE="" REACH_PPROF_GROUPS=""

# reach_perf_groups DATA: inclusive CPU share of the places the time goes,
# one "label pct" per line (symbols from Go 1.26 and coder/websocket).
reach_perf_groups() {
	perf report -i "$1" --stdio --children --sort symbol -g none --percent-limit 0.3 2>/dev/null | awk '
		BEGIN {
			want["io.ReadAll"] = "io.ReadAll: reading messages (incl. TLS decrypt, read(2))"
			want["runtime.growslice"] = "runtime.growslice (io.ReadAll growing a fresh slice)"
			want["runtime.mallocgc"] = "runtime.mallocgc (allocation)"
			want["runtime.gcAssistAlloc"] = "runtime.gcAssistAlloc (GC work charged to allocations)"
			want["runtime.gcBgMarkWorker"] = "runtime.gcBgMarkWorker (background GC)"
			want["crypto/tls.(*halfConn).encrypt"] = "TLS encrypt"
			want["crypto/tls.(*halfConn).decrypt"] = "TLS decrypt"
			want["github.com/coder/websocket.maskGo"] = "WebSocket masking"
			want["ksys_read"] = "read(2)"
			want["ksys_write"] = "write(2)"
			want["finish_task_switch.isra.0"] = "context switches (finish_task_switch)"
		}
		$1 ~ /%$/ && ($4 in want) { printf "%-58s %s\n", want[$4], $1 }'
}
reach_profile() {
	[[ $PPROF == 1 ]] || return 0
	local mode who data txt notes=()
	for mode in download upload; do
		log "reach: profiling broker and front during an extra $mode through the broker (${DUR}s)"
		local pp=()
		for who in broker rfront; do
			data="$RESULTS/reach-$mode-$who.perf.data"
			load perf record -q -F 999 -g -p "${PID[$who]}" -o "$data" -- sleep "$((DUR + WARM))" 2>>"$WORK/perf.log" &
			pp+=($!)
		done
		load "$LG" xfer -mode "$mode" -addr "$RFRONT" -pin "${PIN[rfront]}" -duration "${DUR}s" -warmup "${WARM}s" \
			-reach "$REACH_DIR/route.json" -ca-file "$REACH_DIR/broker.crt" >/dev/null 2>>"$WORK/reach-loadgen.log" || true
		wait "${pp[@]}" || true
		for who in broker rfront; do
			data="$RESULTS/reach-$mode-$who.perf.data" txt="$RESULTS/reach-$mode-$who.perf.txt"
			[[ -s $data ]] || continue
			{
				echo "== $who, $mode through the broker: where the time goes (inclusive)"
				reach_perf_groups "$data"
				echo
				echo "== $who, $mode through the broker: self CPU by symbol"
				perf report -i "$data" --stdio --no-children --sort symbol -g none --percent-limit 0.7 2>/dev/null | sed -E '/^#/d; /^$/d; s/[[:space:]]+-[[:space:]]+-[[:space:]]*$//'
			} >"$txt" || true
			notes+=("$txt")
			if [[ $who == broker ]]; then
				REACH_PPROF_GROUPS+=$'\n'"  broker, $mode (inclusive share of broker CPU):"$'\n'"$(reach_perf_groups "$data" | sed 's/^/    /')"
			fi
		done
	done
	if ((${#notes[@]})); then
		REACH_PPROF_NOTE="perf profiles (BENCH_PPROF=1): ${notes[*]}$REACH_PPROF_GROUPS"
	else
		REACH_PPROF_NOTE="BENCH_PPROF=1: perf recorded nothing (see $RESULTS/logs/perf.log)"
	fi
}

reach_run() {
	[[ -x $FRONT_BIN ]] || die "$FRONT_BIN missing: run make build"
	REACH_OFF_FRONT=1
	REACH_BROKER_YAML=${REACH_BROKER_YAML:-"metrics: {listen: \"127.0.0.1:$BMETRICS_PORT\"}"}
	reach_start_broker
	reach_start_front
	reach_start_front off
	# Idle memory first, on a fresh broker (as for the front's idle figure).
	log "reach: idle hosts and streams"
	reach_idle
	sleep 1
	local mode via round k
	# Interleaved, so drift on the shared machine hits credit on and off
	# alike, and repeated ROUNDS times: the table shows each transfer
	# figure's median (a cut in any round counts), the notes every round.
	declare -gA REACH_RX=()
	for round in $(seq 1 "$ROUNDS"); do
		for mode in download upload; do
			for via in broker broker_off direct; do
				log "reach: round $round/$ROUNDS, $mode $via"
				reach_xfer "$mode" "$via"
			done
			log "reach: round $round/$ROUNDS, $mode of 1 MiB messages, raw stream"
			reach_bulk "$mode"
		done
		log "reach: round $round/$ROUNDS, AEAD floor on the broker's core"
		reach_aead_floor
		for k in "${!R[@]}"; do
			[[ $k =~ ^(download|upload)_(mbs|cpugb|n|cut)\. || $k =~ ^bulk_(download|upload)_(mbs|cpugb|cut)$ || $k == aead_floor ]] && REACH_RX[$k]+="${REACH_RX[$k]:+ }${R[$k]}"
		done
	done
	for k in "${!REACH_RX[@]}"; do
		if [[ $k == *_cut.* || $k == *_cut ]]; then
			R[$k]=$(tr ' ' '\n' <<<"${REACH_RX[$k]}" | sort -g | tail -1)
		else
			R[$k]=$(median "${REACH_RX[$k]}")
		fi
	done
	for via in broker direct; do
		log "reach: echo $via"
		reach_echo "$via"
	done
	log "reach: 64 B echo on a raw stream"
	reach_bulk echo
	for via in broker broker_off; do
		log "reach: ping-pong next to a bulk stream read at $REACH_SLOW_RATE B/s, $via"
		reach_pingpong "$via"
	done
	if command -v perf >/dev/null; then
		reach_profile
	elif [[ $PPROF == 1 ]]; then
		REACH_PPROF_NOTE="BENCH_PPROF=1 asked, but perf is not installed: no profile taken"
	fi
}

# ------------------------------------------------------------------ table

reach_ratio() {
	awk -v a="$1" -v b="$2" 'BEGIN{ if (a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b+0 == 0) print "-"; else printf "%.2fx", a/b }'
}
reach_pad() { local b c; b=$(printf %s "$1" | LC_ALL=C wc -c); c=$(printf %s "$1" | LC_ALL=C.UTF-8 wc -m); echo $((46 + b - c)); }
reach_row() { # LABEL BROKER DIRECT TARGET
	printf "%-$(reach_pad "$1")s %9s %9s %13s   %s\n" "$1" "${2:--}" "${3:--}" "$(reach_ratio "${2:-}" "${3:-}")" "$4"
}
reach_ceiling() { awk -v c="$1" 'BEGIN{ if (c !~ /^[0-9.]+$/ || c+0 == 0) print ""; else printf "%.0f", 1000/c }'; }
# reach_floor S_PER_GB: the row's CPU per byte as a multiple of this run's
# AEAD floor (empty when either is missing).
reach_floor() {
	awk -v v="$1" -v f="${R[aead_floor]:-}" 'BEGIN{ if (v !~ /^[0-9.]+$/ || f !~ /^[0-9.]+$/ || f+0 == 0) print ""; else printf "; %.2fx floor", v/f }'
}
reach_verdict() { # VALUE OP LIMIT -> "met" / "missed by X"
	awk -v v="$1" -v op="$2" -v l="$3" 'BEGIN{
		if (v !~ /^[0-9.]+$/) { print "not measured"; exit }
		if (op == ">=") { if (v+0 >= l+0) print "met"; else printf "MISSED (%.0f%% of target)", 100*v/l }
		else            { if (v+0 <= l+0) print "met"; else printf "MISSED (%.1fx the limit)", v/l } }'
}

reach_table() {
	local dl=${R[download_mbs.broker]:-} ul=${R[upload_mbs.broker]:-} p50=${R[rtt_p50.broker]:-} kib=${R[idle_stream_kib]:-}
	local cut="-"
	[[ -n ${R[upload_cut.broker]:-} ]] && cut=$([[ ${R[upload_cut.broker]} == 0 ]] && echo "none" || echo "CUT")
	echo "Reach: client <-> broker <-> connector <-> front, inner pinned TLS (1 stream), vs direct TLS to the same front"
	echo "layout:   core $SERVER_CPU: broker (securelink broker serve, GOMAXPROCS 1);"
	echo "          core $LOAD_CPU: loadgen client + fake upstream + front with Reach (front and connector are ONE"
	echo "          process, securelink serve). The broker is what is measured; the load core also carries"
	echo "          both ends of the inner TLS and the outer wss:// of connector and client."
	echo
	printf '%-46s %9s %9s %13s   %s\n' "figure" "broker" "direct" "broker/direct" "target (issue 14)"
	local rdl rul rp50 msg_us=""
	rdl=$(reach_ratio "$dl" "${R[download_mbs.direct]:-}") rul=$(reach_ratio "$ul" "${R[upload_mbs.direct]:-}")
	rp50=$(reach_ratio "$p50" "${R[rtt_p50.direct]:-}")
	[[ ${R[rtt_cpu]:-} =~ ^[0-9.]+$ ]] && msg_us=$(awk -v c="${R[rtt_cpu]}" 'BEGIN{printf "%.1f", c/2}')
	reach_row "download MB/s, 1 stream (8 MiB GETs)" "$dl" "${R[download_mbs.direct]:-}" "≥ 0.5× direct: $(reach_verdict "${rdl%x}" ">=" 0.5)"
	reach_row "upload MB/s, 1 stream (8 MiB POSTs)" "$ul" "${R[upload_mbs.direct]:-}" "≥ 0.5× direct: $(reach_verdict "${rul%x}" ">=" 0.5)"
	reach_row "/relay/ws 64 B echo p50 µs (1 conn)" "$p50" "${R[rtt_p50.direct]:-}" "≤ 2× direct: $(reach_verdict "${rp50%x}" "<=" 2)"
	reach_row "/relay/ws 64 B echo p99 µs (1 conn)" "${R[rtt_p99.broker]:-}" "${R[rtt_p99.direct]:-}" ""
	reach_row "broker CPU s/GB, download (~16 KiB msgs)" "${R[download_cpugb.broker]:-}" "" "≤ 0.7: $(reach_verdict "${R[download_cpugb.broker]:-}" "<=" 0.7)$(reach_floor "${R[download_cpugb.broker]:-}")"
	reach_row "broker CPU s/GB, upload (~16 KiB msgs)" "${R[upload_cpugb.broker]:-}" "" "≤ 0.7: $(reach_verdict "${R[upload_cpugb.broker]:-}" "<=" 0.7)$(reach_floor "${R[upload_cpugb.broker]:-}")"
	reach_row "broker CPU s/GB, download (raw, 1 MiB writes)" "${R[bulk_download_cpugb]:-}" "" "≤ 0.7: $(reach_verdict "${R[bulk_download_cpugb]:-}" "<=" 0.7)$(reach_floor "${R[bulk_download_cpugb]:-}")"
	reach_row "broker CPU s/GB, upload (raw, 1 MiB msgs)" "${R[bulk_upload_cpugb]:-}" "" "≤ 0.7: $(reach_verdict "${R[bulk_upload_cpugb]:-}" "<=" 0.7)$(reach_floor "${R[bulk_upload_cpugb]:-}")"
	reach_row "AEAD floor s/GB (2 AES-GCM passes)" "${R[aead_floor]:-}" "" "calibration: broker core, this run"
	reach_row "raw stream MB/s, download" "${R[bulk_download_mbs]:-}" "" "load-core bound"
	reach_row "raw stream MB/s, upload" "${R[bulk_upload_mbs]:-}" "" ""
	reach_row "broker-bound ceiling MB/s, download" "$(reach_ceiling "${R[download_cpugb.broker]:-}")" "" "1 core / broker CPU per byte"
	reach_row "broker-bound ceiling MB/s, upload" "$(reach_ceiling "${R[upload_cpugb.broker]:-}")" "" ""
	reach_row "broker CPU µs per 64 B echo" "${R[rtt_cpu]:-}" "" "two small messages"
	reach_row "broker CPU µs per small message" "$msg_us" "" "≤ 20: $(reach_verdict "$msg_us" "<=" 20)"
	reach_row "broker CPU µs per small message (raw)" "${R[bulk_msg_us]:-}" "" "≤ 20: $(reach_verdict "${R[bulk_msg_us]:-}" "<=" 20)"
	reach_row "raw stream 64 B echo p50 µs" "${R[bulk_rtt_p50]:-}" "" "no front, no inner TLS"
	reach_row "broker RSS KiB per idle host" "${R[idle_host_kib]:-}" "" "≤ 32: $(reach_verdict "${R[idle_host_kib]:-}" "<=" 32)"
	reach_row "broker RSS KiB per idle stream" "$kib" "" "≤ 32: $(reach_verdict "$kib" "<=" 32)"
	reach_row "broker goroutines per idle host" "${R[idle_host_g]:-}" "" "≤ 1: $(reach_verdict "${R[idle_host_g]:-}" "<=" 1)"
	reach_row "broker goroutines per idle stream" "${R[idle_stream_g]:-}" "" "≤ 1: $(reach_verdict "${R[idle_stream_g]:-}" "<=" 1)"
	reach_row "broker CPU % of a core, all idle (${REACH_IDLE_HOLD})" "${R[idle_cpu]:-}" "" "keepalive at this size"
	reach_row "uploading stream cut" "$cut" "" "none: $([[ $cut == none ]] && echo met || echo "${cut/-/not measured}")"
	echo
	echo "notes:"
	echo "- transfers: median of $ROUNDS interleaved round(s). MB/s = 10^6 bytes/s over ${DUR} s after ${WARM} s"
	echo "  warm-up, on ONE connection (one broker stream:"
	echo "  route credential from the front's auth.ok handoff); download counts body bytes read, upload"
	echo "  counts bytes the upstream sink confirmed. Transfers in the window: download ${R[download_n.broker]:--}"
	echo "  via broker / ${R[download_n.direct]:--} direct, upload ${R[upload_n.broker]:--} / ${R[upload_n.direct]:--}."
	echo "- broker CPU = utime+stime of the broker process only (/proc), per 10^9 bytes moved. The"
	echo "  client's messages are its inner TLS records (~16 KiB each; the client writes one message"
	echo "  per record), and the connector's DATA frames at most 64 KiB: issue 14's ≤ 0.7 s/GB is"
	echo "  stated for 1 MiB client messages, so these rows carry more per-message work than that."
	echo "  A small message is half an echo (request and answer each cross the broker once)."
	echo "- raw rows (issue 14's own workload): loadgen registers as a host itself (a real connector,"
	echo "  the package securelink serve runs, on the load core) and opens one client stream to it; the"
	echo "  stream carries raw bytes, no front, no inner TLS, no HTTP. Upload: the client writes 1 MiB"
	echo "  binary messages (the broker forwards each as two DATA frames, 1 MiB and 18 B, the"
	echo "  reference connectors' frame limit); download: the connector's 64 KiB DATA frames, which"
	echo "  the broker coalesces into client messages of up to 256 KiB. Every byte is checked on"
	echo "  arrival. Median of $ROUNDS round(s): download ${REACH_RX[bulk_download_cpugb]:--} s/GB, upload"
	echo "  ${REACH_RX[bulk_upload_cpugb]:--} s/GB. The raw 64 B echo: one message each way at a time."
	echo "- AEAD floor: loadgen aead-floor on the broker's core between the figures of each round (the"
	echo "  broker idle): AES-128-GCM seal + open of 16 KiB records, CPU per 10^9 bytes; every byte the"
	echo "  broker relays is opened once and sealed once, so no TLS relay goes below it. The s/GB rows"
	echo "  give their multiple of it (x floor). Every round: ${REACH_RX[aead_floor]:--} s/GB."
	echo "- idle: after $REACH_IDLE_WARM warm-up hosts (registered and kept before the baseline: what one more"
	echo "  host costs, not the fresh broker's first use), ${R[idle_hosts]:--} host registrations (real connectors,"
	echo "  the package securelink serve runs, started from loadgen), then ${R[idle_streams]:--} client streams on $REACH_STREAM_HOSTS of them ($REACH_STREAMS_PER_HOST each, the"
	echo "  per-host limit), each with its own bootstrap; VmRSS increase of the broker after $SETTLE;"
	echo "  goroutines from the broker's go_goroutines (/metrics); CPU over $REACH_IDLE_HOLD with everything idle"
	echo "  (pings every 15 s on every socket; issue 15's goal is ≤ 5% of a core at 10,000 hosts + 50,000 streams)."
	echo "  The broker config raises attempts_per_minute (default 30 per source) for this figure."
	echo "- core busy during the windows (broker core | load core):"
	local k
	for k in download.broker download.broker_off download.direct upload.broker upload.broker_off upload.direct \
		echo.broker echo.direct pingpong.broker pingpong.broker_off; do
		[[ -n ${R[busy_broker.$k]:-} ]] || continue
		printf '  %-20s broker %3s%% | load %s\n' "$k" "${R[busy_broker.$k]}" "${R[busy_load.$k]}"
	done
	echo "- for scale: the Python reference broker + connector measured 51 MB/s download, 112 MB/s"
	echo "  upload and 785 µs RTT p50 on this machine class, without inner TLS."
	[[ -n $REACH_PPROF_NOTE ]] && printf -- '- %s\n' "$REACH_PPROF_NOTE"
	echo
	reach_credit_table
	true
}

# The credit extension on and off, same broker, same run.
reach_credit_table() {
	local k on off r
	echo "Reach credit extension: on vs off (plain v1), same broker process, same run"
	echo "          on = the front above; off = a second front with reach.credit: false on the same broker"
	echo "          (its connector declines the extension), on the load core as well."
	echo
	printf '%-46s %9s %9s %13s   %s
' "figure" "on" "off" "on/off" "target"
	for k in download upload; do
		on=${R[${k}_mbs.broker]:-} off=${R[${k}_mbs.broker_off]:-}
		r=$(reach_ratio "$on" "$off")
		reach_row "$k MB/s, 1 stream (8 MiB, inner TLS)" "$on" "$off" "on ≥ 0.9× off: $(reach_verdict "${r%x}" ">=" 0.9)"
	done
	reach_row "broker CPU s/GB, download" "${R[download_cpugb.broker]:-}" "${R[download_cpugb.broker_off]:-}" ""
	reach_row "broker CPU s/GB, upload" "${R[upload_cpugb.broker]:-}" "${R[upload_cpugb.broker_off]:-}" ""
	reach_row "ping-pong p50 µs, bulk to a slow reader" "${R[pp_p50.broker]:-}" "${R[pp_p50.broker_off]:-}" "lower"
	reach_row "ping-pong p99 µs, bulk to a slow reader" "${R[pp_p99.broker]:-}" "${R[pp_p99.broker_off]:-}" "lower"
	reach_row "ping-pong p99.9 µs, bulk to a slow reader" "${R[pp_p999.broker]:-}" "${R[pp_p999.broker_off]:-}" "lower"
	reach_row "ping-pong max µs, bulk to a slow reader" "${R[pp_max.broker]:-}" "${R[pp_max.broker_off]:-}" "lower"
	reach_row "ping-pong round trips in the window" "${R[pp_ops.broker]:-}" "${R[pp_ops.broker_off]:-}" "higher"
	reach_row "bulk stream MB/s (the reader's pace)" "${R[pp_bulk.broker]:-}" "${R[pp_bulk.broker_off]:-}" "$(awk -v r="$REACH_SLOW_RATE" 'BEGIN{printf "%.1f", r/1e6}')"
	reach_row "broker host-socket pauses in the window" "${R[pp_paused.broker]:-}" "${R[pp_paused.broker_off]:-}" "0 with credit"
	echo
	echo "notes:"
	echo "- download/upload: as above (one broker stream, back-to-back 8 MiB transfers), interleaved"
	echo "  on, off, direct per mode; median of $ROUNDS round(s). Every round (MB/s, on | off):"
	for k in download upload; do
		printf '    %-8s %s | %s\n' "$k" "${REACH_RX[${k}_mbs.broker]:--}" "${REACH_RX[${k}_mbs.broker_off]:--}"
	done
	echo "- ping-pong: 64 B /relay/ws echo, one in flight, on one stream, while a second stream of the same"
	echo "  host (same route credential) GETs /api/bulk?n=4 (32 MiB, 4x the broker's 8 MiB stream queue)"
	echo "  back to back into a client reading at $REACH_SLOW_RATE bytes/s, 64 KiB per read; ${DUR} s after"
	echo "  ${WARM} s warm-up (the bulk stream starts before the warm-up). Host-socket pauses:"
	echo '  securelink_broker_events_total{kind="paused",outcome="host"} from the broker'"'"'s /metrics'
	echo "  before and after the figure."
	echo "- one echo is in flight, so a stall is ONE slow sample: a few long pauses hide above p99; the"
	echo "  round trips completed in the window and the max show them."
}

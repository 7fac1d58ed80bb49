#!/usr/bin/env bash
# `make bench`: the front (`securelink serve`) against nginx and Caddy as
# equivalent TLS reverse proxies, in one run, on loopback only, with the same
# ECDSA P-256 key.
#
# Layout: the server under test (front, nginx with 1 worker, or Caddy) is
# pinned to core 0; the load generators (wrk, bench/loadgen) and the fake
# upstream to core 1. Every figure is measured, never asserted; the table
# compares CPU per operation and ratios to each peer (medians over
# BENCH_ROUNDS rounds), which survive a noisy shared machine better than raw
# rates.
#
#   BENCH_QUICK=1   a smoke run of a few seconds per figure, one round
#   BENCH_ROUNDS=N  rounds of every front figure (default 3, 1 when quick);
#                   the table shows each figure's median
#   BENCH_PPROF=1   also profile the front with perf during extra small-GET,
#                   /relay/health, download and echo passes (the front
#                   exposes no pprof); reports in bench/results/
#   BENCH_ONLY=front|nginx|caddy   measure one server only (no ratio values)
#   BENCH_ONLY=tcp           the three servers' TCP figures only (no HTTP/3
#                            block, no Reach)
#   BENCH_ONLY=reach         only the Reach figures (bench/reach.sh): broker
#                            vs direct, through our broker and connector
#   BENCH_ONLY=h3            only the HTTP/3 block: the front (http3: true)
#                            and Caddy, over HTTP/3 and over TCP
#   BENCH_ONLY=scale         only the broker-at-scale figures (bench/scale.sh):
#                            CPU per registration and per match at two
#                            stream-table sizes, RSS/goroutines per idle
#                            socket, keepalive CPU
#   BENCH_SCALE_FULL=1       the scale block at 10,000 hosts + 50,000 streams
#                            (needs RLIMIT_NOFILE >= ~61,000)
#
# The table goes to stdout and to bench/results/latest.txt; progress to stderr.
set -euo pipefail
export LC_ALL=C

cd "$(dirname "$0")/.."
ROOT=$PWD
GO=${GO:-go}
FRONT_BIN=${BIN:-bin/securelink}
QUICK=${BENCH_QUICK:-0}
PPROF=${BENCH_PPROF:-0}
ONLY=${BENCH_ONLY:-}
RESULTS=$ROOT/bench/results

if [[ $QUICK == 1 ]]; then
	DUR=2 WARM=1 SETTLE=1s ROUNDS=${BENCH_ROUNDS:-1} MODE="quick (BENCH_QUICK=1: smoke run, rough numbers)"
else
	DUR=6 WARM=1 SETTLE=3s ROUNDS=${BENCH_ROUNDS:-3} MODE="full"
fi
[[ $ROUNDS =~ ^[1-9][0-9]?$ ]] || {
	echo "BENCH_ROUNDS must be 1..99" >&2
	exit 2
}
IDLE_CONNS=1000
GET_CONNS=32
ECHO_CONNS=32
HS_LOOPS=16
SERVERS=(front nginx caddy)
FIGURES=(idle get health download handshakes echo)
REACH=1
SCALE=1 # the broker-at-scale block (bench/scale.sh)
H3=1    # the HTTP/3 block: front and Caddy (Debian's caddy serves h3)
case $ONLY in
"") ;;
front | nginx | caddy) SERVERS=("$ONLY") REACH=0 SCALE=0 H3=0 ;;
tcp) REACH=0 SCALE=0 H3=0 ;;
reach) SERVERS=() SCALE=0 H3=0 ;;
scale) SERVERS=() REACH=0 H3=0 ;;
h3) SERVERS=(front caddy) FIGURES=(get download) REACH=0 SCALE=0 ROUNDS=1 ;;
*)
	echo "BENCH_ONLY must be front, nginx, caddy, tcp, reach, scale or h3" >&2
	exit 2
	;;
esac

log() { printf '[bench] %s\n' "$*" >&2; }
die() {
	printf '[bench] error: %s\n' "$*" >&2
	exit 1
}

# ------------------------------------------------------------------ tools

as_root() {
	if [[ $(id -u) == 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		sudo -n "$@"
	else
		return 1
	fi
}

# Debian's postinst would start a system nginx on :80; a temporary policy-rc.d
# (only when none exists) keeps the install from starting any service.
install_pkgs() {
	local pkgs=("$@") made_policy=0
	log "installing ${pkgs[*]} with apt-get"
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		as_root sh -c 'printf "#!/bin/sh\nexit 101\n" >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d' ||
			die "need root (or passwordless sudo) to install ${pkgs[*]}"
		made_policy=1
	fi
	local rc=0
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2 ||
		{ as_root apt-get update -qq >&2 && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2; } ||
		rc=$?
	[[ $made_policy == 1 ]] && as_root rm -f /usr/sbin/policy-rc.d
	[[ $rc == 0 ]] || die "apt-get install ${pkgs[*]} failed (need root or passwordless sudo)"
}

NGINX=$(command -v nginx || echo /usr/sbin/nginx)
missing=()
has_server() { [[ " ${SERVERS[*]} " == *" $1 "* ]]; }
if ((${#SERVERS[@]})); then # BENCH_ONLY=reach needs neither nginx nor wrk
	has_server nginx && ! [[ -x $NGINX ]] && missing+=(nginx)
	command -v wrk >/dev/null || missing+=(wrk)
fi
CADDY=$(command -v caddy || echo /usr/bin/caddy)
if ((H3)) || has_server caddy; then
	[[ -x $CADDY ]] || missing+=(caddy)
fi
command -v taskset >/dev/null || missing+=(util-linux)
command -v openssl >/dev/null || missing+=(openssl)
if ((REACH)); then
	command -v jq >/dev/null || missing+=(jq)
fi
if ((${#missing[@]})); then
	install_pkgs "${missing[@]}"
	NGINX=$(command -v nginx || echo /usr/sbin/nginx)
	CADDY=$(command -v caddy || echo /usr/bin/caddy)
fi
if has_server nginx; then
	[[ -x $NGINX ]] || die "nginx not found after install"
fi
if ((H3)) || has_server caddy; then
	[[ -x $CADDY ]] || die "caddy not found after install"
fi

NCPU=$(nproc)
if ((NCPU >= 2)); then
	SERVER_CPU=0 LOAD_CPU=1
else
	SERVER_CPU=0 LOAD_CPU=0
	log "warning: one core only; server and load generator share it"
fi

# 1,000 idle WebSockets are 2,000 descriptors in the front (client + upstream leg);
# the scale block wants one per socket in the broker and in loadgen (10,000
# hosts + 50,000 streams with BENCH_SCALE_FULL=1).
ulimit -n 131072 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
(($(ulimit -n) >= 4 * IDLE_CONNS)) || die "ulimit -n $(ulimit -n) is too low for $IDLE_CONNS idle WebSockets"

# ------------------------------------------------------------------ processes

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

WORK=$(mktemp -d /tmp/securelink-bench.XXXXXX)
chmod 711 "$WORK" # nginx workers run as an unprivileged user when started by root
BG_PIDS=()
FAILED=0

descendants() {
	local p c
	for p in "$@"; do
		for c in $(pgrep -P "$p" 2>/dev/null); do
			echo "$c"
			descendants "$c"
		done
	done
}

cleanup() {
	local rc=$? pid all=()
	trap - EXIT INT TERM
	for pid in "${BG_PIDS[@]}"; do
		all+=("$pid" $(descendants "$pid"))
	done
	stop_pids "${all[@]}"
	if [[ -d $WORK ]]; then
		mkdir -p "$RESULTS/logs"
		cp -f "$WORK"/*.log "$WORK"/nginx/*.log "$WORK"/caddy/*.log "$RESULTS/logs/" 2>/dev/null || true
		rm -rf "$WORK"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------ build

mkdir -p "$RESULTS"
log "building bench/loadgen"
CGO_ENABLED=0 $GO build -trimpath -o "$WORK/loadgen" ./bench/loadgen
LG=$WORK/loadgen
# Load side: every client and the upstream on the other core.
load() { taskset -c "$LOAD_CPU" "$@"; }

PPROF_NOTE="" PPROF_BUILD=""
if [[ $PPROF == 1 ]]; then
	if command -v perf >/dev/null; then
		# `make build` strips symbols (-s -w); perf needs them. Same code otherwise.
		log "BENCH_PPROF=1: building an unstripped front for perf"
		CGO_ENABLED=0 $GO build -trimpath -o "$WORK/securelink-sym" ./cmd/securelink
		FRONT_BIN=$WORK/securelink-sym PPROF_BUILD=1
	else
		PPROF=0
		PPROF_NOTE="BENCH_PPROF=1 asked, but perf is not installed (apt-get install linux-perf): no profile taken"
	fi
fi
[[ ( " ${SERVERS[*]} " != *" front "* && $REACH == 0 && $SCALE == 0 ) || -x $FRONT_BIN ]] || die "$FRONT_BIN missing: run make build"

# The HTTP/3 servers (front, Caddy) also take their TCP port's number on UDP.
read -r UP_PORT FRONT_PORT NGINX_PORT BROKER_PORT RFRONT_PORT CADDY_PORT ROFF_PORT BMETRICS_PORT SCALE_PORT SMETRICS_PORT < <("$LG" freeports -n 10)

# ------------------------------------------------------------------ upstream

log "starting upstream on 127.0.0.1:$UP_PORT (core $LOAD_CPU)"
load "$LG" upstream -listen "127.0.0.1:$UP_PORT" >"$WORK/upstream.log" 2>&1 &
UP_PID=$!
BG_PIDS+=($UP_PID)
"$LG" waitport -addr "127.0.0.1:$UP_PORT" -timeout 20s

# ------------------------------------------------------------------ front

declare -A PID URL PIN
H3_FRONT=$H3 H3_NOTE=""
start_front() {
	local h3=false
	((H3_FRONT)) && h3=true
	cat >"$WORK/front.yaml" <<EOF
listen: "127.0.0.1:$FRONT_PORT"
advertise: "127.0.0.1"
state_dir: "$WORK/state"
http3: $h3
upstreams:
  relay: "http://127.0.0.1:$UP_PORT"
  api: "http://127.0.0.1:$UP_PORT"
  dashboard: "http://127.0.0.1:$UP_PORT"
log: {level: warn, format: json}
EOF
	log "starting front on 127.0.0.1:$FRONT_PORT (core $SERVER_CPU, http3: $h3)"
	taskset -c "$SERVER_CPU" "$FRONT_BIN" serve --config "$WORK/front.yaml" >"$WORK/front.out" 2>"$WORK/front.log" &
	PID[front]=$!
	BG_PIDS+=(${PID[front]})
	local i line=""
	for i in $(seq 1 300); do
		line=$(grep -m1 '^listening ' "$WORK/front.out" 2>/dev/null || true)
		[[ -n $line ]] && break
		kill -0 "${PID[front]}" 2>/dev/null || break
		sleep 0.1
	done
	if [[ -z $line ]] && ((H3_FRONT)) && grep -q 'HTTP/3 is not supported yet' "$WORK/front.log" 2>/dev/null; then
		# A build whose daemon does not run HTTP/3 yet: TCP figures only.
		H3_FRONT=0 H3_NOTE="this securelink build refuses http3: true: no front HTTP/3 figures"
		log "$H3_NOTE"
		start_front
		return
	fi
	if [[ -z $line ]]; then
		tail -n 20 "$WORK/front.log" >&2 || true
		die "front did not print its listening line within 30 s"
	fi
	# listening <addr> authority <host:port> pin sha256/<b64>
	PIN[front]=$(awk '{print $6}' <<<"$line")
	URL[front]="127.0.0.1:$FRONT_PORT"
	log "front: $line"
}

# ------------------------------------------------------------------ nginx

# server_key SERVER DIR: DIR/cert.pem and DIR/key.pem (0600) for a peer
# server: the front's identity split in two, so both hold the same key; with
# no front (BENCH_ONLY=nginx) a throwaway P-256 key of the same kind.
server_key() {
	local s=$1 dir=$2 ident="$WORK/state/identity.pem"
	if [[ -n ${PIN[front]:-} ]]; then
		[[ -r $ident ]] || die "$ident not found"
		(umask 077 && awk '/-----BEGIN CERTIFICATE-----/,/-----END CERTIFICATE-----/' "$ident" >"$dir/cert.pem" &&
			awk '/-----BEGIN .*PRIVATE KEY-----/,/-----END .*PRIVATE KEY-----/' "$ident" >"$dir/key.pem")
		PIN[$s]=${PIN[front]}
	else
		(umask 077 && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
			-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null)
		PIN[$s]="sha256/$(openssl x509 -in "$dir/cert.pem" -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64)"
	fi
	[[ -s $dir/cert.pem && -s $dir/key.pem ]] || die "could not split $ident into certificate and key"
}

start_nginx() {
	local nd="$WORK/nginx"
	mkdir -p "$nd/tmp"
	chmod 711 "$nd"
	server_key nginx "$nd"
	cat >"$nd/nginx.conf" <<EOF
# Generated by bench/run.sh: nginx as the front's equivalent, for comparison.
worker_processes 1;
worker_rlimit_nofile 16384;
pid $nd/nginx.pid;
error_log $nd/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $nd/tmp/body;
    proxy_temp_path $nd/tmp/proxy;
    fastcgi_temp_path $nd/tmp/fastcgi;
    uwsgi_temp_path $nd/tmp/uwsgi;
    scgi_temp_path $nd/tmp/scgi;
    # Go's http.Server has no per-connection request cap; nginx's default of
    # 1000 would force fresh handshakes into the keep-alive GET figure.
    keepalive_requests 100000000;
    keepalive_timeout 120s;

    upstream hermes {
        server 127.0.0.1:$UP_PORT;
        keepalive 64;
        keepalive_requests 100000000;
    }

    server {
        listen 127.0.0.1:$NGINX_PORT ssl;
        ssl_certificate $nd/cert.pem;
        ssl_certificate_key $nd/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_ecdh_curve X25519:prime256v1;

        location /api/ {
            proxy_pass http://hermes/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # Streamed like the front (never buffered whole), with the front's
            # 32 KiB copy buffer rather than nginx's 4 KiB page default.
            proxy_buffering off;
            proxy_buffer_size 32k;
            proxy_buffers 4 32k;          # unused with buffering off; nginx
            proxy_busy_buffers_size 64k;  # validates them against the above
        }
        location = /relay/health {
            proxy_pass http://hermes/health;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
        location = /relay/ws {
            proxy_pass http://hermes/ws;
            proxy_http_version 1.1;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
        }
        location / { return 404; }
    }
}
EOF
	"$NGINX" -t -q -p "$nd/" -c "$nd/nginx.conf" -e "$nd/error.log" -g 'daemon off;' ||
		die "nginx rejected its configuration (see above)"
	log "starting nginx on 127.0.0.1:$NGINX_PORT (1 worker, core $SERVER_CPU)"
	taskset -c "$SERVER_CPU" "$NGINX" -p "$nd/" -c "$nd/nginx.conf" -e "$nd/error.log" -g 'daemon off;' 2>>"$nd/error.log" &
	PID[nginx]=$!
	BG_PIDS+=(${PID[nginx]})
	"$LG" waitport -addr "127.0.0.1:$NGINX_PORT" -timeout 20s || die "nginx did not listen"
	URL[nginx]="127.0.0.1:$NGINX_PORT"
}

# ------------------------------------------------------------------ caddy

# Caddy, the second peer (and the HTTP/3 one): nginx's routes (/api/ with the
# prefix stripped, /relay/health, /relay/ws to the upstream's /ws), TCP and UDP
# on one loopback port, the front's key.
start_caddy() {
	local cd="$WORK/caddy"
	mkdir -p "$cd/data" "$cd/config"
	chmod 700 "$cd"
	server_key caddy "$cd"
	cat >"$cd/Caddyfile" <<EOF
# Generated by bench/run.sh: Caddy as the front's equivalent, for comparison.
{
	admin off
	auto_https off
	storage file_system $cd/data
	servers {
		protocols h1 h2 h3
	}
	log {
		output file $cd/caddy.log
		level WARN
	}
}
https://127.0.0.1:$CADDY_PORT {
	bind 127.0.0.1
	tls $cd/cert.pem $cd/key.pem
	handle_path /api/* {
		reverse_proxy 127.0.0.1:$UP_PORT
	}
	handle /relay/health {
		rewrite * /health
		reverse_proxy 127.0.0.1:$UP_PORT
	}
	handle /relay/ws {
		rewrite * /ws
		reverse_proxy 127.0.0.1:$UP_PORT
	}
	handle {
		respond 404
	}
}
EOF
	HOME=$cd XDG_DATA_HOME=$cd/data XDG_CONFIG_HOME=$cd/config \
		"$CADDY" validate --config "$cd/Caddyfile" --adapter caddyfile >"$cd/validate.log" 2>&1 ||
		{ tail -n 5 "$cd/validate.log" >&2; die "caddy rejected its configuration"; }
	log "starting caddy on 127.0.0.1:$CADDY_PORT (TCP + UDP, core $SERVER_CPU)"
	HOME=$cd XDG_DATA_HOME=$cd/data XDG_CONFIG_HOME=$cd/config \
		taskset -c "$SERVER_CPU" "$CADDY" run --config "$cd/Caddyfile" --adapter caddyfile >"$cd/stdout.log" 2>&1 &
	PID[caddy]=$!
	BG_PIDS+=(${PID[caddy]})
	"$LG" waitport -addr "127.0.0.1:$CADDY_PORT" -timeout 20s || die "caddy did not listen"
	URL[caddy]="127.0.0.1:$CADDY_PORT"
}

for s in "${SERVERS[@]}"; do
	case $s in
	front) start_front ;;
	nginx) start_nginx ;;
	caddy) start_caddy ;;
	esac
done
H3_SERVERS=()
if ((H3)); then
	((H3_FRONT)) && H3_SERVERS+=(front)
	H3_SERVERS+=(caddy)
fi
# The same key on every side is what makes the handshake figure comparable.
for s in nginx caddy; do
	if [[ -n ${PIN[front]:-} && -n ${PIN[$s]:-} ]]; then
		[[ ${PIN[front]} == "${PIN[$s]}" ]] || die "front and $s pins differ"
	fi
done

# Sanity: each server must answer the routes the figures use.
for s in "${SERVERS[@]}"; do
	for path in /api/small /api/big /relay/health; do
		out=$("$LG" get -url "https://${URL[$s]}$path" -pin "${PIN[$s]}") || die "$s $path: request failed"
		[[ $out == status=200* ]] || die "$s $path: $out"
	done
done
for s in "${H3_SERVERS[@]}"; do
	for path in /api/small /api/big; do
		out=$("$LG" h3get -url "https://${URL[$s]}$path" -pin "${PIN[$s]}") || die "$s $path over HTTP/3: request failed"
		[[ $out == status=200*proto=HTTP/3* ]] || die "$s $path over HTTP/3: $out"
	done
done

# ------------------------------------------------------------------ measuring

LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)

declare -A R TLSINFO # R[<figure>.<server>] = value; TLSINFO[<server>] = version cipher curve
kv() { tr ' ' '\n' <<<"$2" | awk -F= -v k="$1" '$1 == k {print $2; exit}'; }
cpu_us() { kv cpu_us "$("$LG" proc -pids "${PID[$1]}")"; }

# wrk_run SERVER PATH CONNS -> "requests secs errors"
wrk_run() {
	local s=$1 path=$2 conns=$3 out
	load wrk -t1 -c"$conns" -d"${WARM}s" "https://${URL[$s]}$path" >/dev/null
	local c0 c1
	c0=$(cpu_us "$s")
	out=$(load wrk -t1 -c"$conns" -d"${DUR}s" --timeout 10s "https://${URL[$s]}$path")
	c1=$(cpu_us "$s")
	printf '%s\n' "$out" >>"$WORK/wrk.log"
	awk -v c0="$c0" -v c1="$c1" '
		function secs(t) { if (t ~ /ms$/) return substr(t,1,length(t)-2)/1000;
		                   if (t ~ /us$/) return substr(t,1,length(t)-2)/1e6;
		                   if (t ~ /m$/)  return substr(t,1,length(t)-1)*60;
		                   if (t ~ /s$/)  return substr(t,1,length(t)-1); return t }
		/ requests in / { n=$1; t=$4; sub(/,$/,"",t); d=secs(t) }
		/Non-2xx/ { bad+=$NF }
		/Socket errors/ { gsub(/,/,""); bad+=$4+$6+$8+$10 }
		END { printf "%d %.3f %d %.0f\n", n, d, bad, c1-c0 }' <<<"$out"
}

fail() {
	log "$*"
	FAILED=1
}

# rate_of KEY SERVER N SECS CPU_US -> R[KEY_cpu.SERVER] µs/op, R[KEY_rps.SERVER] ops/s
rate_of() {
	R[$1_cpu.$2]=$(awk -v c="$5" -v n="$3" 'BEGIN{printf "%.1f", c/n}')
	R[$1_rps.$2]=$(awk -v n="$3" -v d="$4" 'BEGIN{printf "%.0f", n/d}')
}

# measure_rate KEY SERVER PATH LABEL: wrk at GET_CONNS on PATH, figures under KEY
measure_rate() {
	local s=$2 n d bad cpu
	read -r n d bad cpu < <(wrk_run "$s" "$3" "$GET_CONNS")
	((bad == 0)) || fail "$s $4: $bad errors or non-2xx responses"
	((n > 0)) || {
		fail "$s $4: no request completed"
		return
	}
	rate_of "$1" "$s" "$n" "$d" "$cpu"
}

measure_get() { measure_rate get "$1" /api/small "small GET"; }
measure_health() { measure_rate health "$1" /relay/health /relay/health; }

measure_download() {
	local s=$1 n d bad cpu
	read -r n d bad cpu < <(wrk_run "$s" /api/big 1)
	((bad == 0)) || fail "$s download: $bad errors or non-2xx responses"
	((n > 0)) || {
		fail "$s download: no download completed"
		return
	}
	R[dl_mbs.$s]=$(awk -v n="$n" -v d="$d" 'BEGIN{printf "%.0f", n*8388608/d/1e6}')
	R[dl_cpu.$s]=$(awk -v c="$cpu" -v n="$n" 'BEGIN{printf "%.0f", c/(n*8)}')
	R[dl_sgb.$s]=$(awk -v c="$cpu" -v n="$n" 'BEGIN{printf "%.3f", c/1e6/(n*8388608/1e9)}')
}

# measure_h3 SERVER PATH CONNS SIZE -> "ops secs cpu_us" over HTTP/3
measure_h3() {
	local s=$1 out
	out=$(load "$LG" h3 -url "https://${URL[$s]}$2" -pin "${PIN[$s]}" -conns "$3" -size "$4" \
		-duration "${DUR}s" -warmup "${WARM}s" -pids "${PID[$s]}") || {
		fail "$s HTTP/3 $2 failed"
		return 1
	}
	log "$s h3 $2 x$3: $out"
	(($(kv fail "$out") == 0)) || fail "$s HTTP/3 $2: $(kv fail "$out") failed requests"
	echo "$(kv ops "$out") $(kv secs "$out") $(kv cpu_us "$out")"
}

measure_h3_get() {
	local s=$1 n d cpu
	read -r n d cpu < <(measure_h3 "$s" /api/small "$GET_CONNS" 100) || return 0
	[[ -n $n ]] || return 0
	rate_of h3get "$s" "$n" "$d" "$cpu"
}

measure_h3_download() {
	local s=$1 n d cpu
	read -r n d cpu < <(measure_h3 "$s" /api/big 1 8388608) || return 0
	[[ -n $n ]] || return 0
	R[h3dl_mbs.$s]=$(awk -v n="$n" -v d="$d" 'BEGIN{printf "%.0f", n*8388608/d/1e6}')
	R[h3dl_cpu.$s]=$(awk -v c="$cpu" -v n="$n" 'BEGIN{printf "%.0f", c/(n*8)}')
}

measure_handshakes() {
	local s=$1 out
	out=$(load "$LG" handshakes -addr "${URL[$s]}" -pin "${PIN[$s]}" -conns "$HS_LOOPS" \
		-duration "${DUR}s" -warmup "${WARM}s" -pids "${PID[$s]}") || {
		fail "$s handshakes failed"
		return
	}
	log "$s handshakes: $out"
	R[hs_rate.$s]=$(printf '%.0f' "$(kv rate "$out")")
	R[hs_cpu.$s]=$(printf '%.0f' "$(kv cpu_per_op_us "$out")")
	TLSINFO[$s]="$(kv tls "$out") $(kv cipher "$out") $(kv curve "$out")"
	(($(kv fail "$out") == 0)) || fail "$s handshakes: $(kv fail "$out") failed"
}

measure_echo() {
	local s=$1 out
	out=$(load "$LG" echo -url "wss://${URL[$s]}/relay/ws" -pin "${PIN[$s]}" -conns 1 -size 1024 \
		-duration "${DUR}s" -warmup "${WARM}s" -pids "${PID[$s]}") || {
		fail "$s echo (1 conn) failed"
		return
	}
	log "$s echo x1: $out"
	R[echo_p50.$s]=$(printf '%.0f' "$(kv p50_us "$out")")
	R[echo_p99.$s]=$(printf '%.0f' "$(kv p99_us "$out")")
	out=$(load "$LG" echo -url "wss://${URL[$s]}/relay/ws" -pin "${PIN[$s]}" -conns "$ECHO_CONNS" -size 1024 \
		-duration "${DUR}s" -warmup "${WARM}s" -pids "${PID[$s]}") || {
		fail "$s echo ($ECHO_CONNS conns) failed"
		return
	}
	log "$s echo x$ECHO_CONNS: $out"
	R[echo_cpu.$s]=$(printf '%.1f' "$(kv cpu_per_op_us "$out")")
	R[echo_rate.$s]=$(printf '%.0f' "$(kv rate "$out")")
}

measure_idle() {
	local s=$1 out
	# 4 dials in flight: under the front's 5 unauthenticated sessions per
	# source (all come from 127.0.0.1), which a loaded machine would
	# otherwise hit with 429s; the same for every server.
	out=$(load "$LG" idle -url "wss://${URL[$s]}/relay/ws" -pin "${PIN[$s]}" -conns "$IDLE_CONNS" \
		-parallel 4 -settle "$SETTLE" -pids "${PID[$s]}") || {
		fail "$s idle WebSockets failed"
		return
	}
	log "$s idle: $out"
	R[idle_mib.$s]=$(printf '%.1f' "$(kv mib_per_1000 "$out")")
}

# profile_pass NAME CMD...: perf on the front while CMD runs (DUR seconds of load).
profile_pass() {
	local name=$1 data="$RESULTS/front-$1.perf.data" txt="$RESULTS/front-$1.perf.txt"
	shift
	log "profiling the front with perf during an extra $name pass (${DUR}s)"
	load perf record -q -F 999 -g -p "${PID[front]}" -o "$data" -- sleep "$DUR" 2>>"$WORK/perf.log" &
	local perf_pid=$!
	load "$@" >/dev/null || true
	if wait "$perf_pid" && [[ -s $data ]]; then
		# perf pads a column per unknown sort key with "-"; strip that.
		local clean='/^#/d; /^$/d; s/[[:space:]]+-[[:space:]]+-[[:space:]]*$//'
		{
			echo "== self CPU by symbol ($name, ${DUR} s)"
			perf report -i "$data" --stdio --no-children --sort symbol -g none --percent-limit 0.5 2>/dev/null | sed -E "$clean"
			echo
			echo "== inclusive CPU (children) by symbol, >= 1%"
			perf report -i "$data" --stdio --children --sort symbol -g none --percent-limit 1 2>/dev/null | sed -E "$clean"
		} >"$txt" || true
		PPROF_NOTE+="front CPU profile (perf, $name): $txt (raw: $data)."
		PPROF_NOTE+=$'\n  top self entries:\n'$(sed -n '2,9p' "$txt")$'\n'
	else
		PPROF_NOTE+="perf record failed for $name (see $RESULTS/logs/perf.log)"$'\n'
	fi
}

profile_front() {
	[[ $PPROF == 1 && -n ${PID[front]:-} ]] || return 0
	local u="https://${URL[front]}"
	profile_pass get wrk -t1 -c"$GET_CONNS" -d"${DUR}s" "$u/api/small"
	profile_pass health wrk -t1 -c"$GET_CONNS" -d"${DUR}s" "$u/relay/health"
	profile_pass download wrk -t1 -c1 -d"${DUR}s" "$u/api/big"
	profile_pass echo "$LG" echo -url "wss://${URL[front]}/relay/ws" -pin "${PIN[front]}" -conns "$ECHO_CONNS" -size 1024 \
		-duration "${DUR}s" -warmup 0s -pids "${PID[front]}"
	PPROF_NOTE=${PPROF_NOTE%$'\n'}
}

# Idle WebSockets first, on freshly started servers: heap freed by earlier
# figures would otherwise absorb part of the increase. Then interleaved per
# figure, so drift on the shared machine hits both servers alike.
# Rounds: every figure again (idle memory only in the first, on fresh
# servers); RR keeps each round's values, the table shows their median.
declare -A RR
for round in $(seq 1 "$ROUNDS"); do
	((${#SERVERS[@]})) || break
	for fig in "${FIGURES[@]}"; do
		[[ $fig == idle && $round -gt 1 ]] && continue
		for s in "${SERVERS[@]}"; do
			log "round $round/$ROUNDS, $fig: $s"
			"measure_$fig" "$s"
		done
		if [[ $fig == idle ]]; then sleep 1; fi # let the closed sockets drain before CPU figures
	done
	for k in "${!R[@]}"; do
		RR[$k]+="${RR[$k]:+ }${R[$k]}"
	done
	R=()
done
median() { tr ' ' '\n' <<<"$1" | sort -g | awk '{v[NR]=$1} END{if (NR) print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
for k in "${!RR[@]}"; do
	R[$k]=$(median "${RR[$k]}")
done
# The HTTP/3 block: both servers over HTTP/3, interleaved per figure (their
# TCP figures are the rounds' above).
if ((H3)); then
	for fig in h3_get h3_download; do
		for s in "${H3_SERVERS[@]}"; do
			log "$fig: $s"
			"measure_$fig" "$s"
		done
	done
fi
profile_front

# The Reach figures run after the front/nginx ones, with their own broker and
# front (bench/reach.sh); the servers above stay idle meanwhile.
if ((REACH || SCALE)); then
	source "$ROOT/bench/reach.sh" # scale.sh uses its broker helpers
fi
if ((REACH)); then
	reach_run
fi
# The broker at scale, with a broker of its own, after everything else.
if ((SCALE)); then
	source "$ROOT/bench/scale.sh"
	scale_run
fi

# ------------------------------------------------------------------ table

CMD="bench/run.sh"
[[ -n ${MAKELEVEL:-} ]] && CMD="make bench"
ENVS=""
for v in BENCH_QUICK BENCH_PPROF BENCH_ONLY BENCH_SCALE_FULL BENCH_SCALE_LEVELS BENCH_SCALE_HOSTS BENCH_SCALE_KEEPALIVE; do
	[[ -n ${!v:-} ]] && ENVS+="$v=${!v} "
done
CPU_MODEL=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
NGINX_V="" NGINX_SSL="" CADDY_V=""
if ((H3)) || has_server caddy; then CADDY_V=$("$CADDY" version 2>/dev/null | awk '{print $1; exit}'); fi
if has_server nginx; then
	NGINX_V=$("$NGINX" -v 2>&1 | sed 's/^nginx version: //')
	NGINX_SSL=$("$NGINX" -V 2>&1 | sed -n 's/^built with //p' | head -n1)
fi
# The binary's own version: BIN= may be a build of another tree.
FRONT_V=$("$FRONT_BIN" version 2>/dev/null | awk '{print $NF; exit}')
[[ -n $FRONT_V ]] || FRONT_V=$(git describe --always --dirty 2>/dev/null || echo unknown)

ratio() {
	awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "" || b == "" || a !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b+0 == 0) print "-"; else printf "%.2fx", a/b }'
}
# printf pads by bytes; "µ" is two, so widen the field by the difference.
pad() { local b c; b=$(printf %s "$1" | LC_ALL=C wc -c); c=$(printf %s "$1" | LC_ALL=C.UTF-8 wc -m); echo $(($2 + b - c)); }
row() { # label key better [peer, default nginx]: the HTTP/3 block's two-column row
	local p=${4:-nginx}
	local f=${R[$2.front]:-} n=${R[$2.$p]:-}
	printf "%-$(pad "$1" 44)s %10s %10s %11s   %s\n" "$1" "${f:--}" "${n:--}" "$(ratio "$f" "$n")" "$3"
}
# row3 label key better [goal]: front, nginx, caddy, both ratios, and the
# verdict against the better peer of this run when goal is set.
row3() {
	local f=${R[$2.front]:-} n=${R[$2.nginx]:-} c=${R[$2.caddy]:-} verdict=""
	if [[ -n ${4:-} && -n $f ]]; then
		verdict=$(awk -v f="$f" -v n="$n" -v c="$c" -v better="$3" 'BEGIN{
			best=""; who="";
			if (n != "") { best=n; who="nginx" }
			if (c != "" && (best == "" || (better == "lower" ? c+0 < best+0 : c+0 > best+0))) { best=c; who="caddy" }
			if (best == "") exit;
			ok = (better == "lower") ? (f+0 <= best+0) : (f+0 >= best+0);
			printf "%s vs %s: %s", (ok ? "met" : "MISSED"), who, (best+0 == 0 ? "-" : sprintf("%.2fx", f/best)) }')
	fi
	printf "%-$(pad "$1" 46)s %9s %9s %9s %8s %8s  %-6s %s\n" "$1" "${f:--}" "${n:--}" "${c:--}" \
		"$(ratio "$f" "$n")" "$(ratio "$f" "$c")" "$3" "$verdict"
}
# busy SERVER RATE_KEY CPU_EACH_KEY [scale]: share of the server core a rate used,
# to tell a server-bound figure from a client-bound one.
busy() {
	local r=${R[$2.$1]:-} c=${R[$3.$1]:-}
	[[ -n $r && -n $c ]] || return 0
	awk -v r="$r" -v c="$c" -v k="${4:-1}" -v s="$1" 'BEGIN{printf "%s %.0f%%", s, r*c*k/1e4}'
}
busy_line() { # label rate_key cpu_key [scale]
	local s parts=()
	for s in "${SERVERS[@]}"; do
		local b
		b=$(busy "$s" "$2" "$3" "${4:-1}")
		[[ -n $b ]] && parts+=("$b")
	done
	((${#parts[@]})) && echo "  $1: $(IFS=,; echo "${parts[*]}" | sed 's/,/, /g')"
	true
}
# spread KEY SERVER: "min-max" over the rounds, for the notes.
spread() {
	local v=${RR[$1.$2]:-}
	[[ $v == *" "* ]] || return 0
	tr ' ' '\n' <<<"$v" | sort -g | awk -v s="$2" 'NR==1{lo=$1} {hi=$1} END{printf "%s %s-%s", s, lo, hi}'
}
spread_line() { # label key
	local s parts=()
	for s in "${SERVERS[@]}"; do
		local b
		b=$(spread "$2" "$s")
		[[ -n $b ]] && parts+=("$b")
	done
	((${#parts[@]})) && echo "  $1: $(IFS=,; echo "${parts[*]}" | sed 's/,/, /g')"
	true
}
LOADAVG_END=$(cut -d' ' -f1-3 /proc/loadavg)

{
	echo "securelink bench — $(date -u +%Y-%m-%dT%H:%M:%SZ), $MODE, $ROUNDS round(s), medians"
	echo "command:  ${ENVS}$CMD"
	echo "go:       $($GO version)"
	echo "binary:   securelink $FRONT_V ($FRONT_BIN${PPROF_BUILD:+, unstripped build for perf})"
	echo "load:     loadavg at start $LOADAVG_START, at end $LOADAVG_END (this bench itself adds ~2)"
	if ((${#SERVERS[@]} == 0)); then
		echo "cpu:      $CPU_MODEL, $NCPU cores"
	elif [[ $ONLY == h3 ]]; then
		echo "cpu:      $CPU_MODEL, $NCPU cores; server on core $SERVER_CPU, load generator + upstream on core $LOAD_CPU"
	else
		[[ -n $NGINX_V ]] && echo "nginx:    $NGINX_V ($NGINX_SSL)"
		[[ -n $CADDY_V ]] && has_server caddy && echo "caddy:    $CADDY_V (Debian package)"
		echo "wrk:      $(wrk -v 2>&1 | head -n1 | awk '{print $2}')"
		echo "cpu:      $CPU_MODEL, $NCPU cores; server on core $SERVER_CPU, load generator + upstream on core $LOAD_CPU"
		for s in "${SERVERS[@]}"; do
			[[ -n ${TLSINFO[$s]:-} ]] && echo "tls:      $s negotiated ${TLSINFO[$s]} with the Go client (P-256 ECDSA key)"
		done
		echo
		printf "%-46s %9s %9s %9s %8s %8s  %-6s %s\n" "figure" "front" "nginx" "caddy" "f/nginx" "f/caddy" "better" "goal (front vs the better peer)"
		row3 "small GET: server CPU µs/request (32 conns)" get_cpu lower goal
		row3 "small GET: requests/s" get_rps higher
		row3 "/relay/health: server CPU µs/request (32 c.)" health_cpu lower goal
		row3 "/relay/health: requests/s" health_rps higher
		row3 "8 MiB download: MB/s (1 conn)" dl_mbs higher goal
		row3 "8 MiB download: server CPU s/GB" dl_sgb lower goal
		row3 "8 MiB download: server CPU µs/MiB" dl_cpu lower
		row3 "new TLS handshakes/s (ECDSA P-256, X25519)" hs_rate higher
		row3 "TLS handshake: server CPU µs each" hs_cpu lower goal
		row3 "/relay/ws 1 KiB echo p50 µs (1 conn)" echo_p50 lower goal
		row3 "/relay/ws 1 KiB echo p99 µs (1 conn)" echo_p99 lower
		row3 "/relay/ws echo: server CPU µs/echo (32 conns)" echo_cpu lower goal
		row3 "/relay/ws echoes/s (32 conns)" echo_rate higher
		row3 "RSS MiB per 1,000 idle /relay/ws" idle_mib lower goal
		echo
		echo "notes:"
		echo "- each figure is the median of $ROUNDS round(s); rounds run every figure on every server in"
		echo "  turn (front, nginx, caddy), so drift on the shared machine hits all alike. Idle memory is"
		echo "  measured in the first round only, on freshly started servers."
		echo "- server CPU = utime+stime from /proc of every server process (nginx master + worker) over"
		echo "  the measured window; ${DUR} s per figure after ${WARM} s warm-up; RSS = VmRSS increase after"
		echo "  $IDLE_CONNS authenticated idle WebSockets and $SETTLE settling."
		echo "- HTTP figures: wrk -t1 over HTTP/1.1 keep-alive (100-byte /api/small and /relay/health with"
		echo "  $GET_CONNS conns; /api/big with 1 conn). The front answers /relay/health itself (cached"
		echo "  probes); nginx and Caddy proxy it to the upstream's /health. Handshakes and WebSockets:"
		echo "  bench/loadgen, X25519 only, no session resumption, pin checked in VerifyConnection;"
		echo "  $HS_LOOPS handshake loops."
		echo "- /relay/ws: front = the bridge to the upstream /ws (frames forwarded after auth.ok); nginx"
		echo "  and Caddy = byte-level WebSocket proxies to the same /ws. All do the Relay auth exchange first."
		echo "- nginx: worker_processes 1, TLSv1.2+1.3, ssl_ecdh_curve X25519:prime256v1, upstream"
		echo "  keepalive 64, proxy_buffering off + proxy_buffer_size 32k on /api/ (the front streams"
		echo "  with 32 KiB buffers), default buffers on /relay/ws, keepalive_requests raised, access_log off."
		echo "- caddy: reverse_proxy with its defaults (streams, keep-alive upstream pool), admin off,"
		echo "  logs at WARN, no access log; GOMAXPROCS 1 from the core pinning, like the front."
		echo "- server core busy during the rate figures (below ~95%: the client core was the limit,"
		echo "  so compare the CPU-per-operation rows):"
		busy_line "small GET" get_rps get_cpu
		busy_line "health" health_rps health_cpu
		busy_line "download" dl_mbs dl_cpu 0.953674
		busy_line "handshakes" hs_rate hs_cpu
		busy_line "echo x$ECHO_CONNS" echo_rate echo_cpu
		if ((ROUNDS > 1)); then
			echo "- spread over the rounds (min-max):"
			spread_line "small GET µs/req" get_cpu
			spread_line "health µs/req" health_cpu
			spread_line "download s/GB" dl_sgb
			spread_line "handshake µs" hs_cpu
			spread_line "echo p50 µs" echo_p50
			spread_line "echo µs/echo" echo_cpu
		fi
		echo "- ratio = front/peer in this run. The machine may be shared: rates swing between runs,"
		echo "  CPU per operation is the steadier comparison."
		[[ -n $PPROF_NOTE ]] && printf -- '- %s\n' "$PPROF_NOTE"
	fi
	if ((H3)); then
		echo
		echo "HTTP/3 — caddy $CADDY_V (Debian package) as the peer: TCP and UDP on one port, the front's key"
		printf '%-44s %10s %10s %11s   %s\n' "figure" "front" "caddy" "front/caddy" "better"
		row "small GET, TCP: server CPU µs/request" get_cpu lower caddy
		row "small GET, HTTP/3: server CPU µs/request" h3get_cpu lower caddy
		row "small GET, TCP: requests/s" get_rps higher caddy
		row "small GET, HTTP/3: requests/s" h3get_rps higher caddy
		row "8 MiB download, TCP: MB/s" dl_mbs higher caddy
		row "8 MiB download, HTTP/3: MB/s" h3dl_mbs higher caddy
		row "8 MiB download, TCP: server CPU µs/MiB" dl_cpu lower caddy
		row "8 MiB download, HTTP/3: server CPU µs/MiB" h3dl_cpu lower caddy
		echo
		echo "notes:"
		echo "- TCP rows: wrk -t1 over HTTP/1.1 keep-alive. HTTP/3 rows: loadgen h3 (quic-go"
		echo "  client, pinned, one request in flight per QUIC connection): small GET with $GET_CONNS"
		echo "  connections, 8 MiB download with 1; every answer checked for status 200 and its length."
		echo "- front: http3: true (ServeQUIC on the listen address). Caddy: protocols h1 h2 h3,"
		echo "  handle_path /api/* -> reverse_proxy (which streams), admin off, logs at WARN."
		busy_h3=()
		for s in "${H3_SERVERS[@]}"; do
			b=$(busy "$s" h3get_rps h3get_cpu)
			[[ -n $b ]] && busy_h3+=("$b")
		done
		((${#busy_h3[@]})) && echo "- server core busy during the HTTP/3 small GET: $(IFS=,; echo "${busy_h3[*]}" | sed 's/,/, /g')"
		[[ -n $H3_NOTE ]] && echo "- $H3_NOTE"
	fi
	if ((REACH)); then
		echo
		reach_table
	fi
	if ((SCALE)); then
		echo
		scale_table
	fi
	if [[ $FAILED == 1 ]]; then
		echo "- SOME FIGURES FAILED (see the [bench] lines on stderr and bench/results/logs/)."
	fi
	true
} | tee "$WORK/table.txt"
cp "$WORK/table.txt" "$RESULTS/latest.txt"
log "table written to bench/results/latest.txt"
exit "$FAILED"

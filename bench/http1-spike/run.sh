#!/usr/bin/env bash
# `make bench-http1`: server CPU per small GET (wrk -t1 -c32, HTTP/1.1
# keep-alive, 100-byte /api/small) of the front, nginx, fasthttp as a
# reverse proxy, and fasthttp, net/http and nginx answering the 100 bytes
# themselves (a proxy minus its own server answering alone is its upstream
# leg): what serving HTTP/1.1 outside net/http could win
# (docs/decisions.md). Servers on core 0, wrk and the upstream on core 1,
# interleaved rounds, medians. Needs `make build`, wrk, nginx, openssl.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=${BENCH_ROUNDS:-3} DUR=${BENCH_DUR:-5}
W=$(mktemp -d /tmp/securelink-http1-spike.XXXXXX)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
mkdir -p "$W/state" "$W/nginx/tmp" && chmod 700 "$W/state"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
FRONT=$ROOT/bin/securelink
[[ -x $FRONT ]] || { echo "run make build first" >&2; exit 1; }
(cd "$ROOT" && CGO_ENABLED=0 "$GO" build -trimpath -o "$W/loadgen" ./bench/loadgen)
(cd "$ROOT/bench/http1-spike" && CGO_ENABLED=0 "$GO" build -trimpath -o "$W/spike" .)
LG=$W/loadgen
read -r UP P_FRONT P_NGINX P_FHPROXY P_FHSTATIC P_NHSTATIC < <("$LG" freeports -n 6)
taskset -c 1 "$LG" upstream -listen "127.0.0.1:$UP" >/dev/null 2>&1 & PIDS+=($!)
"$LG" waitport -addr "127.0.0.1:$UP" -timeout 20s
cat >"$W/front.yaml" <<Y
listen: "127.0.0.1:$P_FRONT"
advertise: "127.0.0.1"
state_dir: "$W/state"
upstreams: {relay: "http://127.0.0.1:$UP", api: "http://127.0.0.1:$UP", dashboard: "http://127.0.0.1:$UP"}
log: {level: warn, format: json}
Y
taskset -c 0 "$FRONT" serve --config "$W/front.yaml" >/dev/null 2>"$W/front.log" & PIDS+=($!); PID_FRONT=$!
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$W/nginx/key.pem" \
	-out "$W/nginx/cert.pem" -days 1 -subj /CN=http1-spike >/dev/null 2>&1
N=$W/nginx
BODY100=$(printf 'x%.0s' $(seq 100)) # nginx answering the same 100 bytes itself
cat >"$N/nginx.conf" <<C
worker_processes 1; pid $N/nginx.pid; error_log $N/error.log warn;
events { worker_connections 8192; }
http {
  access_log off; keepalive_requests 100000000; keepalive_timeout 120s;
  client_body_temp_path $N/tmp/b; proxy_temp_path $N/tmp/p; fastcgi_temp_path $N/tmp/f;
  uwsgi_temp_path $N/tmp/u; scgi_temp_path $N/tmp/s;
  upstream hermes { server 127.0.0.1:$UP; keepalive 64; keepalive_requests 100000000; }
  server {
    listen 127.0.0.1:$P_NGINX ssl; ssl_certificate $N/cert.pem; ssl_certificate_key $N/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3; ssl_ecdh_curve X25519:prime256v1;
    location /api/ { proxy_pass http://hermes/; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
    location = /static/small { default_type application/octet-stream; return 200 "$BODY100"; }
  }
}
C
taskset -c 0 nginx -c "$N/nginx.conf" -g 'daemon off;' 2>/dev/null & PIDS+=($!); PID_NGINX=$!
taskset -c 0 "$W/spike" -mode proxy-fasthttp -listen "127.0.0.1:$P_FHPROXY" -up "127.0.0.1:$UP" & PIDS+=($!); PID_FHPROXY=$!
taskset -c 0 "$W/spike" -mode static-fasthttp -listen "127.0.0.1:$P_FHSTATIC" & PIDS+=($!); PID_FHSTATIC=$!
taskset -c 0 "$W/spike" -mode static-nethttp -listen "127.0.0.1:$P_NHSTATIC" 2>/dev/null & PIDS+=($!); PID_NHSTATIC=$!
for p in "$P_FRONT" "$P_NGINX" "$P_FHPROXY" "$P_FHSTATIC" "$P_NHSTATIC"; do "$LG" waitport -addr "127.0.0.1:$p" -timeout 20s; done

# cpu_us PID: utime+stime of PID and its descendants (nginx's worker), µs
cpu_us() { "$LG" proc -pids "$1" | tr ' ' '\n' | sed -n 's/^cpu_us=//p'; }
names=(front nginx fasthttp-proxy fasthttp-static nethttp-static nginx-static)
ports=("$P_FRONT" "$P_NGINX" "$P_FHPROXY" "$P_FHSTATIC" "$P_NHSTATIC" "$P_NGINX")
paths=(/api/small /api/small /api/small /api/small /api/small /static/small)
pids=("$PID_FRONT" "$PID_NGINX" "$PID_FHPROXY" "$PID_FHSTATIC" "$PID_NHSTATIC" "$PID_NGINX")
declare -A got
echo "http1-spike — $(date -u +%FT%TZ), $ROUNDS round(s) of ${DUR}s, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
	for i in "${!names[@]}"; do
		u="https://127.0.0.1:${ports[$i]}${paths[$i]}"
		taskset -c 1 wrk -t1 -c32 -d1s "$u" >/dev/null
		c0=$(cpu_us "${pids[$i]}")
		out=$(taskset -c 1 wrk -t1 -c32 -d"${DUR}s" "$u")
		c1=$(cpu_us "${pids[$i]}")
		n=$(awk '/ requests in /{print $1}' <<<"$out")
		bad=$(awk '/Non-2xx/{print $NF}' <<<"$out")
		[[ -z $bad && $n -gt 0 ]] || { echo "${names[$i]}: errors (${bad:-no requests})" >&2; exit 1; }
		us=$(awk -v a="$c0" -v b="$c1" -v n="$n" 'BEGIN{printf "%.1f", (b-a)/n}')
		got[${names[$i]}]+="$us "
		echo "round $r ${names[$i]} $us µs/request"
	done
done
med() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
ng=$(med "${got[nginx]}")
printf '\n%-18s %10s %10s\n' server "µs/req" "/nginx"
for s in "${names[@]}"; do m=$(med "${got[$s]}"); printf '%-18s %10s %9.2fx\n' "$s" "$m" "$(awk -v a="$m" -v b="$ng" 'BEGIN{print a/b}')"; done

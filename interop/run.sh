#!/usr/bin/env bash
# `make interop REF=<checkout of Codename-11/hermes-relay>`: Reach interop
# between securelink and the Python reference, on 127.0.0.1 only.
#
#   (a) reference broker  <- our connector (securelink serve, reach enabled)
#                         <- our client (securelink connect + curl --pinnedpubkey)
#   (b) our broker        <- reference connector (a minimal harness, forwarding
#                            to our front) <- our client
#
# Each direction prints PASS or FAIL with the reason; extra checks (spent
# bootstrap, route credential handoff, bulk transfer both ways) are printed
# under it. Nothing of the reference is copied: it is imported from REF at
# run time by interop/refshim.py. Not part of `make test` / .ci/run: no
# registry carries the reference.
#
# Needs: python3 with aiohttp (Debian: python3-aiohttp; installed with
# apt-get when missing and running as root), openssl, curl, jq, go.
# Logs: $INTEROP_LOGS (default /tmp/securelink-interop-logs).
set -euo pipefail
export LC_ALL=C

REF=${1:-${REF:-}}
[[ -n $REF ]] || {
	echo "usage: make interop REF=<path to a checkout of Codename-11/hermes-relay>" >&2
	exit 2
}
REF=$(cd "$REF" && pwd) || exit 2
cd "$(dirname "$0")/.."
ROOT=$PWD
GO=${GO:-go}
BIN=${BIN:-bin/securelink}
[[ $BIN == /* ]] || BIN=$ROOT/$BIN
PY=${INTEROP_PYTHON:-/usr/bin/python3}
LOGS=${INTEROP_LOGS:-/tmp/securelink-interop-logs}
DUR=${INTEROP_XFER_SECONDS:-2}

log() { printf '[interop] %s\n' "$*" >&2; }
die() {
	printf '[interop] error: %s\n' "$*" >&2
	exit 1
}

for f in plugin/rendezvous/server.py plugin/rendezvous/__main__.py plugin/relay/secure_link_connector.py; do
	[[ -f $REF/$f ]] || die "$REF/$f not found: REF must be a checkout of Codename-11/hermes-relay"
done
[[ -x $BIN ]] || die "$BIN missing: run make build"
for t in openssl curl jq; do
	command -v "$t" >/dev/null || die "$t is required"
done
if ! "$PY" -c 'import aiohttp' 2>/dev/null; then
	if [[ $(id -u) == 0 && $PY == /usr/bin/python3 ]]; then
		log "installing python3-aiohttp with apt-get"
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-aiohttp; } >&2 ||
			die "apt-get install python3-aiohttp failed"
	else
		die "$PY cannot import aiohttp (Debian: apt-get install python3-aiohttp)"
	fi
fi

WORK=$(mktemp -d /tmp/securelink-interop.XXXXXX)
chmod 700 "$WORK"
BG_PIDS=()

descendants() {
	local p c
	for p in "$@"; do
		for c in $(pgrep -P "$p" 2>/dev/null); do
			echo "$c"
			descendants "$c"
		done
	done
}

stop_pids() {
	local all=() pid i
	for pid in "$@"; do
		all+=("$pid" $(descendants "$pid"))
	done
	((${#all[@]})) || return 0
	kill -TERM "${all[@]}" 2>/dev/null || true
	for i in $(seq 1 50); do
		kill -0 "${all[@]}" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "${all[@]}" 2>/dev/null || true
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_pids "${BG_PIDS[@]}"
	wait 2>/dev/null || true
	rm -rf "$LOGS"
	mkdir -p "$LOGS"
	cp -f "$WORK"/*.log "$LOGS/" 2>/dev/null || true
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "building bench/loadgen (fake Relay upstream and Reach client tools)"
CGO_ENABLED=0 $GO build -trimpath -o "$WORK/loadgen" ./bench/loadgen
LG=$WORK/loadgen
read -r UP_PORT REFB_PORT FRONT_A_PORT OURB_PORT FRONT_B_PORT CONN_A_PORT CONN_B_PORT < <("$LG" freeports -n 7)

# One self-signed certificate for 127.0.0.1 serves as both brokers' TLS
# identity and as the trust anchor our connector/client (ca_file / --ca-file)
# and the reference connector (its ssl context) are given.
(umask 077 && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
	-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
	-keyout "$WORK/broker.key" -out "$WORK/broker.crt" 2>/dev/null) || die "openssl failed"

"$LG" upstream -listen "127.0.0.1:$UP_PORT" >"$WORK/upstream.log" 2>&1 &
BG_PIDS+=($!)
"$LG" waitport -addr "127.0.0.1:$UP_PORT" -timeout 20s

# wait_line FILE PREFIX PID SECONDS: wait for a line starting with PREFIX.
wait_line() {
	local f=$1 prefix=$2 pid=$3 i
	for i in $(seq 1 $(($4 * 10))); do
		grep -q "^$prefix" "$f" 2>/dev/null && return 0
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# start_front NAME PORT [reach-yaml-block]: our front with the fake upstream.
start_front() {
	local name=$1 port=$2 reach=${3:-} d=$WORK/$1
	mkdir -p "$d"
	chmod 700 "$d"
	cat >"$d/front.yaml" <<EOF
listen: "127.0.0.1:$port"
advertise: "127.0.0.1"
state_dir: "$d/state"
upstreams:
  relay: "http://127.0.0.1:$UP_PORT"
  api: "http://127.0.0.1:$UP_PORT"
  dashboard: "http://127.0.0.1:$UP_PORT"
log: {level: debug, format: json}
$reach
EOF
	"$BIN" serve --config "$d/front.yaml" >"$d/front.out" 2>>"$WORK/$name-front.log" &
	FRONT_PID[$name]=$!
	BG_PIDS+=($!)
	wait_line "$d/front.out" "listening " $! 30 || {
		tail -n 20 "$WORK/$name-front.log" >&2
		return 1
	}
	# listening <addr> authority <host:port> pin sha256/<b64>
	awk '/^listening /{print $6; exit}' "$d/front.out" >"$d/pin"
}

admin() { # NAME METHOD PATH [BODY] -> JSON on stdout
	local d=$WORK/$1
	curl -sS --fail-with-body --max-time 30 --unix-socket "$d/state/admin.sock" -X "$2" \
		-H 'Content-Type: application/json' ${4:+--data "$4"} "http://admin$3"
}

# candidate BOOT_JSON IDENT_JSON OUT: the outbound_broker candidate of
# spec/reach.md for `securelink connect` (0600; the token stays in files).
candidate() {
	(umask 077 && jq -n --slurpfile b "$1" --slurpfile i "$2" '{
		role: "outbound_broker", priority: 1, recommended: false, experimental: true,
		security: "e2ee_pinned_tls",
		broker: {protocol_version: 1, url: $b[0].broker_url, host_id: $b[0].host_id,
		         credential_kind: "bootstrap", token: $b[0].token, expires_at: $b[0].expires_at},
		proxy: {url: $i[0].url, transport_hint: "https", pin_sha256: $i[0].pin_sha256,
		        cert_der: $i[0].cert_der, surfaces: ["relay", "api", "dashboard"]}}' >"$3")
}

# cred_from_boot BOOT_JSON OUT: the loadgen credential file for a bootstrap.
cred_from_boot() {
	(umask 077 && jq '{broker_url, host_id, credential_kind: "bootstrap", token}' "$1" >"$2")
}

# health_via_connect NAME CAND LISTEN_PORT FRONT_PORT PIN -> sets HEALTH_OUT, returns curl's status
health_via_connect() {
	local name=$1 cand=$2 lport=$3 fport=$4 pin=$5 pid
	"$BIN" connect --candidate "$cand" --listen "127.0.0.1:$lport" --ca-file "$WORK/broker.crt" --log-level debug \
		>"$WORK/$name-connect.out" 2>"$WORK/$name-connect.log" &
	pid=$!
	BG_PIDS+=($pid)
	wait_line "$WORK/$name-connect.out" "forwarding " "$pid" 20 || {
		HEALTH_OUT="securelink connect did not start: $(tail -n 3 "$WORK/$name-connect.log" | tr '\n' ' ')"
		return 1
	}
	curl_health "$lport" "$fport" "$pin"
}

# curl_health LISTEN_PORT FRONT_PORT PIN: GET /relay/health of the front,
# TLS pinned by curl, TCP through the local `securelink connect` listener.
curl_health() {
	local rc=0
	HEALTH_OUT=$(curl -sS --max-time 20 -k --pinnedpubkey "sha256//${3#sha256/}" \
		--connect-to "127.0.0.1:$2:127.0.0.1:$1" -w '\nHTTP %{http_code}' \
		"https://127.0.0.1:$2/relay/health" 2>&1) || rc=$?
	return $rc
}

declare -A FRONT_PID
RESULTS=()
FAILS=0
result() { # VERDICT LABEL REASON
	RESULTS+=("$1|$2|$3")
	[[ $1 == PASS ]] || FAILS=$((FAILS + 1))
	log "$1 $2: $3"
}

# xfer_check LABEL CRED MODE FRONT_PORT PIN: 8 MiB transfers back to back
# on one stream for $DUR s, each checked byte for byte.
xfer_check() {
	local label=$1 out rc=0
	out=$("$LG" xfer -mode "$3" -addr "127.0.0.1:$4" -pin "$5" -reach "$2" -ca-file "$WORK/broker.crt" \
		-duration "${DUR}s" -warmup 0s 2>"$WORK/xfer.err") || rc=$?
	{
		echo "$label: ${out:-exit $rc}"
		cat "$WORK/xfer.err"
	} >>"$WORK/loadgen.log"
	if ((rc != 0)); then
		result FAIL "$label" "$(tail -n 1 "$WORK/xfer.err" | cut -c1-300)"
	elif [[ $(tr ' ' '\n' <<<"$out" | sed -n 's/^cut=//p') != 0 ]]; then
		result FAIL "$label" "stream cut after $(tr ' ' '\n' <<<"$out" | sed -n 's/^transfers=//p') x 8 MiB: $(sed -n 's/.* error=//p' <<<"$out")"
	else
		result PASS "$label" "$(tr ' ' '\n' <<<"$out" | awk -F= '$1=="transfers"{t=$2} $1=="mbs"{m=$2} END{printf "%s x 8 MiB byte-exact on one stream, %s MB/s", t, m}')"
	fi
}

# ============================================================ (a)
direction_a() {
	local hid tok
	log "(a) reference broker on 127.0.0.1:$REFB_PORT (TLS, self-signed) + our connector + our client"
	# The reference reads the same hosts file format as ours
	# ({"hosts": {id: {"host_token_sha256": ...}}}): let our add-host write it.
	cat >"$WORK/addhost.yaml" <<EOF
listen: "127.0.0.1:$REFB_PORT"
tls: {cert_file: "$WORK/broker.crt", key_file: "$WORK/broker.key"}
hosts_file: "$WORK/ref-hosts.json"
state_file: "$WORK/unused-state.json"
EOF
	(umask 077 && "$BIN" broker add-host --config "$WORK/addhost.yaml" --json >"$WORK/a-host.json" 2>>"$WORK/a-admin.log") ||
		{ result FAIL "(a) setup" "securelink broker add-host failed"; return; }
	hid=$(jq -r .host_id "$WORK/a-host.json")
	(umask 077 && jq -r .host_token "$WORK/a-host.json" >"$WORK/a-host.token")

	"$PY" "$ROOT/interop/refshim.py" broker --ref "$REF" -- --credentials "$WORK/ref-hosts.json" \
		--state "$WORK/ref-state.json" --listen 127.0.0.1 --port "$REFB_PORT" \
		--tls-cert "$WORK/broker.crt" --tls-key "$WORK/broker.key" >"$WORK/a-refbroker.log" 2>&1 &
	local bpid=$!
	BG_PIDS+=($bpid)
	local i ok=0
	for i in $(seq 1 100); do
		curl -sS --max-time 2 --cacert "$WORK/broker.crt" "https://127.0.0.1:$REFB_PORT/health" >"$WORK/a-health.json" 2>/dev/null && {
			ok=1
			break
		}
		kill -0 "$bpid" 2>/dev/null || break
		sleep 0.1
	done
	((ok)) || {
		result FAIL "(a) reference broker <- our connector + client" "the reference broker did not start: $(tail -n 2 "$WORK/a-refbroker.log" | tr '\n' ' ')"
		return
	}
	log "(a) reference broker /health: $(cat "$WORK/a-health.json")"

	A_REACH="reach:
  enabled: true
  broker_url: \"wss://127.0.0.1:$REFB_PORT/v1/connect\"
  host_id: \"$hid\"
  host_token_file: \"$WORK/a-host.token\"
  ca_file: \"$WORK/broker.crt\""
	start_front a "$FRONT_A_PORT" "$A_REACH" || {
		result FAIL "(a) reference broker <- our connector + client" "our front did not start"
		return
	}
	local st="" j
	for i in $(seq 1 150); do
		j=$("$BIN" status --json --config "$WORK/a/front.yaml" 2>/dev/null || true)
		st=$(jq -r '.reach.state // empty' <<<"$j" 2>/dev/null || true)
		[[ $st == connected ]] && break
		sleep 0.2
	done
	if [[ $st != connected ]]; then
		result FAIL "(a) reference broker <- our connector + client" \
			"our connector did not register with the reference broker: $(jq -c '.reach | {state, last_error, last_error_detail}' <<<"$j" 2>/dev/null)"
		return
	fi
	log "(a) our connector registered: $(jq -c '.reach | {state, host_id, attempts}' <<<"$j")"

	admin a POST /reach/bootstrap '{"ttl_seconds":600}' >"$WORK/a-boot.json" 2>"$WORK/a-admin.log" || {
		result FAIL "(a) reference broker <- our connector + client" \
			"POST /reach/bootstrap failed (publish_bootstrap at the reference broker): $(head -c 300 "$WORK/a-boot.json")"
		return
	}
	chmod 600 "$WORK/a-boot.json"
	admin a GET /identity >"$WORK/a-ident.json"
	candidate "$WORK/a-boot.json" "$WORK/a-ident.json" "$WORK/a-cand.json"
	local pin
	pin=$(cat "$WORK/a/pin")
	if health_via_connect a "$WORK/a-cand.json" "$CONN_A_PORT" "$FRONT_A_PORT" "$pin" &&
		grep -q '"surface":"hermes_secure_proxy"' <<<"$HEALTH_OUT" && grep -q 'HTTP 200$' <<<"$HEALTH_OUT"; then
		result PASS "(a) reference broker <- our connector + client" \
			"GET /relay/health through the reference broker: $(head -n1 <<<"$HEALTH_OUT" | cut -c1-160)"
	else
		result FAIL "(a) reference broker <- our connector + client" "GET /relay/health: $(tr '\n' ' ' <<<"$HEALTH_OUT" | cut -c1-300)"
		return
	fi

	A_ATTEMPTS=1
	a_registration "(a) extra: registration survives the end of the health stream"

	# Extra: the bootstrap served its one stream; the reference broker must
	# refuse a second use (securelink connect refuses it locally already, so
	# ask the broker directly).
	cred_from_boot "$WORK/a-boot.json" "$WORK/a-bootcred.json"
	local out
	if out=$("$LG" xfer -mode download -addr "127.0.0.1:$FRONT_A_PORT" -pin "$pin" -reach "$WORK/a-bootcred.json" \
		-ca-file "$WORK/broker.crt" -duration 1s -warmup 0s 2>&1); then
		result FAIL "(a) extra: spent bootstrap refused by the broker" "a second stream with the same bootstrap was matched"
	elif grep -q replayed <<<"$out"; then
		result PASS "(a) extra: spent bootstrap refused by the broker" "second use answered replayed"
	else
		result FAIL "(a) extra: spent bootstrap refused by the broker" "$(tail -n1 <<<"$out" | cut -c1-200)"
	fi

	# Extra: route credential handoff (our front publishes publish_route to
	# the reference broker before auth.ok), then bulk data on the route.
	if out=$("$LG" reach-route -admin "$WORK/a/state/admin.sock" -addr "127.0.0.1:$FRONT_A_PORT" -pin "$pin" \
		-ca-file "$WORK/broker.crt" -out "$WORK/a-route.json" 2>&1); then
		result PASS "(a) extra: route credential handoff" "$(cut -c1-160 <<<"$out" | sed 's/ broker_url=.*//')"
		a_registration "(a) extra: registration survives the end of the handoff stream"
		xfer_check "(a) extra: 8 MiB downloads on a route stream" "$WORK/a-route.json" download "$FRONT_A_PORT" "$pin"
		a_registration "(a) extra: registration survives the end of the download stream"
		xfer_check "(a) extra: 8 MiB uploads on a route stream" "$WORK/a-route.json" upload "$FRONT_A_PORT" "$pin"
		a_registration "(a) extra: registration survives the end of the upload stream"
		a_concurrent_route "$pin"
		a_registration "(a) extra: registration survives the end of the concurrent streams"
	else
		result FAIL "(a) extra: route credential handoff" "$(tail -n1 <<<"$out" | cut -c1-300)"
	fi
}

# a_concurrent_route PIN: a client needs its Relay WebSocket and an API
# request at once, so the spec lets a route credential carry 4 live streams
# (max_streams_per_route). Hold one download stream open and start a second
# on the same route credential meanwhile. (Both are /api/ downloads: a
# /relay/ws stream would trigger another handoff, which may re-publish the
# credential_id with a new token and so retire the one in hand.)
a_concurrent_route() {
	local label="(a) extra: 2 concurrent streams on one route credential" epid rc=0 out
	"$LG" xfer -mode download -addr "127.0.0.1:$FRONT_A_PORT" -pin "$1" -reach "$WORK/a-route.json" \
		-ca-file "$WORK/broker.crt" -duration 4s -warmup 0s >"$WORK/first.out" 2>"$WORK/first.err" &
	epid=$!
	sleep 1.5
	out=$("$LG" xfer -mode download -addr "127.0.0.1:$FRONT_A_PORT" -pin "$1" -reach "$WORK/a-route.json" \
		-ca-file "$WORK/broker.crt" -duration 1s -warmup 0s 2>&1) || rc=$?
	wait "$epid" || true
	cat "$WORK/first.out" "$WORK/first.err" >>"$WORK/loadgen.log"
	if ! grep -q '^mode=' "$WORK/first.out"; then
		result FAIL "$label" "the first stream failed: $(tail -n1 "$WORK/first.err" | cut -c1-200)"
	elif ((rc == 0)); then
		result PASS "$label" "a second download ran while the first stream was open"
	else
		local why
		why="second stream refused while the first was open: $(tail -n1 <<<"$out" | sed 's/^loadgen xfer: //' | cut -c1-160)"
		[[ $out == *host_busy* ]] &&
			why+=" => spec/reach.md (Client matching): a route credential carries up to max_streams_per_route (default 4) live streams"
		result FAIL "$label" "$why"
	fi
}

# new_trace FILE: the refshim-trace lines added to FILE since trace_mark.
declare -A TRACE_SEEN
new_trace() {
	grep 'refshim-trace' "$1" 2>/dev/null | tail -n +$((${TRACE_SEEN[$1]:-0} + 1)) | sed 's/^refshim-trace: //' | head -n 4 | tr '\n' ';' || true
}
trace_mark() { TRACE_SEEN[$1]=$(grep -c 'refshim-trace' "$1" 2>/dev/null || true); }

# a_registration LABEL: our connector is still registered with the reference
# broker (same attempt). If not, say why and restart the front, so the
# following checks start from a fresh registration (after `unauthorized` the
# connector would otherwise back off for 10 minutes, as the spec says).
a_registration() {
	local j st att
	sleep 0.5
	j=$("$BIN" status --json --config "$WORK/a/front.yaml" 2>/dev/null || true)
	st=$(jq -r '.reach.state // empty' <<<"$j" 2>/dev/null || true)
	att=$(jq -r '.reach.attempts // empty' <<<"$j" 2>/dev/null || true)
	if [[ $st == connected && $att == "$A_ATTEMPTS" ]]; then
		result PASS "$1" "still connected, same registration"
		trace_mark "$WORK/a-refbroker.log"
		return
	fi
	local t why
	t=$(new_trace "$WORK/a-refbroker.log")
	why="our connector: $(jq -c '.reach | {state, last_error}' <<<"$j" 2>/dev/null); reference broker: $t"
	if [[ $t == *"for a stream the broker has already closed"*"decided in _host_binary"* ]]; then
		why+=" => the reference ends the host registration for a late frame; spec/reach.md (Data): DATA or CLOSE for a stream the broker already closed is silently dropped"
	fi
	result FAIL "$1" "$why"
	trace_mark "$WORK/a-refbroker.log"
	log "restarting our front (a) for a fresh registration"
	stop_pids "${FRONT_PID[a]}"
	start_front a "$FRONT_A_PORT" "$A_REACH" || return
	local i
	for i in $(seq 1 150); do
		st=$("$BIN" status --json --config "$WORK/a/front.yaml" 2>/dev/null | jq -r '.reach.state // empty' 2>/dev/null || true)
		[[ $st == connected ]] && break
		sleep 0.2
	done
	A_ATTEMPTS=1
}

# ============================================================ (b)
direction_b() {
	log "(b) our broker on 127.0.0.1:$OURB_PORT + reference connector -> our front + our client"
	cat >"$WORK/ourbroker.yaml" <<EOF
listen: "127.0.0.1:$OURB_PORT"
tls: {cert_file: "$WORK/broker.crt", key_file: "$WORK/broker.key"}
hosts_file: "$WORK/our-hosts.json"
state_file: "$WORK/our-state.json"
log: {level: debug, format: json}
EOF
	(umask 077 && "$BIN" broker add-host --config "$WORK/ourbroker.yaml" --json >"$WORK/b-host.json" 2>>"$WORK/b-admin.log") ||
		{ result FAIL "(b) our broker <- reference connector" "securelink broker add-host failed"; return; }
	local hid
	hid=$(jq -r .host_id "$WORK/b-host.json")
	(umask 077 && jq -r .host_token "$WORK/b-host.json" >"$WORK/b-host.token")
	"$BIN" broker serve --config "$WORK/ourbroker.yaml" >"$WORK/b-broker.out" 2>"$WORK/b-broker.log" &
	local bpid=$!
	BG_PIDS+=($bpid)
	wait_line "$WORK/b-broker.out" "broker listening" "$bpid" 20 || {
		result FAIL "(b) our broker <- reference connector" "our broker did not start: $(tail -n 2 "$WORK/b-broker.log" | tr '\n' ' ')"
		return
	}
	# The reference connector forwards each stream's bytes to a local TCP
	# port: our front (no reach block), which terminates the inner TLS.
	start_front b "$FRONT_B_PORT" || {
		result FAIL "(b) our broker <- reference connector" "our front did not start"
		return
	}
	mkdir -p "$WORK/b-boot"
	chmod 700 "$WORK/b-boot"
	"$PY" "$ROOT/interop/refshim.py" connector --ref "$REF" --broker-url "wss://127.0.0.1:$OURB_PORT/v1/connect" \
		--host-id "$hid" --token-file "$WORK/b-host.token" --ca-file "$WORK/broker.crt" \
		--local-port "$FRONT_B_PORT" --bootstrap-dir "$WORK/b-boot" --bootstraps 3 \
		>"$WORK/b-refconn.out" 2>"$WORK/b-refconn.log" &
	local cpid=$!
	BG_PIDS+=($cpid)
	wait_line "$WORK/b-refconn.out" "connected" "$cpid" 40 || {
		result FAIL "(b) our broker <- reference connector" \
			"the reference connector did not register or publish: $(tail -n 3 "$WORK/b-refconn.log" | tr '\n' ' ' | cut -c1-300); broker: $(grep -m2 -o '"message":"[^"]*"' "$WORK/b-broker.log" | tr '\n' ' ')"
		return
	}
	log "(b) reference connector registered and published 3 bootstraps"
	admin b GET /identity >"$WORK/b-ident.json"
	candidate "$WORK/b-boot/bootstrap-0.json" "$WORK/b-ident.json" "$WORK/b-cand.json"
	local pin
	pin=$(cat "$WORK/b/pin")
	if health_via_connect b "$WORK/b-cand.json" "$CONN_B_PORT" "$FRONT_B_PORT" "$pin" &&
		grep -q '"surface":"hermes_secure_proxy"' <<<"$HEALTH_OUT" && grep -q 'HTTP 200$' <<<"$HEALTH_OUT"; then
		result PASS "(b) our broker <- reference connector" \
			"GET /relay/health through the reference connector: $(head -n1 <<<"$HEALTH_OUT" | cut -c1-160)"
	else
		result FAIL "(b) our broker <- reference connector" "GET /relay/health: $(tr '\n' ' ' <<<"$HEALTH_OUT" | cut -c1-300)"
		return
	fi
	cred_from_boot "$WORK/b-boot/bootstrap-1.json" "$WORK/b-cred1.json"
	cred_from_boot "$WORK/b-boot/bootstrap-2.json" "$WORK/b-cred2.json"
	b_registration "(b) extra: registration survives the end of the health stream" "$cpid"
	xfer_check "(b) extra: 8 MiB downloads through the reference connector" "$WORK/b-cred1.json" download "$FRONT_B_PORT" "$pin"
	b_registration "(b) extra: registration survives the end of the download stream" "$cpid"
	xfer_check "(b) extra: 8 MiB uploads through the reference connector" "$WORK/b-cred2.json" upload "$FRONT_B_PORT" "$pin"
	b_registration "(b) extra: registration survives the end of the upload stream" "$cpid"
}

# b_registration LABEL PID: the reference connector has not left the
# connected state since the last check (its harness traces every change).
b_registration() {
	sleep 0.5
	local t
	t=$(new_trace "$WORK/b-refconn.log")
	trace_mark "$WORK/b-refconn.log"
	if kill -0 "$2" 2>/dev/null && [[ -z $t ]]; then
		result PASS "$1" "still connected, same registration"
	else
		result FAIL "$1" "reference connector: ${t:-exited}; our broker: $(grep -v '"level":"debug"' "$WORK/b-broker.log" | grep -o '"message":"[^"]*"' | tail -n 2 | tr '\n' ' ')"
	fi
}

direction_a
direction_b

# verdict DIR TITLE: PASS when every check of the direction passed, else
# FAIL naming whether the main check (GET /relay/health) passed and the
# first failing check; then every check.
verdict() {
	local lines=() l v lab why first="" main="" nfail=0
	for l in "${RESULTS[@]}"; do
		lab=${l#*|}
		lab=${lab%%|*}
		[[ $lab == "($1) "* ]] && lines+=("$l")
	done
	for l in "${lines[@]}"; do
		v=${l%%|*} lab=${l#*|} why=${lab#*|} lab=${lab%%|*}
		[[ $lab != "($1) extra: "* && -z $main ]] && main=$v
		if [[ $v == FAIL ]]; then
			nfail=$((nfail + 1))
			[[ -z $first ]] && first="${lab#"($1) "}: $why"
		fi
	done
	if ((${#lines[@]} == 0)); then
		echo "($1) $2: FAIL (not run)"
	elif ((nfail == 0)); then
		echo "($1) $2: PASS (${#lines[@]} checks)"
	else
		echo "($1) $2: FAIL — main check ${main:-not run}, $nfail of ${#lines[@]} checks failed; first: $(cut -c1-200 <<<"$first")"
	fi
	for l in "${lines[@]}"; do
		v=${l%%|*} lab=${l#*|} why=${lab#*|} lab=${lab%%|*}
		printf '    %-5s %s: %s\n' "$v" "${lab#"($1) "}" "$why"
	done
}

echo
echo "securelink interop with the Python reference ($(git -C "$REF" rev-parse --short HEAD 2>/dev/null || echo "REF=$REF"))"
echo "python:  $("$PY" --version 2>&1), $(grep -h -m1 '^refshim: aiohttp' "$WORK"/a-refbroker.log "$WORK"/b-refconn.log 2>/dev/null | head -n1 | sed 's/^refshim: //')"
echo "binary:  $BIN ($(git describe --always --dirty 2>/dev/null || echo unknown))"
echo "brokers: TLS on 127.0.0.1 with one self-signed certificate (reference: --tls-cert/--tls-key; ours: tls:)"
verdict a "reference broker <- our connector (securelink serve) + our client (securelink connect, curl)"
verdict b "our broker <- reference connector (-> our front) + our client"
echo "logs:    $LOGS"
exit $((FAILS > 0))

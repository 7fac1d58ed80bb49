# shellcheck shell=bash
# Shared by bench/run.sh and bench/soak.sh.

# stop_pids PID...: SIGTERM, up to 5 s for the processes to exit, then
# SIGKILL; reaps them. Only the given pids (the scripts' own children).
stop_pids() {
	(($#)) || return 0
	local i
	kill -TERM "$@" 2>/dev/null || true
	for i in $(seq 1 50); do
		kill -0 "$@" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$@" 2>/dev/null || true
	wait "$@" 2>/dev/null || true
}

#!/usr/bin/env bash
# Checks the shipped systemd units: `systemd-analyze verify` must be clean and
# `systemd-analyze security --offline=yes` must rate each unit's exposure at
# 2.0 or below. verify needs ExecStart's binary to exist, so it runs on copies
# whose ExecStart points at the freshly built binary.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(pwd)/bin/securelink"
[ -x "$bin" ] || { echo "check-units: build bin/securelink first" >&2; exit 1; }
if ! command -v systemd-analyze >/dev/null 2>&1; then
	if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
	else
		echo "check-units: systemd-analyze is missing" >&2; exit 1
	fi
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail=0
for unit in systemd/*.service; do
	name="$(basename "$unit")"
	sed "s|/usr/local/bin/securelink|$bin|" "$unit" >"$tmp/$name"
	out="$(systemd-analyze verify "$tmp/$name" 2>&1 || true)"
	# verify complains about units and users that only exist once installed
	# on a systemd host; anything else is a defect in the unit.
	out="$(printf '%s\n' "$out" | grep -v -e 'network-online.target' -e "Failed to resolve user" -e '^$' || true)"
	if [ -n "$out" ]; then
		echo "systemd-analyze verify $name:"; echo "$out"; fail=1
	fi
	score="$(systemd-analyze security --offline=yes "$tmp/$name" 2>/dev/null | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')"
	if [ -z "$score" ] || ! awk -v s="$score" 'BEGIN{exit !(s <= 2.0)}'; then
		echo "$name: exposure ${score:-unknown} (must be <= 2.0)"; fail=1
	else
		echo "$name: verify clean, exposure $score"
	fi
done
exit $fail

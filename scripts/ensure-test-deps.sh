#!/usr/bin/env bash
# Installs what the test suite needs beyond Go: curl (the end-to-end test
# drives the built binary with curl --pinnedpubkey, as an operator would).
set -euo pipefail
need=()
command -v curl >/dev/null 2>&1 || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "missing: ${need[*]} (install them, or run as root so this script can)" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" ca-certificates >/dev/null
fi

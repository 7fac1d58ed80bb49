#!/usr/bin/env bash
# Installs what the test suite needs beyond Go:
# - curl: the end-to-end test drives the built binary with curl
#   --pinnedpubkey, as an operator would;
# - the shipped clients' own stacks (cmd/securelink/clients_test.go):
#   Node and npm, Bun 1.3.14 (the desktop client's runtime, from npm into
#   .cache/bun), and a JDK with Debian's OkHttp (the Android app's HTTP
#   stack);
# - bind9: internal/acme's dns-01 test runs named on loopback as the
#   RFC 2136 server.
# Debian packages need root; Bun installs as any user.
set -euo pipefail
cd "$(dirname "$0")/.."
BUN_VERSION=1.3.14
BUN_DIR=.cache/bun
bun_bin="$BUN_DIR/node_modules/@oven/bun-linux-x64/bin/bun"

need=()
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
{ command -v javac >/dev/null 2>&1 && command -v keytool >/dev/null 2>&1; } || need+=(openjdk-17-jdk-headless)
[ -f /usr/share/java/okhttp.jar ] && [ -f /usr/share/java/okio.jar ] || need+=(libokhttp-java)
{ command -v named >/dev/null 2>&1 || [ -x /usr/sbin/named ]; } || need+=(bind9)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "missing: ${need[*]} (install them, or run as root so this script can)" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" ca-certificates >/dev/null
fi

if [ "$("$bun_bin" --version 2>/dev/null || true)" != "$BUN_VERSION" ]; then
	rm -rf "$BUN_DIR"
	mkdir -p "$BUN_DIR"
	npm install --prefix "$BUN_DIR" --no-save --no-package-lock --no-audit --no-fund --loglevel=error \
		"@oven/bun-linux-x64@$BUN_VERSION" >/dev/null
	[ "$("$bun_bin" --version)" = "$BUN_VERSION" ] || { echo "bun $BUN_VERSION did not install" >&2; exit 1; }
fi

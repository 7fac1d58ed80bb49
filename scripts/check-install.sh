#!/usr/bin/env bash
# Runs `make install` into a scratch DESTDIR and checks what it laid down:
# the binary runs, the units point at it, and an existing config survives.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="$(mktemp -d)"
trap 'rm -rf "$dest"' EXIT
make -s install DESTDIR="$dest" PREFIX=/usr >/dev/null
"$dest/usr/bin/securelink" version >/dev/null
for u in securelink.service securelink-broker.service; do
	grep -q '^ExecStart=/usr/bin/securelink ' "$dest/etc/systemd/system/$u" || { echo "install: $u ExecStart not rewritten"; exit 1; }
done
cmp -s config.example.yaml "$dest/etc/securelink/config.yaml" || { echo "install: config.yaml not installed"; exit 1; }
echo "# operator edit" >>"$dest/etc/securelink/config.yaml"
make -s install DESTDIR="$dest" PREFIX=/usr >/dev/null
grep -q '# operator edit' "$dest/etc/securelink/config.yaml" || { echo "install: overwrote an existing config.yaml"; exit 1; }
echo "install: ok"

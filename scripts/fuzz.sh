#!/usr/bin/env bash
# `make fuzz`: every fuzz target of the module, one at a time, for FUZZTIME
# each (default 60s). A target that fails does not stop the run; the summary
# table lists every target with its result, and the exit status is non-zero
# when any target found a crasher (or could not run).
#
# Go writes a crashing input to <package>/testdata/fuzz/<Target>/<hash>; the
# script lists those files at the end. Commit them: from then on they run as
# seeds of the same target in `make test` (a plain `go test` runs every seed
# corpus), so the crash stays fixed.
#
#   FUZZTIME=60s       time per target (any -fuzztime value: 30s, 2m, 10000x)
#   FUZZ_PKGS="./a ./b"  only these packages (default ./...)
#   FUZZ_MATCH=RE      only targets whose name matches RE (grep -E)
#   FUZZ_PARALLEL=N    fuzzing workers per target (default: go test's, GOMAXPROCS)
set -uo pipefail
export LC_ALL=C

cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-60s}
PKGS=${FUZZ_PKGS:-./...}
MATCH=${FUZZ_MATCH:-.}
PARALLEL=()
[[ -n ${FUZZ_PARALLEL:-} ]] && PARALLEL=(-parallel "$FUZZ_PARALLEL")

log() { printf '[fuzz] %s\n' "$*" >&2; }

WORK=$(mktemp -d /tmp/securelink-fuzz.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# Discovery: `go test -list` prints a package's matching names, then its
# "ok  <import path>" line; names before that line belong to it.
log "discovering fuzz targets in $PKGS"
# shellcheck disable=SC2086 # PKGS is a list of patterns
if ! $GO test -list '^Fuzz' $PKGS >"$WORK/list" 2>&1; then
	cat "$WORK/list" >&2
	log "error: go test -list failed"
	exit 1
fi
TARGETS=() # "import/path Name"
names=()
while IFS= read -r line; do
	case $line in
	Fuzz*) names+=("$line") ;;
	"ok "* | "? "*)
		pkg=$(awk '{print $2}' <<<"$line")
		for n in "${names[@]}"; do
			grep -Eq -- "$MATCH" <<<"$n" && TARGETS+=("$pkg $n")
		done
		names=()
		;;
	esac
done <"$WORK/list"
((${#TARGETS[@]})) || {
	log "error: no fuzz target found"
	exit 1
}
log "${#TARGETS[@]} targets, $FUZZTIME each"

# deadline_race LOG: the target failed with only "context deadline exceeded"
# and Go wrote no failing input.
deadline_race() {
	! grep -q 'Failing input written to' "$1" &&
		grep -A1 -E '^--- FAIL: Fuzz' "$1" | grep -qxE '[[:space:]]+context deadline exceeded'
}

MODULE=$($GO list -m)
declare -a ROWS
FAILED=0
CRASHERS=()
i=0
for t in "${TARGETS[@]}"; do
	i=$((i + 1))
	read -r pkg name <<<"$t"
	rel=.${pkg#"$MODULE"} # ./internal/policy, or . for the module root
	out="$WORK/$i.log"
	log "[$i/${#TARGETS[@]}] $rel $name"
	try=0
	while :; do
		try=$((try + 1))
		$GO test -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" "${PARALLEL[@]}" "$rel" >"$out" 2>&1
		rc=$?
		# Go 1.26's coordinator can report its own -fuzztime deadline as a
		# failure, with no input written (go.dev/issue/75804, fixed in 1.27):
		# run such a target once more rather than call it a crasher.
		((rc != 0)) && deadline_race "$out" && ((try < 2)) || break
		log "$name: fuzztime deadline race (go.dev/issue/75804, no input written); running it again"
	done
	# Last progress line: "fuzz: elapsed: 5s, execs: 123456 (24690/sec), ..."
	prog=$(grep -E '^fuzz: elapsed: ' "$out" | tail -n 1)
	execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$prog")
	secs=$(sed -nE 's/^fuzz: elapsed: ([0-9]+)s.*/\1/p' <<<"$prog")
	rate=-
	[[ -n $execs && -n $secs && $secs -gt 0 ]] && rate=$((execs / secs))
	crash=$(sed -nE 's/.*Failing input written to (testdata\/fuzz\/[^ ]+).*/\1/p' "$out" | head -n 1)
	# A committed crasher that still fails is reported before fuzzing starts.
	seed=$(sed -nE 's/^failure while testing seed corpus entry: ([^ ]+).*/\1/p' "$out" | head -n 1)
	[[ -z $crash && -n $seed && -f $rel/testdata/fuzz/$seed ]] && crash=testdata/fuzz/$seed
	if ((rc == 0)); then
		result=ok
	elif deadline_race "$out"; then
		result=deadline # twice; not a finding (no input), not a failure
	elif [[ -n $crash ]]; then
		result=CRASHER
		CRASHERS+=("${rel#./}/$crash")
		FAILED=1
	else
		result=ERROR
		FAILED=1
	fi
	if [[ $result == CRASHER || $result == ERROR ]]; then
		log "$name: $result; last lines of its output:"
		tail -n 25 "$out" | sed 's/^/    /' >&2
	fi
	ROWS+=("$(printf '%-32s %-30s %-8s %12s %10s' "${rel#./}" "$name" "$result" "${execs:--}" "$rate")")
done

echo
echo "fuzz summary — $FUZZTIME per target, $($GO version | awk '{print $3}'), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
printf '%-32s %-30s %-8s %12s %10s\n' package target result execs execs/s
printf '%s\n' "${ROWS[@]}"
grep -q ' deadline ' <<<"${ROWS[*]}" &&
	echo "deadline = Go's fuzztime race (go.dev/issue/75804) twice in a row: no input was written; not counted as a failure"
if ((${#CRASHERS[@]})); then
	echo
	echo "crashers (now regression seeds; fix the bug, then commit them so \`make test\` replays them):"
	for c in "${CRASHERS[@]}"; do
		dir=${c%/testdata/fuzz/*} seed=${c#*/testdata/fuzz/}
		echo "  $c"
		echo "      replay: go test -run '^${seed%%/*}/${seed#*/}\$' ./$dir"
	done
fi
exit "$FAILED"

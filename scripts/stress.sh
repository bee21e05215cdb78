#!/usr/bin/env bash
# Stress: run the whole suite with 4 pytest-xdist workers N times in a row (default 10), stop at the
# first failing run, and report how many runs passed. Flaky facts or launcher races show up here.
#
# Usage: scripts/stress.sh [N] [extra pytest arguments...]
#   scripts/stress.sh            # 10 runs
#   scripts/stress.sh 3 -x       # 3 runs, each stopping at its first failure
set -uo pipefail
cd "$(dirname "$0")/.."

runs="${1:-10}"
shift || true
if ! [[ "$runs" =~ ^[1-9][0-9]*$ ]]; then
    echo "stress: N must be a positive integer, got '$runs'" >&2
    exit 2
fi

passed=0
for ((i = 1; i <= runs; i++)); do
    echo "stress: run $i/$runs" >&2
    log="$(mktemp -t ddpprobe-stress.XXXXXX)"
    start=$SECONDS
    python -m pytest -n 4 -p no:cacheprovider -q "$@" >"$log" 2>&1
    rc=$?
    tail -n 1 "$log" >&2
    if [ "$rc" -ne 0 ]; then
        echo "stress: run $i failed (pytest exit $rc) after $((SECONDS - start)) s; its output: $log" >&2
        grep -E "^(FAILED|ERROR)" "$log" >&2 || true
        echo "stress: $passed/$runs runs passed before the first failure"
        exit 1
    fi
    rm -f "$log"
    passed=$((passed + 1))
    echo "stress: run $i passed in $((SECONDS - start)) s" >&2
done
echo "stress: $passed/$runs runs passed"

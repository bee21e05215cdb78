#!/usr/bin/env bash
# Stress: run the suite N times in a row with 4 pytest-xdist workers (default 20 runs), then report
# how many runs passed and failed, the processes each run left behind, and the slowest test of each
# run. Flaky facts, launcher races and leaked ranks or forkservers show up here; more workers than
# cores (4 or 6 on 2 cores) make every rank wait for a core, which is what turns a race into a failure.
#
# Usage: [STRESS_WORKERS=W] scripts/stress.sh [N] [extra pytest arguments...]
#   scripts/stress.sh                   # 20 runs of `pytest -n 4`
#   scripts/stress.sh 3                 # 3 runs
#   STRESS_WORKERS=6 scripts/stress.sh 5   # 5 runs of `pytest -n 6`
#   scripts/stress.sh 5 -m integration  # 5 runs of the integration tests only
#
# Each run's full output (every failure's traceback and the ranks' reports, `--tb=long -rfE`) is kept
# in its log, run<i>.log, with its junitxml; the logs of failed runs are listed at the end. Each run's
# line gives its wall time and the load average (1 min) before and after it.
#
# Leftover processes: every process a run starts (pytest, its workers, forkservers, ranks and their
# children) inherits DDPPROBE_STRESS_RUN=<this run>; right after pytest exits, any process still
# carrying it is listed, counted as left behind and killed, so the next run starts clean.
# Slowest test: from each run's junitxml (setup + call + teardown). The launcher does not time worlds
# itself, so the slowest fact test (tests/facts; its worlds included) stands for the slowest world; a
# worker's first world also pays for starting that worker's forkserver.
# Exit code: 0 when every run passed and none left a process behind, 1 otherwise, 2 for a bad N.
set -uo pipefail
cd "$(dirname "$0")/.."

runs="${1:-20}"
shift || true
if ! [[ "$runs" =~ ^[1-9][0-9]*$ ]]; then
    echo "stress: N must be a positive integer (the number of runs), got '$runs'" >&2
    exit 2
fi

python="${PYTHON:-python}"
workers="${STRESS_WORKERS:-4}"
if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
    echo "stress: STRESS_WORKERS must be a positive integer (pytest-xdist workers), got '$workers'" >&2
    exit 2
fi
failed_logs=()
logs="$(mktemp -d -t ddpprobe-stress.XXXXXX)"
token="stress-$$-$RANDOM"
passed=0
failed=0
leftover_total=0
slowest_summary="$logs/slowest.tsv"
: >"$slowest_summary"

# Processes (other than this script's own) whose environment carries DDPPROBE_STRESS_RUN=$1.
carriers() {
    local pid
    for environ in /proc/[0-9]*/environ; do
        pid="${environ#/proc/}"
        pid="${pid%/environ}"
        [ "$pid" = "$$" ] && continue
        if { tr '\0' '\n' <"$environ"; } 2>/dev/null | grep -qx "DDPPROBE_STRESS_RUN=$1"; then
            echo "$pid"
        fi
    done
}

for ((i = 1; i <= runs; i++)); do
    tag="$token-$i"
    junit="$logs/run$i.xml"
    log="$logs/run$i.log"
    load_before=$(cut -d' ' -f1 /proc/loadavg)
    start=$(date +%s.%N)
    DDPPROBE_STRESS_RUN="$tag" "$python" -m pytest -n "$workers" -p no:cacheprovider -q --tb=long -rfE \
        --junitxml="$junit" "$@" >"$log" 2>&1
    rc=$?
    seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
    load="load ${load_before} -> $(cut -d' ' -f1 /proc/loadavg)"

    left=$(carriers "$tag")
    nleft=0
    if [ -n "$left" ]; then
        nleft=$(echo "$left" | wc -l)
        echo "stress: run $i left $nleft process(es) behind:" >&2
        # shellcheck disable=SC2086
        ps -o pid,ppid,etime,cmd -p $(echo $left) >&2 || true
        # shellcheck disable=SC2086
        kill -9 $(echo $left) 2>/dev/null || true
    fi
    leftover_total=$((leftover_total + nleft))

    slowest=$("$python" - "$junit" <<'EOF' 2>/dev/null
import sys
sys.path.insert(0, "benchmarks")
from bench_suite import read_junit
rows = read_junit(sys.argv[1])
facts = [r for r in rows if r[0].startswith("tests/facts/")] or rows
file, name, seconds, _ = max(facts, key=lambda r: r[2])
print(f"{seconds:.2f}\t{file}::{name}")
EOF
)
    [ -n "$slowest" ] && echo -e "$i\t$slowest" >>"$slowest_summary"

    summary=$(tail -n 1 "$log")
    if [ "$rc" -eq 0 ] && [ "$nleft" -eq 0 ]; then
        passed=$((passed + 1))
        echo "stress: run $i/$runs passed in $seconds s, $load ($summary); slowest fact test ${slowest/$'\t'/ s }" >&2
    else
        failed=$((failed + 1))
        echo "stress: run $i/$runs FAILED (pytest exit $rc, $nleft process(es) left) in $seconds s, $load: $summary" >&2
        grep -E "^(FAILED|ERROR)" "$log" >&2 || true
        echo "stress: its full output: $log" >&2
        failed_logs+=("$log")
    fi
done

echo "stress: $runs run(s) of pytest -n $workers $*: $passed passed, $failed failed, $leftover_total process(es) left behind"
if [ -s "$slowest_summary" ]; then
    worst=$(sort -t$'\t' -k2,2 -gr "$slowest_summary" | head -n 1)
    echo "stress: slowest fact test over all runs: $(echo "$worst" | cut -f2) s in run $(echo "$worst" | cut -f1): $(echo "$worst" | cut -f3)"
fi
echo "stress: logs and junitxml reports in $logs"
for log in ${failed_logs[@]+"${failed_logs[@]}"}; do
    echo "stress: failed run's output: $log"
done
[ "$failed" -eq 0 ]

"""Where the suite's seconds go: wall time of one pytest run and a per-file cost table.

Runs the suite once (by default the README's ``pytest -n auto``) with ``--junitxml`` into a temporary
file, and prints:

- the run's wall time, the CPU time of pytest and every process it started (user + system, from
  ``getrusage(RUSAGE_CHILDREN)``; a machine-independent figure of how much work the run is), and the
  load average before and after (the wall time is only meaningful on a quiet machine);
- the outcome counts (passed, failed, skipped, xfailed, ...);
- the worlds the ``run_world`` fixture started (their ranks, how many raised, how many ran on a warm world
  of ``--warm-worlds``, ddpprobe/plugin/_warm.py), the calls it answered
  with a completed identical world instead, and the distinct world keys (ddpprobe/plugin/_shared_worlds.py, read
  from the log ``DDPPROBE_WORLD_LOG`` asks every process of the run to write); CPU seconds per test and per
  started world; the CPU of the controller and of each xdist worker themselves (their imports, collection
  and in-process test code), the rest being the forkserver, the ranks and other subprocesses;
- one row per room (facts, audit, guard, trace, contract, launch, and the docs', card's, plugin's and support
  tests as "other"; :data:`ROOMS`): tests, summed wall seconds, the CPU of the test's own worker process and
  the children it waited for, the CPU its worlds' ranks spent in their scenarios, the seconds the worker
  waited (a test's wall minus both CPU figures, when positive: the worker and its ranks asleep, e.g. in a
  process-group timeout, or queued for a core on a loaded machine), and the worlds started (every world
  launched, by the ``run_world`` fixture, the audit, the guard's runs or the trace; from the per-test lines
  of the same log);
- one row per test file: tests, summed seconds (setup + call + teardown, as junitxml reports them),
  share of the total, and the file's slowest test with its seconds, costliest file first;
- the slowest tests over the whole run.

A test file whose row grows in review is where a slow test was added. Summed test seconds exceed the
wall time under xdist (workers run side by side); the wall time also holds each worker's start (import
of torch and Lightning, the forkserver's start), which no test's time includes.

Usage (from the repository root)::

    python benchmarks/bench_suite.py                          # pytest -n auto (the default run)
    python benchmarks/bench_suite.py --markdown               # tables as Markdown, for benchmarks/README.md
    python benchmarks/bench_suite.py --target 20 -- -n auto   # exit 1 when the wall time exceeds 20 s
    python benchmarks/bench_suite.py -- -n auto -m integration   # the integration tests only
    python benchmarks/bench_suite.py -- -n auto --warm-worlds    # the default run on warm worlds

Everything after ``--`` replaces the default pytest arguments (``-n auto``). Exit code: pytest's own
when it is not 0, else 1 when ``--target`` is given and the wall time exceeds it, else 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT_PYTEST_ARGS = ["-n", "auto"]

#: The rooms of the per-room table: the first whose folder prefixes a test's node id; the rest is "other"
#: (tests/tooling/docs, card, plugin, support).
ROOMS = (
    ("facts", "tests/facts/"),
    ("audit", "tests/tooling/audit/"),
    ("guard", "tests/tooling/guard/"),
    ("trace", "tests/tooling/trace/"),
    ("contract", "tests/tooling/contract/"),
    ("launch", "tests/tooling/launch/"),
)

#: junitxml result element -> outcome word (a testcase with none of them passed).
_OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}


def file_of(classname: str, name: str) -> str:
    """The test file a junitxml ``testcase`` belongs to: ``tests.facts.test_sharding`` (its classname,
    plus ``.Class`` for tests in a class) -> ``tests/facts/test_sharding.py``."""
    parts = classname.split(".")
    # Drop trailing class names (CapWords) so tests in a class count for their file.
    while len(parts) > 1 and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def read_junit(path: str) -> list:
    """``[(file, test name, seconds, outcome)]`` for every ``testcase`` in a junitxml report.

    outcome is ``passed``, ``failed``, ``error``, ``skipped`` or ``xfailed`` (pytest writes an xfail
    as a skipped testcase whose type is ``pytest.xfail``)."""
    rows = []
    for case in ET.parse(path).iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in _OUTCOMES:
                outcome = _OUTCOMES[child.tag]
                if child.tag == "skipped" and child.get("type") == "pytest.xfail":
                    outcome = "xfailed"
                break
        rows.append(
            (
                file_of(case.get("classname", ""), case.get("name", "")),
                case.get("name", ""),
                float(case.get("time") or 0.0),
                outcome,
            )
        )
    return rows


def per_file(rows: list) -> list:
    """``[(file, tests, seconds, slowest name, slowest seconds)]``, costliest file first."""
    by_file = collections.defaultdict(list)
    for file, name, seconds, _ in rows:
        by_file[file].append((seconds, name))
    table = []
    for file, tests in by_file.items():
        slow_s, slow_name = max(tests)
        table.append((file, len(tests), sum(s for s, _ in tests), slow_name, slow_s))
    return sorted(table, key=lambda row: -row[2])


def read_world_log(folder: str) -> tuple:
    """``(calls, tests, processes)`` from a ``DDPPROBE_WORLD_LOG`` folder: one dict per ``run_world`` call, one
    per test and one per pytest process (ddpprobe/plugin/_shared_worlds.py ``log_call``, ``log_test``,
    ``log_process``).

    A process that ran pytest sessions inside its own (``pytester.runpytest_inprocess``) logs itself at the
    end of each; its last line, the outermost session's, holds its whole CPU time and is the one kept. Its
    tests are logged too (an inner session's tests by the inner plugin, whose node ids are not the suite's);
    only tests whose node id starts with ``tests/`` are kept, and the outer test's own line holds the inner
    ones' time."""
    calls, tests, processes = [], [], []
    for name in sorted(os.listdir(folder)):
        last = None
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            for line in fh:
                entry = json.loads(line)
                if "process" in entry:
                    last = entry
                elif "run" in entry:
                    tests.append(entry)
                else:
                    calls.append(entry)
        if last is not None:
            processes.append(last)
    return calls, _outermost(tests), processes


def _outermost(tests: list) -> list:
    """The suite's own tests: a test of an inner session run inside a test (pytester) has a node id relative to
    that session's folder, and is left out (its time is inside its outer test's line)."""
    return [t for t in tests if t["run"].startswith("tests/")]


def room_of(nodeid: str) -> str:
    for room, prefix in ROOMS:
        if nodeid.startswith(prefix):
            return room
    return "other"


def per_room(tests: list) -> list:
    """``[(room, tests, wall s, worker CPU s, rank CPU s, waiting s, worlds)]`` in :data:`ROOMS` order, then
    "other", then a total row. Waiting is summed per test: ``max(0, wall - worker CPU - rank CPU)``."""
    names = [room for room, _ in ROOMS] + ["other"]
    sums = {room: [0, 0.0, 0.0, 0.0, 0.0, 0] for room in names}
    for t in tests:
        row = sums[room_of(t["run"])]
        row[0] += 1
        row[1] += t["wall_s"]
        row[2] += t["cpu_s"]
        row[3] += t["rank_cpu_s"]
        row[4] += max(0.0, t["wall_s"] - t["cpu_s"] - t["rank_cpu_s"])
        row[5] += t.get("worlds", 0)
    rows = [(room, *sums[room]) for room in names if sums[room][0]]
    total = [sum(row[i] for row in rows) for i in range(1, 7)]
    return rows + [("total", *total)]


def world_counts(calls: list) -> dict:
    """Worlds started (and their ranks, and how many raised), how many of them ran on a warm world, calls
    answered by a stored world, distinct keys."""
    started = [c for c in calls if not c["reused"]]
    return {
        "calls": len(calls),
        "started": len(started),
        "warm": sum(bool(c.get("warm")) for c in started),
        "fell_back": sum(bool(c.get("fell_back")) for c in started),
        "ranks": sum(c["world_size"] for c in started if isinstance(c["world_size"], int) and not c.get("warm")),
        "raised": sum(not c["ok"] for c in started),
        "reused": len(calls) - len(started),
        "keys": len({c["key"] for c in calls}),
        "scenarios": len({c["scenario"] for c in calls}),
    }


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _fmt_table(header: list, rows: list, markdown: bool) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    if markdown:
        lines = [
            "| " + " | ".join(cells[0]) + " |",
            "| " + " | ".join("---" if i in (0, len(header) - 1) else "---:" for i in range(len(header))) + " |",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in cells[1:]]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    out = []
    for n, row in enumerate(cells):
        out.append(
            "  ".join(
                c.ljust(w) if i in (0, len(header) - 1) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = DEFAULT_PYTEST_ARGS
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [--markdown] [--top N] [--target SECONDS] [-- PYTEST ARGS]",
    )
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    parser.add_argument("--top", type=int, default=10, help="slowest tests to list (default 10)")
    parser.add_argument(
        "--target", type=float, default=None, help="wall-time target in seconds; exit 1 when the run takes longer"
    )
    args = parser.parse_args(argv)
    if args.top < 0:
        parser.error(f"--top must be >= 0, got {args.top}")
    if args.target is not None and not args.target > 0:
        parser.error(f"--target must be a positive number of seconds, got {args.target}")

    with tempfile.TemporaryDirectory(prefix="ddpprobe-bench-") as tmp:
        junit = os.path.join(tmp, "junit.xml")
        log = os.path.join(tmp, "worlds")
        os.mkdir(log)
        command = [sys.executable, "-m", "pytest", *pytest_args, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        load_before = _load()
        usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(
            command,
            cwd=ROOT,
            env={**os.environ, "DDPPROBE_WORLD_LOG": log},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wall = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime)
        load_after = _load()
        if not os.path.exists(junit):
            print(done.stdout[-5000:])
            print(f"bench_suite: pytest exited {done.returncode} without a junitxml report", file=sys.stderr)
            return done.returncode or 1
        rows = read_junit(junit)
        calls, tests, processes = read_world_log(log)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "(no output)"
    counts = collections.Counter(outcome for *_, outcome in rows)
    test_s = sum(seconds for _, _, seconds, _ in rows)
    print(f"command: {' '.join(['pytest', *pytest_args])}  (exit code {done.returncode})")
    print(
        f"machine: {platform.python_implementation()} {platform.python_version()}, CPU {_cpu_model()}, "
        f"{cores} usable core(s); load average before {load_before}, after {load_after}"
    )
    print(f"pytest: {summary}")
    print(
        f"wall time {wall:.1f} s; CPU time {cpu:.1f} s (user + system of every process the run started; "
        f"{cpu / cores:.1f} s per core); summed test time {test_s:.1f} s over {len(rows)} tests "
        f"({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))})"
    )
    worlds = world_counts(calls)
    print(
        f"worlds: {worlds['started']} started ({worlds['warm']} on warm worlds, the others fresh with "
        f"{worlds['ranks']} rank processes, {worlds['fell_back']} of them after a warm world failed the call; "
        f"{worlds['raised']} raised), "
        f"{worlds['reused']} run_world calls answered by an identical completed world; {worlds['keys']} distinct "
        f"world keys, {worlds['scenarios']} scenarios"
    )
    print(
        f"CPU per test {cpu / max(len(rows), 1):.3f} s; per started world {cpu / max(worlds['started'], 1):.3f} s "
        "(all of the run's CPU, divided)"
    )
    if processes:
        own = sum(p["cpu_s"] for p in processes)
        print(
            "CPU of the pytest processes themselves: "
            + ", ".join(
                f"{p['process']} {p['cpu_s']:.1f} s{' (torch imported)' if p['torch'] else ''}"
                for p in sorted(processes, key=lambda p: (p["process"] == "main", p["process"]))
            )
            + f"; the rest (forkserver, ranks, other subprocesses) {cpu - own:.1f} s"
        )
    print()
    if tests:
        print(
            _fmt_table(
                ["room", "tests", "wall s", "worker CPU s", "rank CPU s", "waiting s", "worlds started"],
                [
                    (room, n, f"{wall_s:.1f}", f"{cpu_s:.1f}", f"{rank_s:.1f}", f"{wait_s:.1f}", worlds_n)
                    for room, n, wall_s, cpu_s, rank_s, wait_s, worlds_n in per_room(tests)
                ],
                args.markdown,
            )
        )
        print(
            "(per test, summed: wall = setup + call + teardown; worker CPU = the xdist worker and the children it "
            "waited for; rank CPU = its worlds' ranks in their scenarios; waiting = wall minus both, when positive)"
        )
        print()
    table = per_file(rows)
    print(
        _fmt_table(
            ["file", "tests", "seconds", "share", "slowest test"],
            [
                (file, n, f"{s:.2f}", f"{100 * s / test_s:.0f}%" if test_s else "-", f"{slow_s:.2f} s {slow}")
                for file, n, s, slow, slow_s in table
            ],
            args.markdown,
        )
    )
    if args.top:
        print()
        slowest = sorted(rows, key=lambda row: -row[2])[: args.top]
        print(
            _fmt_table(
                ["slowest tests", "seconds", "outcome"],
                [(f"{file}::{name}", f"{s:.2f}", outcome) for file, name, s, outcome in slowest],
                args.markdown,
            )
        )
    if done.returncode != 0:
        print(
            f"\nbench_suite: pytest failed (exit code {done.returncode}); its last lines:\n"
            + "\n".join(done.stdout.strip().splitlines()[-30:]),
            file=sys.stderr,
        )
        return done.returncode
    if args.target is not None:
        met = wall <= args.target
        print(f"\ntarget: wall time <= {args.target:g} s: {wall:.1f} s -> {'met' if met else 'NOT met'}")
        return 0 if met else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

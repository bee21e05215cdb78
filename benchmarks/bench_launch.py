"""How long a world takes to launch: the same 20 scenarios in ``spawn`` and ``forkserver`` mode, and on a warm world.

Each scenario is a real one (``trainer.validate`` of a probe, F1 five ways, a removed hook, the
launcher's ``identity``) run as a fresh 2-rank gloo world in ``spawn`` and ``forkserver`` mode, and on
one warm world of 2 ranks kept up for the whole run (``ddpprobe.launch.WarmWorld``: each scenario gets a
new world folder and process group on ranks that ran the scenarios before it, as the ``run_world``
fixture's ``--warm-worlds`` does). For every repeat the modes alternate scenario by scenario (the order
flips every repeat), so a change in machine load hits all of them. Printed per scenario: the median wall
time in each mode, spawn/forkserver and forkserver/warm ratios, and for the warm world the CPU its ranks
spent per scenario (from ``/proc/<pid>/stat``); then the one-time cost of starting the forkserver (its
first world minus a warm one) and the targets.

Usage (from the repository root)::

    python benchmarks/bench_launch.py                              # 3 repeats, every mode
    python benchmarks/bench_launch.py --repeats 5
    python benchmarks/bench_launch.py --modes forkserver,warm      # leave out spawn (seconds a world)

CPU heavy: every spawn world starts two interpreters that import torch and Lightning.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddpprobe import run_world  # noqa: E402
from ddpprobe.launch import WarmWorld, warm_call  # noqa: E402
from ddpprobe.probes import f1, hooks, log_spec, validation  # noqa: E402
from tests.support import scenarios  # noqa: E402

WORLD_SIZE = 2
TARGET_FORKSERVER_VALIDATE_S = 0.3
TARGET_SPEEDUP = 20.0
TARGET_WARM_VALIDATE_S = 0.035

#: (label, scenario, params). Fourteen ``trainer.validate`` worlds, then four other probes, then two
#: bare process groups.
SCENARIOS = [
    ("validate n=4", validation.validate, dict(n=4)),
    ("validate n=5 bs=1", validation.validate, dict(n=5, batch_size=1)),
    ("validate n=7", validation.validate, dict(n=7)),
    ("validate n=8 bs=3", validation.validate, dict(n=8, batch_size=3)),
    ("validate n=12 bs=4", validation.validate, dict(n=12, batch_size=4)),
    ("validate sync_dist", validation.validate, dict(n=7, logs=[log_spec("v", sync_dist=True)])),
    ("validate unsynced", validation.validate, dict(n=7, logs=[log_spec("v")])),
    ("validate reduce_fx=max", validation.validate, dict(n=7, logs=[log_spec("v", sync_dist=True, reduce_fx="max")])),
    ("validate on_step", validation.validate, dict(n=6, logs=[log_spec("v", on_step=True, on_epoch=False)])),
    ("validate rank_zero_only", validation.validate, dict(n=6, logs=[log_spec("v", rank_zero_only=True)])),
    (
        "validate two logs",
        validation.validate,
        dict(n=9, logs=[log_spec("a", sync_dist=True), log_spec("b", prog_bar=True)]),
    ),
    ("validate prints", validation.validate, dict(n=6, prints=True)),
    ("validate csv_logger", validation.validate, dict(n=6, logs=[log_spec("v", sync_dist=True)], csv_logger=True)),
    ("validate experiment_log", validation.validate, dict(n=6, csv_logger=True, experiment_log=True)),
    ("f1_five_ways n=10", f1.f1_five_ways, dict(n=10)),
    ("f1_five_ways n=9 bs=2", f1.f1_five_ways, dict(n=9, batch_size=2)),
    ("removed validation_epoch_end", hooks.removed_hook, dict(hook="validation_epoch_end")),
    ("removed validation_step_end", hooks.removed_hook, dict(hook="validation_step_end")),
    ("identity", scenarios.identity, dict(tag="a")),
    ("identity tag=b", scenarios.identity, dict(tag="b")),
]

MODES = ("spawn", "forkserver", "warm")

#: Clock ticks per second of ``/proc/<pid>/stat``'s CPU times.
_TICKS = os.sysconf("SC_CLK_TCK")


def _timed(scenario, params, mode, warm=None) -> float:
    start = time.perf_counter()
    if mode == "warm":
        if warm.run(warm_call(scenario, WORLD_SIZE, backend="gloo", **params)) is None:
            raise RuntimeError(f"{scenario.__name__}{params} failed on the warm world")
    else:
        run_world(scenario, WORLD_SIZE, backend="gloo", start_method=mode, **params)
    return time.perf_counter() - start


def _cpu_s(pids) -> float:
    """User + system CPU seconds the processes ``pids`` have spent so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return total / _TICKS


def _machine() -> str:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (
        f"{platform.python_implementation()} {platform.python_version()} on {platform.system()}, "
        f"CPU: {model}, os.cpu_count()={os.cpu_count()}, usable cores={len(os.sched_getaffinity(0))}, "
        f"load average {tuple(round(x, 2) for x in load)}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per scenario and mode (default 3)")
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma list of modes to time (default {','.join(MODES)})"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown or not modes:
        parser.error(f"--modes {args.modes!r}: use some of {', '.join(MODES)}")

    import torch

    print(f"machine: {_machine()}")
    print(
        f"torch {torch.__version__}, world size {WORLD_SIZE}, backend gloo, {len(SCENARIOS)} scenarios, "
        f"{args.repeats} repeat(s), modes {', '.join(modes)}\n"
    )

    # One-time forkserver start: its first world (server start + preload + the world) minus warm ones.
    cold = _timed(scenarios.identity, {"tag": "cold"}, "forkserver")
    warm_identity = [_timed(scenarios.identity, {"tag": "warm"}, "forkserver") for _ in range(3)]
    start_cost = cold - statistics.median(warm_identity)
    _timed(validation.validate, {"n": 4}, "forkserver")  # untimed: first Trainer in the server's children
    warm = WarmWorld(*warm_call(scenarios.identity, WORLD_SIZE).world) if "warm" in modes else None
    try:
        if warm is not None:
            for label, scenario, params in SCENARIOS:  # untimed: each scenario's first run imports its modules
                _timed(scenario, params, "warm", warm)
        times = {(label, mode): [] for label, _, _ in SCENARIOS for mode in modes}
        warm_cpu = {label: [] for label, _, _ in SCENARIOS}
        for repeat in range(args.repeats):
            order = modes if repeat % 2 == 0 else modes[::-1]
            for label, scenario, params in SCENARIOS:
                for mode in order:
                    before = _cpu_s(warm.pids) if mode == "warm" else 0.0
                    times[(label, mode)].append(_timed(scenario, params, mode, warm))
                    if mode == "warm":
                        warm_cpu[label].append((_cpu_s(warm.pids) - before) / WORLD_SIZE)
            print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    finally:
        if warm is not None:
            warm.close()

    width = max(len(label) for label, _, _ in SCENARIOS)
    columns = [f"{mode} s" for mode in modes]
    if {"spawn", "forkserver"} <= set(modes):
        columns.append("spawn/fork")
    if {"forkserver", "warm"} <= set(modes):
        columns.append("fork/warm")
    if "warm" in modes:
        columns.append("warm CPU/rank s")
    print(f"{'scenario':<{width}}  " + "  ".join(f"{c:>15}" for c in columns))
    median = {key: statistics.median(values) for key, values in times.items()}
    ratios, warm_ratios, validate = [], [], {mode: [] for mode in modes}
    for label, _, _ in SCENARIOS:
        cells = [f"{median[(label, mode)]:15.3f}" for mode in modes]
        if {"spawn", "forkserver"} <= set(modes):
            ratios.append(median[(label, "spawn")] / median[(label, "forkserver")])
            cells.append(f"{ratios[-1]:15.1f}")
        if {"forkserver", "warm"} <= set(modes):
            warm_ratios.append(median[(label, "forkserver")] / median[(label, "warm")])
            cells.append(f"{warm_ratios[-1]:15.1f}")
        if "warm" in modes:
            cells.append(f"{statistics.median(warm_cpu[label]):15.3f}")
        if label.startswith("validate"):
            for mode in modes:
                validate[mode].append(median[(label, mode)])
        print(f"{label:<{width}}  " + "  ".join(cells))

    print()
    print(
        f"forkserver one-time start cost: {start_cost:.2f} s (first world {cold:.2f} s, "
        f"warm identity world median {statistics.median(warm_identity):.3f} s)"
    )
    if "forkserver" in modes:
        median_validate = statistics.median(validate["forkserver"])
        met = median_validate <= TARGET_FORKSERVER_VALIDATE_S
        print(
            f"target 1: 2-rank Trainer.validate world, forkserver median <= {TARGET_FORKSERVER_VALIDATE_S} s: "
            f"{median_validate:.3f} s over {len(validate['forkserver'])} validate scenarios -> "
            f"{'met' if met else 'NOT met'}"
        )
    if ratios:
        met = min(ratios) >= TARGET_SPEEDUP
        print(
            f"target 2: forkserver >= {TARGET_SPEEDUP:g}x faster than spawn per scenario: "
            f"min ratio {min(ratios):.1f} -> {'met' if met else 'NOT met'}"
            f" ({sum(r >= TARGET_SPEEDUP for r in ratios)}/{len(ratios)} scenarios reach it)"
        )
    if "warm" in modes:
        median_warm = statistics.median(validate["warm"])
        met = median_warm <= TARGET_WARM_VALIDATE_S
        cpu = statistics.median(statistics.median(warm_cpu[label]) for label, _, _ in SCENARIOS if "validate" in label)
        print(
            f"target 3: 2-rank Trainer.validate scenario on a warm world, median <= {TARGET_WARM_VALIDATE_S} s: "
            f"{median_warm:.3f} s over {len(validate['warm'])} validate scenarios (CPU per rank {cpu:.3f} s) -> "
            f"{'met' if met else 'NOT met'}"
        )
    print(f"machine at the end: {_machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

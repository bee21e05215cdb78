"""How long a world takes to launch: the same 20 scenarios in ``spawn`` and ``forkserver`` mode.

Each scenario is a real one (``trainer.validate`` of a probe, F1 five ways, a removed hook, the
launcher's ``identity``) run as a fresh 2-rank gloo world. For every repeat the two start methods
alternate scenario by scenario (the order flips every repeat), so a change in machine load hits both.
Printed per scenario: the median wall time of ``run_world`` in each mode and their ratio; then the
one-time cost of starting the forkserver (its first world minus a warm one) and the two targets.

Usage (from the repository root)::

    python benchmarks/bench_launch.py            # 3 repeats
    python benchmarks/bench_launch.py --repeats 5

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
from ddpprobe.probes import f1, hooks, log_spec, validation  # noqa: E402
from tests.support import scenarios  # noqa: E402

WORLD_SIZE = 2
TARGET_FORKSERVER_VALIDATE_S = 0.3
TARGET_SPEEDUP = 20.0

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

MODES = ("spawn", "forkserver")


def _timed(scenario, params, mode) -> float:
    start = time.perf_counter()
    run_world(scenario, WORLD_SIZE, backend="gloo", start_method=mode, **params)
    return time.perf_counter() - start


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
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    import torch

    print(f"machine: {_machine()}")
    print(
        f"torch {torch.__version__}, world size {WORLD_SIZE}, backend gloo, {len(SCENARIOS)} scenarios, "
        f"{args.repeats} repeat(s)\n"
    )

    # One-time forkserver start: its first world (server start + preload + the world) minus warm ones.
    cold = _timed(scenarios.identity, {"tag": "cold"}, "forkserver")
    warm_identity = [_timed(scenarios.identity, {"tag": "warm"}, "forkserver") for _ in range(3)]
    start_cost = cold - statistics.median(warm_identity)
    _timed(validation.validate, {"n": 4}, "forkserver")  # untimed: first Trainer in the server's children

    times = {(label, mode): [] for label, _, _ in SCENARIOS for mode in MODES}
    for repeat in range(args.repeats):
        order = MODES if repeat % 2 == 0 else MODES[::-1]
        for label, scenario, params in SCENARIOS:
            for mode in order:
                times[(label, mode)].append(_timed(scenario, params, mode))
        print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    width = max(len(label) for label, _, _ in SCENARIOS)
    print(f"{'scenario':<{width}}  {'spawn s':>8}  {'forkserver s':>12}  {'ratio':>6}")
    ratios, validate_fork = [], []
    for label, _, _ in SCENARIOS:
        spawn_s = statistics.median(times[(label, "spawn")])
        fork_s = statistics.median(times[(label, "forkserver")])
        ratio = spawn_s / fork_s
        ratios.append(ratio)
        if label.startswith("validate"):
            validate_fork.append(fork_s)
        print(f"{label:<{width}}  {spawn_s:8.3f}  {fork_s:12.3f}  {ratio:6.1f}")

    median_validate = statistics.median(validate_fork)
    print()
    print(
        f"forkserver one-time start cost: {start_cost:.2f} s (first world {cold:.2f} s, "
        f"warm identity world median {statistics.median(warm_identity):.3f} s)"
    )
    print(
        f"ratio spawn/forkserver: min {min(ratios):.1f}, median {statistics.median(ratios):.1f}, max {max(ratios):.1f}"
    )
    met = median_validate <= TARGET_FORKSERVER_VALIDATE_S
    print(
        f"target 1: 2-rank Trainer.validate world, forkserver median <= {TARGET_FORKSERVER_VALIDATE_S} s: "
        f"{median_validate:.3f} s over {len(validate_fork)} validate scenarios -> {'met' if met else 'NOT met'}"
    )
    met = min(ratios) >= TARGET_SPEEDUP
    print(
        f"target 2: forkserver >= {TARGET_SPEEDUP:g}x faster than spawn per scenario: "
        f"min ratio {min(ratios):.1f} -> {'met' if met else 'NOT met'}"
        f" ({sum(r >= TARGET_SPEEDUP for r in ratios)}/{len(ratios)} scenarios reach it)"
    )
    print(f"machine at the end: {_machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

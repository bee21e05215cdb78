"""What ``CollectiveGuard`` costs: overhead per checked collective and per step, W = 2 and 4, gloo.

One world per world size runs ``tests/support/guarded.py:timed_validate``: ``trainer.validate`` of a
module that syncs one logged value per batch (``self.log(..., on_step=True, sync_dist=True)``: a barrier
and an all_reduce, two Python-level collectives per step), over ``--batches`` batches, without the guard,
with the full guard and with hook boundaries only (``CollectiveGuard(collectives=False)``), alternating
for ``--repeats`` rounds. Per mode the slowest rank's median wall time is kept; then

- per step: (guarded - unguarded) / batches, for each mode;
- per checked collective: (full - boundaries only) / (collective checks of the full guard), since the two
  guarded modes differ exactly by those checks;
- a boundary check: (boundaries only - unguarded) / (boundary checks);
- the store protocol alone: 300 bare ``Exchange.check`` calls per rank after the runs (post, wait for
  every rank, read, delete), the floor under every check.

And one world per world size runs ``tests/tooling/trace/gradient_modules.py:timed_fit``: ``trainer.fit`` of
a two-layer module whose gradients DDP reduces in two buckets, ``--batches`` optimizer steps, without
the guard, with the gradient comm hook alone (ddpprobe/trace/_gradients.py, no listener), with
hook boundaries only (no comm hook) and with the full guard (every bucket checked), alternating; then

- the comm hook per step: (hook alone - unguarded) / steps;
- per checked gradient bucket: (full - boundaries only) / (the buckets the full guard's comm hook
  reduced), an upper bound of the cost of checking DDP's all-reduces bucket by bucket (the full guard
  also checks Lightning's few collectives of setup and teardown).

And one world per world size runs ``tests/support/guard_state_cost.py:timed_state``: ``trainer.fit`` of a
``Linear(1000, 1000)`` (1,001,000 parameters, SGD with momentum) for ``--state-epochs`` epochs of 2 batches per
rank, without the guard, with hook boundaries only (``collectives=False, state=False``), with boundaries and the state
checks at the boundaries only (the per-step fields turned off) and with every state check (``collectives=False,
state=True``), alternating; then

- per state check: (state at the boundaries only - boundaries only) / (the state checks: start, the first step,
  each epoch's end, end);
- the digest per boundary: the state check's own work at an epoch's end (snapshot of the contract's fields,
  the must-be-equal filter, the digest), no store request, median of 20;
- the collectives each mode's fit made (the default process group's sequence number): the state checks add none;
- the small fields at every step (optimizer settings and param-group membership, scheduler state, the loop's
  counters: ``_state.STEP_FIELDS``), which ride on each training batch's end check: their work per step measured
  alone (``_state.step_record``, the entry and its digest, median of 500; target under 1 ms at W = 2), and end to
  end, (state - state without them) / steps, which on a shared machine is within the noise of a step.

Usage (from the repository root)::

    python benchmarks/bench_guard.py                 # W = 2 and 4, 150 batches, 2 rounds: a few minutes
    python benchmarks/bench_guard.py --batches 300 --repeats 3
    python benchmarks/bench_guard.py --only state    # the state checks alone

The figures are wall times on whatever else the machine runs: on a shared machine they are upper bounds.
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
from tests.support import guard_state_cost, guarded  # noqa: E402
from tests.tooling.trace import gradient_modules  # noqa: E402


def _median_of_slowest(records: list, mode: str) -> float:
    rounds = len(records[0]["seconds"][mode])
    return statistics.median(max(rec["seconds"][mode][i] for rec in records) for i in range(rounds))


def measure(world_size: int, batches: int, repeats: int) -> dict:
    records = run_world(guarded.timed_validate, world_size, batches=batches, repeats=repeats, timeout=300).records
    t = {mode: _median_of_slowest(records, mode) for mode in guarded.TIMED_MODES}
    checks = records[0]["checks"]
    collective_checks = checks["full"] - checks["boundaries"]
    return {
        "world_size": world_size,
        "seconds": t,
        "checks": checks,
        "step_ms": {mode: (t[mode] - t["off"]) / batches * 1e3 for mode in ("full", "boundaries")},
        "unguarded_step_ms": t["off"] / batches * 1e3,
        "per_collective_ms": (t["full"] - t["boundaries"]) / collective_checks * 1e3,
        "per_boundary_ms": (t["boundaries"] - t["off"]) / checks["boundaries"] * 1e3,
        "bare_check_ms": max(rec["bare_check_s"] for rec in records) * 1e3,
    }


def measure_fit(world_size: int, batches: int, repeats: int) -> dict:
    records = run_world(gradient_modules.timed_fit, world_size, batches=batches, repeats=repeats, timeout=600).records
    t = {mode: _median_of_slowest(records, mode) for mode in gradient_modules.TIMED_MODES}
    buckets = records[0]["buckets"]["full"]
    return {
        "seconds": t,
        "buckets": buckets,
        "unguarded_step_ms": t["off"] / batches * 1e3,
        "hook_step_ms": (t["hook"] - t["off"]) / batches * 1e3,
        "full_step_ms": (t["full"] - t["off"]) / batches * 1e3,
        "per_bucket_ms": (t["full"] - t["boundaries"]) / buckets * 1e3,
    }


def measure_state(world_size: int, epochs: int, repeats: int) -> dict:
    records = run_world(
        guard_state_cost.timed_state, world_size, epochs=epochs, batches=2, repeats=repeats, timeout=600
    ).records
    t = {mode: _median_of_slowest(records, mode) for mode in guard_state_cost.MODES}
    checks, collectives = records[0]["checks"], records[0]["collectives"]
    state_checks = checks["state"] - checks["boundaries"]
    steps = epochs * 2
    return {
        "steps": steps,
        "per_step_ms": (t["state"] - t["steps_off"]) / steps * 1e3,
        "step_ms": max(rec["step_ms"] for rec in records),
        "step_fields": records[0]["step_fields"],
        "params": records[0]["params"],
        "seconds": t,
        "state_checks": state_checks,
        "collectives": collectives,
        "per_state_check_ms": (t["steps_off"] - t["boundaries"]) / state_checks * 1e3,
        "digest_ms": max(rec["digest_ms"] for rec in records),
        "fields": records[0]["fields"],
        "record_bytes": records[0]["record_bytes"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--state-epochs", type=int, default=10)
    parser.add_argument("--only", choices=["collectives", "state"], default=None)
    args = parser.parse_args(argv)
    print(
        f"CPython {platform.python_version()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
        f"{args.batches} batches, {args.repeats} rounds"
    )
    started = time.monotonic()
    for world_size in args.world_sizes:
        if args.only != "collectives":
            _print_state(world_size, measure_state(world_size, args.state_epochs, args.repeats))
        if args.only == "state":
            continue
        m = measure(world_size, args.batches, args.repeats)
        s, c = m["seconds"], m["checks"]
        print(
            f"W={world_size}: validate {s['off']:.2f} s unguarded, {s['full']:.2f} s full guard "
            f"({c['full']} checks), {s['boundaries']:.2f} s boundaries only ({c['boundaries']} checks); "
            f"unguarded step {m['unguarded_step_ms']:.2f} ms; per step +{m['step_ms']['full']:.2f} ms full, "
            f"+{m['step_ms']['boundaries']:.2f} ms boundaries only; per checked collective "
            f"{m['per_collective_ms']:.3f} ms, per boundary check {m['per_boundary_ms']:.3f} ms; "
            f"the store protocol alone {m['bare_check_ms']:.3f} ms per check"
        )
        f = measure_fit(world_size, args.batches, args.repeats)
        s = f["seconds"]
        print(
            f"W={world_size}: fit {s['off']:.2f} s unguarded, {s['hook']:.2f} s with the gradient comm hook alone, "
            f"{s['boundaries']:.2f} s boundaries only, {s['full']:.2f} s full guard ({f['buckets']} gradient "
            f"buckets checked); unguarded step {f['unguarded_step_ms']:.2f} ms; per step +{f['hook_step_ms']:.2f} ms "
            f"the comm hook alone, +{f['full_step_ms']:.2f} ms the full guard; per checked gradient bucket "
            f"{f['per_bucket_ms']:.3f} ms"
        )
    print(f"total {time.monotonic() - started:.0f} s")


def _print_state(world_size: int, m: dict) -> None:
    s, c = m["seconds"], m["collectives"]
    print(
        f"W={world_size}: state checks on {m['params']:,} parameters: fit {s['off']:.2f} s unguarded, "
        f"{s['boundaries']:.2f} s boundaries only, {s['state']:.2f} s with {m['state_checks']} state checks; "
        f"per state check {m['per_state_check_ms']:.1f} ms, of which the digest {m['digest_ms']:.1f} ms "
        f"({m['fields']} fields, a {m['record_bytes']} byte record sent only when digests differ); collectives "
        f"per fit: {c['off']} unguarded, {c['boundaries']} boundaries only, {c['state']} with the state checks"
    )
    print(
        f"W={world_size}: the small fields at every step ({m['step_fields']} fields: optimizer settings and "
        f"membership, schedulers, loop state): {m['step_ms']:.3f} ms per step measured alone (median of 500, "
        f"slowest rank); end to end {m['per_step_ms']:+.3f} ms per step over {m['steps']} steps "
        f"({s['steps_off']:.2f} s without them, {s['state']:.2f} s with them; no collective and no store request added)"
    )


if __name__ == "__main__":
    main()

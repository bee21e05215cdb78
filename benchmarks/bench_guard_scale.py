"""How ``CollectiveGuard``'s store protocol scales with the world size: today's and the previous
protocol side by side, W = 2 to 256 threads on one ``TCPStore``, then the real-run overhead at W = 2 and 4.

The simulation: one ``TCPStore`` server on 127.0.0.1 and W threads, each a client of its own (as the
ranks of a world are), each running ``Exchange.check`` on the same boundary entry ``--checks`` times.
Per check, rank 0's wall time and its own CPU time (``time.thread_time``: what the check costs the rank,
without waiting) are kept and their medians reported, with the store requests one rank makes per check
(counted by a proxy around its store; a plain ``set`` is not answered, every other request is) and the
bytes the server returns per check to all ranks together. The two protocols:

- ``previous``: each rank writes its full JSON entry, waits for all ``W`` entries of the check and reads
  them in one ``multi_get`` (ddpprobe/guard/_exchange.py before the digest protocol; kept here,
  ``_PreviousExchange``, only to compare): the server returns ``W^2`` entries per check.
- ``digest``: ddpprobe/guard/_exchange.py: a digest per rank, the last arrival sets the verdict.

The threads share one interpreter's GIL and the machine's cores: every check is a meeting of W threads,
so its wall time grows at least with the work of all W ranks (W times one rank's CPU per check, the
floor the summary prints) on these cores, whatever the protocol. The figures are upper bounds; the
growth is the point. The last line is the wall-time ratio (rank 0's median ms per check), as in the
issue that set the target.

Then ``benchmarks/bench_guard.py``'s measurement (``trainer.validate`` of a module that syncs one logged
value per step, gloo worlds) at W = 2 and 4: the added milliseconds per step of the full guard and of
hook boundaries only.

The last line: ``per-check cost W=64 / W=2: <ratio> (same run)`` for the digest protocol.

Usage (from the repository root)::

    python benchmarks/bench_guard_scale.py                      # about a minute and a half
    python benchmarks/bench_guard_scale.py --world-sizes 2 64 --checks 50 --no-real
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch.distributed as dist  # noqa: E402

from ddpprobe.guard import _entries  # noqa: E402
from ddpprobe.guard._exchange import Exchange  # noqa: E402

#: The world sizes of the simulation.
WORLD_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)


class _PreviousExchange:
    """The protocol before the digest protocol, its agreeing path only (what the comparison times): post
    the full entry under ``<n>/<rank>``, ``wait`` for all ``W`` keys of ``n``, read them in one
    ``multi_get``, compare their ``id``, delete this rank's entry of ``n - 1``."""

    def __init__(self, store, session: int, rank: int, world_size: int, timeout_s: float):
        self.store = dist.PrefixStore(f"ddpprobe-guard-previous/{session}/", store)
        self.rank, self.world_size, self.n = rank, world_size, 0
        self.timeout = datetime.timedelta(seconds=timeout_s)

    def check(self, entry: dict) -> None:
        n = self.n
        self.n += 1
        self.store.set(f"{n}/{self.rank}", json.dumps(entry))
        keys = [f"{n}/{r}" for r in range(self.world_size)]
        self.store.wait(keys, self.timeout)
        entries = [json.loads(value) for value in self.store.multi_get(keys)]
        if n > 0:
            self.store.delete_key(f"{n - 1}/{self.rank}")
        if len({json.dumps(e["id"]) for e in entries}) > 1:
            raise RuntimeError(f"check #{n}: the entries differ")


class _Counting:
    """A proxy around a store that counts the requests made through it and the bytes they return."""

    def __init__(self, store):
        self._store, self.requests, self.answered, self.bytes = store, 0, 0, 0

    def __getattr__(self, name):
        method = getattr(self._store, name)

        def call(*args):
            self.requests += 1
            self.answered += name != "set"
            value = method(*args)
            if isinstance(value, bytes):
                self.bytes += len(value)
            elif isinstance(value, list):
                self.bytes += sum(len(v) for v in value)
            return value

        return call


def simulate(protocol: str, world_size: int, checks: int, session: int) -> dict:
    """W threads on one ``TCPStore``, ``checks`` checks each; rank 0's median ms per check, the store
    requests (and answered ones) per rank per check, and the bytes returned per check to all ranks."""
    timeout = datetime.timedelta(seconds=120)
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout, wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=timeout) for _ in range(world_size)]
    if protocol == "digest":
        exchanges = [Exchange(c, session, r, world_size, 120.0, 240.0, "benchmark") for r, c in enumerate(clients)]
    else:
        exchanges = [_PreviousExchange(c, session, r, world_size, 120.0) for r, c in enumerate(clients)]
    for ex in exchanges:
        ex.store = _Counting(ex.store)
    start = threading.Barrier(world_size)
    times, cpu, errors = [], [], []

    def run(ex):
        try:
            start.wait()
            for i in range(checks):
                t, c = time.perf_counter(), time.thread_time()
                ex.check(_entries.boundary(ex.n, ex.rank, "on_train_batch_start", 0, i))
                if ex.rank == 0:
                    times.append(time.perf_counter() - t)
                    cpu.append(time.thread_time() - c)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(ex,)) for ex in exchanges]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    stores = [ex.store for ex in exchanges]
    return {
        "ms": statistics.median(times) * 1e3,
        "cpu_ms": statistics.median(cpu) * 1e3,
        "requests": sum(s.requests for s in stores) / world_size / checks,
        "answered": sum(s.answered for s in stores) / world_size / checks,
        "bytes": sum(s.bytes for s in stores) / checks,
    }


def real_run(world_sizes: list, batches: int, repeats: int) -> dict:
    """benchmarks/bench_guard.py's ``measure`` at each world size (gloo worlds of ``trainer.validate``)."""
    import bench_guard

    return {w: bench_guard.measure(w, batches, repeats) for w in world_sizes}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=list(WORLD_SIZES))
    parser.add_argument("--checks", type=int, default=20)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-real", action="store_true", help="skip the real-run overhead (gloo worlds)")
    args = parser.parse_args(argv)
    if 2 not in args.world_sizes or 64 not in args.world_sizes:
        parser.error("--world-sizes must hold 2 and 64 (the ratio of the last line)")
    print(
        f"CPython {platform.python_version()}, {os.cpu_count()} cores, load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.checks} checks per world size"
    )
    started = time.monotonic()
    results = {}
    print(
        "| W | previous: ms per check | digest: ms per check | previous: rank 0's CPU ms | digest: rank 0's CPU ms "
        "| previous: requests per rank (answered) | digest: requests per rank (answered) "
        "| previous: bytes returned per check | digest: bytes returned per check |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for session, w in enumerate(args.world_sizes):
        results[w] = {p: simulate(p, w, args.checks, session) for p in ("previous", "digest")}
        prev, new = results[w]["previous"], results[w]["digest"]
        print(
            f"| {w} | {prev['ms']:.3f} | {new['ms']:.3f} | {prev['cpu_ms']:.3f} | {new['cpu_ms']:.3f} "
            f"| {prev['requests']:.1f} ({prev['answered']:.1f}) "
            f"| {new['requests']:.1f} ({new['answered']:.1f}) | {prev['bytes']:,.0f} | {new['bytes']:,.0f} |",
            flush=True,
        )
    if not args.no_real:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        for w, m in real_run([2, 4], args.batches, args.repeats).items():
            print(
                f"real run W={w}: unguarded step {m['unguarded_step_ms']:.2f} ms; per step "
                f"+{m['step_ms']['full']:.2f} ms full guard ({m['checks']['full'] / args.batches:.0f} checks), "
                f"+{m['step_ms']['boundaries']:.2f} ms hook boundaries only "
                f"({m['checks']['boundaries'] / args.batches:.0f} checks); the store protocol alone "
                f"{m['bare_check_ms']:.3f} ms per check",
                flush=True,
            )
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; total {time.monotonic() - started:.0f} s")
    ratio = {p: {k: results[64][p][k] / results[2][p][k] for k in ("ms", "cpu_ms")} for p in ("previous", "digest")}
    floor = 64 * results[64]["digest"]["cpu_ms"] / results[2]["digest"]["ms"]
    print(
        f"previous protocol W=64 / W=2: wall {ratio['previous']['ms']:.1f}, "
        f"rank 0's CPU {ratio['previous']['cpu_ms']:.1f}; "
        f"digest protocol: rank 0's CPU {ratio['digest']['cpu_ms']:.2f}; a W=64 check of 64 threads on one GIL "
        f"costs at least 64 x rank 0's CPU = {floor:.1f} x the W=2 check"
    )
    print(f"per-check cost W=64 / W=2: {ratio['digest']['ms']:.2f} (same run)")


if __name__ == "__main__":
    main()

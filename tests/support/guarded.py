"""Scenarios for the guard's tests: the hazards of tests/facts/test_collective_hazards_*.py and
tests/facts/test_uneven_shards.py, run with ``CollectiveGuard`` in the Trainer (``guard=True``) or without it.

They reuse the facts' LightningModules (ddpprobe/probes/hazards.py, ddpprobe/probes/iterable.py), so the
guarded run is the same run the facts describe. Every record also holds ``pg_seq``, the default process
group's sequence number after the run less the one before it (how many collectives the backend ran
in the run), and ``checks``, the number
of checks the guard passed on this rank (None without the guard). They live in the test tree, outside
the ``ddpprobe`` package, so the ``self.log`` call sites of ``RankKeyModule`` read as a user's code would.
"""

import os
import time

import torch
from torch.utils.data import DataLoader

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes import collectives, hazards, iterable
from ddpprobe.probes.common import ddp_trainer, floats, id_loader, seed_everything
from ddpprobe.trace import pg_seq


def _guard(guard: bool, guard_timeout, collectives: bool = True) -> list:
    return [CollectiveGuard(timeout=guard_timeout, collectives=collectives)] if guard else []


def _record(trainer, callbacks: list, pg_seq_before, **fields) -> dict:
    guard = next((c for c in callbacks if isinstance(c, CollectiveGuard)), None)
    return {
        "callback_metrics": floats(trainer.callback_metrics),
        "pg_seq": pg_seq() - (pg_seq_before or 0),
        "checks": None if guard is None else guard.checks,
        **fields,
    }


def log_keys(
    info, n: int, batch_size: int, step_plan=None, epoch_end_plan=None, guard=True, guard_timeout=None
) -> dict:
    """Scenario: ``hazards.log_keys`` (a ``KeyPlanProbe`` validated over ``IdDataset(n)``), with the guard.

    Record keys: ``callback_metrics``, ``seen_ids``, ``pg_seq``, ``checks``."""
    empty = [[] for _ in range(info.world_size)]
    step = [[(k, float(v)) for k, v in row] for row in (step_plan or empty)]
    epoch_end = [[(k, float(v)) for k, v in row] for row in (epoch_end_plan or empty)]
    model = hazards.KeyPlanProbe(step, epoch_end)
    callbacks = _guard(guard, guard_timeout)
    before = pg_seq()
    trainer = ddp_trainer(info, callbacks=callbacks)
    trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return _record(trainer, callbacks, before, seen_ids=model.seen_ids)


class RankKeyModule(pl.LightningModule):
    """Logs its rank's number under ``f"loss_rank{rank}"`` with ``sync_dist=True`` in every
    ``validation_step``: keys named after the rank, logged from this file (the call site the guard names)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def validation_step(self, batch, batch_idx):
        self.log(f"loss_rank{self.global_rank}", float(self.global_rank), sync_dist=True, batch_size=len(batch["id"]))


def rank_keys(info, n: int = 4, batch_size: int = 2) -> dict:
    """Scenario: ``trainer.validate`` a ``RankKeyModule`` with the guard. Record: ``callback_metrics`` ..."""
    callbacks = _guard(True, None)
    before = pg_seq()
    trainer = ddp_trainer(info, callbacks=callbacks)
    trainer.validate(RankKeyModule(), dataloaders=id_loader(n, batch_size), verbose=False)
    return _record(trainer, callbacks, before)


def metric_compute(info, where: str, n: int, batch_size: int, guard=True) -> dict:
    """Scenario: ``hazards.metric_compute`` (``MeanMetric.compute()`` on rank 0 only or on every rank).

    Record keys: ``computed``, ``seen_ids``, ``callback_metrics``, ``pg_seq``, ``checks``."""
    model = hazards.MeanComputeProbe(where)
    callbacks = _guard(guard, None)
    before = pg_seq()
    trainer = ddp_trainer(info, callbacks=callbacks)
    trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return _record(trainer, callbacks, before, computed=model.computed, seen_ids=model.seen_ids)


def monitor_rank0_key(info, callback: str, values: list, every_rank: bool = False, guard=True) -> dict:
    """Scenario: ``hazards.monitor_rank0_key`` (fit a ``Rank0KeyRegressor`` with ``ModelCheckpoint`` or
    ``EarlyStopping`` monitoring ``hazards.MONITORED``, 2 samples per rank in batches of 2), with the guard.

    Record keys: ``epochs_run``, ``files``, ``best_model_score``, ``stopped_epoch``, ``callback_metrics``,
    ``pg_seq``, ``checks``."""
    model = hazards.Rank0KeyRegressor(values, rank_zero_only=False, every_rank=every_rank)
    if callback == "checkpoint":
        watcher = pl.callbacks.ModelCheckpoint(
            dirpath=os.path.join(info.rank_dir, "checkpoints"), monitor=hazards.MONITORED, mode="min", save_top_k=1
        )
    else:
        watcher = pl.callbacks.EarlyStopping(monitor=hazards.MONITORED, mode="min", patience=1)
    loader = id_loader(2 * info.world_size, 2)
    callbacks = [watcher] + _guard(guard, None)
    before = pg_seq()
    trainer = ddp_trainer(
        info,
        max_epochs=len(values),
        callbacks=callbacks,
        num_sanity_val_steps=0,
        enable_checkpointing=callback == "checkpoint",
    )
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=loader)
    files = sorted(
        os.path.relpath(os.path.join(root, name), info.world_dir)
        for root, _, names in os.walk(info.world_dir)
        for name in names
        if name.endswith(".ckpt")
    )
    score = getattr(watcher, "best_model_score", None)
    return _record(
        trainer,
        callbacks,
        before,
        epochs_run=model.epochs_run,
        files=files,
        best_model_score=None if score is None else float(score),
        stopped_epoch=getattr(watcher, "stopped_epoch", None),
    )


def _iterable_loader(n: int, batch_size: int, shard: str) -> DataLoader:
    return DataLoader(iterable.IdIterable(n, shard), batch_size=batch_size)


def validate_iterable(info, n: int, shard: str, plan: list, guard=True, collectives=True) -> dict:
    """Scenario: ``iterable.validate_iterable`` (an ``IterableProbe(plan)`` over ``IdIterable(n, shard)`` in
    batches of 1), with the guard. Record keys: ``seen_ids``, ``logged_metrics``, ``callback_metrics``,
    ``pg_seq``, ``checks``."""
    model = iterable.IterableProbe(plan=plan)
    callbacks = _guard(guard, None, collectives)
    before = pg_seq()
    trainer = ddp_trainer(info, callbacks=callbacks)
    trainer.validate(model, dataloaders=_iterable_loader(n, 1, shard), verbose=False)
    return _record(trainer, callbacks, before, seen_ids=model.seen_ids, logged_metrics=floats(trainer.logged_metrics))


def fit_iterable(info, n: int, shard: str, plan: list = (), guard=True, collectives=True) -> dict:
    """Scenario: ``iterable.fit_iterable`` (one epoch of an ``IterableProbe(plan)`` over ``IdIterable(n,
    shard)`` in batches of 1, no validation; weights seeded with 0), with the guard. Record keys:
    ``seen_ids``, ``global_step``, ``weights`` (the layer's parameters after the fit), ``callback_metrics``,
    ``pg_seq``, ``checks``."""
    seed_everything(0)
    model = iterable.IterableProbe(plan=plan)
    callbacks = _guard(guard, None, collectives)
    before = pg_seq()
    trainer = ddp_trainer(info, max_epochs=1, limit_val_batches=0, callbacks=callbacks)
    trainer.fit(model, train_dataloaders=_iterable_loader(n, 1, shard))
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    return _record(
        trainer, callbacks, before, seen_ids=model.seen_ids, global_step=trainer.global_step, weights=weights
    )


class SlowRankModule(pl.LightningModule):
    """In ``validation_step`` of batch 0, rank ``slow_rank`` sleeps ``sleep_s`` seconds (slow code, or a
    rank stuck where Python cannot see), then every rank logs ``v`` with ``sync_dist=True``."""

    def __init__(self, slow_rank: int, sleep_s: float):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.slow_rank = slow_rank
        self.sleep_s = sleep_s

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0 and self.global_rank == self.slow_rank:
            time.sleep(self.sleep_s)
        self.log("v", batch["value"].float().mean(), sync_dist=True, batch_size=len(batch["id"]))


def slow_rank(info, slow_rank: int, sleep_s: float, guard_timeout: float, n: int = 4, batch_size: int = 1) -> dict:
    """Scenario: ``trainer.validate`` a ``SlowRankModule`` with ``CollectiveGuard(timeout=guard_timeout)``."""
    callbacks = _guard(True, guard_timeout)
    before = pg_seq()
    trainer = ddp_trainer(info, callbacks=callbacks)
    trainer.validate(SlowRankModule(slow_rank, sleep_s), dataloaders=id_loader(n, batch_size), verbose=False)
    return _record(trainer, callbacks, before)


def validate_keys_boundaries_only(info, n: int, batch_size: int, step_plan: list) -> dict:
    """Scenario: ``log_keys`` under ``CollectiveGuard(collectives=False)`` (hook boundaries only)."""
    model = hazards.KeyPlanProbe([[(k, float(v)) for k, v in row] for row in step_plan], [[]] * info.world_size)
    callbacks = _guard(True, None, collectives=False)
    before = pg_seq()
    trainer = ddp_trainer(info, callbacks=callbacks)
    trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return _record(trainer, callbacks, before, seen_ids=model.seen_ids)


class StepSyncModule(pl.LightningModule):
    """Logs ``v`` (the batch's mean value) with ``on_step=True, on_epoch=False, sync_dist=True`` in every
    ``validation_step``: two Python-level collectives per batch (``_sync_ddp``'s barrier and all_reduce)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def validation_step(self, batch, batch_idx):
        self.log("v", batch["value"].float().mean(), on_step=True, on_epoch=False, sync_dist=True, batch_size=1)


#: What ``timed_validate`` runs, per repeat: no guard, the full guard, the hook boundaries only.
TIMED_MODES = ("off", "full", "boundaries")


def timed_validate(info, batches: int, repeats: int) -> dict:
    """Scenario for benchmarks/bench_guard.py: ``trainer.validate`` a ``StepSyncModule`` over ``batches``
    batches of 1 sample, once per mode of ``TIMED_MODES`` in each of ``repeats`` rounds (the order turns
    every round), after one unguarded warm-up run. Before each run the ranks meet in a barrier.

    Record keys: ``seconds`` (``{mode: [wall seconds of trainer.validate per round]}``), ``checks``
    (``{mode: checks the guard passed in one run}``), ``pg_seq`` (collectives the backend ran, in all),
    ``bare_check_s`` (seconds per check of the store protocol alone, 300 checks after the runs)."""
    seconds = {mode: [] for mode in TIMED_MODES}
    checks = {}
    loader = id_loader(batches * info.world_size, 1)
    for round_ in range(-1, repeats):
        modes = TIMED_MODES if round_ % 2 == 0 else TIMED_MODES[::-1]
        for mode in modes if round_ >= 0 else ("off",):
            callbacks = [] if mode == "off" else [CollectiveGuard(collectives=mode == "full")]
            trainer = ddp_trainer(info, callbacks=callbacks)
            if torch.distributed.is_initialized():
                torch.distributed.barrier()
            start = time.perf_counter()
            trainer.validate(StepSyncModule(), dataloaders=loader, verbose=False)
            if round_ >= 0:
                seconds[mode].append(time.perf_counter() - start)
                checks[mode] = callbacks[0].checks if callbacks else 0
    return {"seconds": seconds, "checks": checks, "pg_seq": pg_seq(), "bare_check_s": _bare_checks(info, 300)}


def _bare_checks(info, count: int) -> float:
    """Seconds per check of ``count`` checks of the guard's store protocol alone (``Exchange.check`` of a
    boundary entry, no Lightning, no classification), after a barrier."""
    from ddpprobe.guard import _entries
    from ddpprobe.guard._exchange import Exchange

    store = torch.distributed.distributed_c10d._get_default_store()
    exchange = Exchange(store, -1, info.rank, info.world_size, 60.0, info.pg_timeout, "benchmark")
    torch.distributed.barrier()
    start = time.perf_counter()
    for i in range(count):
        exchange.check(_entries.boundary(exchange.n, info.rank, "benchmark", 0, i))
    return (time.perf_counter() - start) / count


def gather_rows(info, action: str, guard=True) -> dict:
    """Scenario: ``collectives.collective``'s ``CollectiveProbe(action)`` (``"uneven"``: ``self.all_gather``
    of ``r + 1`` rows on rank ``r``; ``"pad_trim"``: the same rows padded, gathered and trimmed) with the
    guard. Record keys: ``result`` (what the probe gathered), ``callback_metrics``, ``pg_seq``, ``checks``."""
    model = collectives.CollectiveProbe(action)
    callbacks = _guard(guard, None)
    before = pg_seq()
    trainer = ddp_trainer(info, callbacks=callbacks)
    trainer.validate(model, dataloaders=id_loader(info.world_size, 1), verbose=False)
    return _record(trainer, callbacks, before, result=model.result)

"""Scenario for benchmarks/bench_guard.py: what the guard's state checks (ddpprobe/guard/_state.py) cost on a
module of about a million parameters, and that they add no collective."""

import json
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard, _entries, _exchange, _state
from ddpprobe.probes.common import ddp_trainer, seed_everything
from ddpprobe.trace import pg_seq

#: The layer's width: ``Linear(WIDTH, WIDTH)`` holds WIDTH * WIDTH + WIDTH parameters (1,001,000).
WIDTH = 1000
#: What ``timed_state`` runs, per repeat: no guard, the hook boundaries alone, the boundaries and the state checks
#: without the small fields at every step, and with them (``CollectiveGuard(collectives=False)``, the default).
MODES = ("off", "boundaries", "steps_off", "state")


class WideModule(pl.LightningModule):
    """One ``Linear(WIDTH, WIDTH)`` trained with SGD and momentum (so the optimizer holds a state per parameter)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(WIDTH, WIDTH)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def _guard(mode: str) -> list:
    if mode == "off":
        return []
    guard = CollectiveGuard(collectives=False, state=mode != "boundaries")
    if mode == "steps_off":
        guard._step_fields = ()  # the state checks at the boundaries only, as before the per-step check
    return [guard]


def timed_state(info, epochs: int, batches: int, repeats: int, digests: int = 20, steps: int = 500) -> dict:
    """``trainer.fit(WideModule())`` for ``epochs`` epochs of ``batches`` batches of 4 samples per rank, once per
    mode of ``MODES`` in each of ``repeats`` rounds (the order turns every round), after one unguarded warm-up.
    Then ``digests`` times the state check's own work at an epoch's end on the last Trainer: the snapshot, the
    contract's must-be-equal filter and the digest (``_state.take`` and ``_state.entry``), no store request; and
    ``steps`` times the work the small fields add to every training batch's end check (``_state.step_record``, the
    boundary entry and its digest: the store requests are the boundary's own).

    Record keys: ``params``; ``seconds`` (``{mode: [wall seconds of trainer.fit per round]}``); ``checks``
    (``{mode: checks the guard passed in one run}``); ``collectives`` (``{mode: how far the default process
    group's sequence number moved in one run}``); ``digest_ms`` (per boundary, median of ``digests``);
    ``step_ms`` (the small fields' work per batch, median of ``steps``); ``step_fields`` (how many);
    ``fields`` (fields compared there) and ``record_bytes`` (the record's JSON: what crosses the store only when
    the digests differ)."""
    x = torch.randn(batches * 4 * info.world_size, WIDTH, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x), batch_size=4)
    seconds = {mode: [] for mode in MODES}
    checks, collectives = {}, {}
    for round_ in range(-1, repeats):
        modes = MODES if round_ % 2 == 0 else MODES[::-1]
        for mode in modes if round_ >= 0 else ("off",):
            seed_everything(0)
            model, callbacks = WideModule(), _guard(mode)
            trainer = ddp_trainer(info, max_epochs=epochs, limit_val_batches=0, callbacks=callbacks)
            if torch.distributed.is_initialized():
                torch.distributed.barrier()
            before, start = pg_seq(), time.perf_counter()
            trainer.fit(model, train_dataloaders=loader)
            if round_ >= 0:
                seconds[mode].append(time.perf_counter() - start)
                checks[mode] = callbacks[0].checks if callbacks else 0
                collectives[mode] = pg_seq() - (before or 0)
    step_times = []
    fields = _state.step_fields(_state.DEFAULT_FIELDS)
    for _ in range(steps):
        start = time.perf_counter()
        record = _state.step_record(trainer, model, fields)
        _exchange.digest(_entries.boundary(0, info.rank, "on_train_batch_end", 0, 0, 0, False, record))
        step_times.append(time.perf_counter() - start)
    times = []
    for _ in range(digests):
        start = time.perf_counter()
        record = _state.take(trainer, model, "train_epoch_end", "on_train_epoch_end", _state.DEFAULT_FIELDS)
        _state.entry(0, info.rank, record)
        times.append(time.perf_counter() - start)
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "seconds": seconds,
        "checks": checks,
        "collectives": collectives,
        "digest_ms": sorted(times)[len(times) // 2] * 1e3,
        "step_ms": sorted(step_times)[len(step_times) // 2] * 1e3,
        "step_fields": len(_state.step_record(trainer, model, fields)["fields"]),
        "fields": len(record["fields"]),
        "record_bytes": len(json.dumps(record)),
    }

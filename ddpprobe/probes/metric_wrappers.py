"""The torchmetrics-wrappers probe: ``Running`` over a base metric and ``MetricCollection`` compute groups
under DDP, with the state syncs and backend collectives one ``compute()`` makes.

=====================  ==========================================================================
scenario               what each rank does in ``trainer.validate`` over ``IdDataset(n)``
=====================  ==========================================================================
``running``            updates ``Running(SumMetric(sync_on_compute=...), window)`` with each batch's
                       summed ``value`` (``id ** 2``), then calls ``compute()`` in
                       ``on_validation_epoch_end``
``collection``         updates ``MetricCollection([BinaryPrecision(), BinaryRecall(),
                       BinaryF1Score()], compute_groups=...)`` with each batch's ``pred`` and
                       ``target``, then calls ``compute()`` in ``on_validation_epoch_end``
=====================  ==========================================================================

Around ``compute()`` the probe counts the metric state syncs (calls of ``Metric._sync_dist``, the
method that all-gathers one metric's states, patched on the class for the run and restored after) and
the backend's collectives (``ddpprobe.trace.pg_seq`` before and after).

Sources: torchmetrics/wrappers/running.py ``Running.compute``; torchmetrics/wrappers/abstract.py
``WrapperMetric`` (its ``_wrap_compute`` does not sync); torchmetrics/metric.py ``Metric._wrap_compute``,
``Metric.sync``, ``Metric._sync_dist``; torchmetrics/collections.py ``MetricCollection.compute``,
``_compute_and_reduce``, ``_merge_compute_groups``, ``_compute_groups_create_state_ref``;
torchmetrics/utilities/distributed.py ``gather_all_tensors``.
"""

from __future__ import annotations

import contextlib

import torch
from torchmetrics import Metric, MetricCollection, SumMetric
from torchmetrics.classification import BinaryF1Score, BinaryPrecision, BinaryRecall
from torchmetrics.wrappers import Running

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, id_loader
from ddpprobe.trace import pg_seq

#: The collection's metrics, by the names ``MetricCollection`` gives them.
COLLECTION = ("BinaryPrecision", "BinaryRecall", "BinaryF1Score")


@contextlib.contextmanager
def counted_state_syncs():
    """Count every ``Metric._sync_dist`` call (one per metric whose states are all-gathered) inside the
    block; yields a list that receives the class name of each synced metric."""
    original = Metric._sync_dist
    synced: list = []

    def counting(self, *args, **kwargs):
        synced.append(type(self).__name__)
        return original(self, *args, **kwargs)

    Metric._sync_dist = counting
    try:
        yield synced
    finally:
        Metric._sync_dist = original


class WrappersProbe(pl.LightningModule):
    """Updates ``self.metric`` in every ``validation_step`` and calls ``compute()`` once in
    ``on_validation_epoch_end``, recording ``seen_ids``, ``computed`` (a float, or ``{name: float}`` for a
    collection), ``state_syncs`` (class names of the metrics ``Metric._sync_dist`` ran for) and
    ``collectives`` (backend collectives the ``compute()`` ran, from ``pg_seq``)."""

    def __init__(self, metric, kind: str):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.metric, self.kind = metric, kind
        self.seen_ids: list = []
        self.computed = None
        self.state_syncs = None
        self.collectives = None

    def validation_step(self, batch, batch_idx):
        self.seen_ids.append(batch_ids(batch))
        if self.kind == "running":
            self.metric.update(batch["value"].sum())
        else:
            self.metric.update(batch["pred"], batch["target"])

    def on_validation_epoch_end(self):
        before = pg_seq()
        with counted_state_syncs() as synced:
            computed = self.metric.compute()
        after = pg_seq()
        self.state_syncs = synced
        self.collectives = None if before is None or after is None else after - before
        if isinstance(computed, dict):
            self.computed = {k: float(v) for k, v in sorted(computed.items())}
        else:
            self.computed = float(computed)


def running(info: RankInfo, sync_on_compute: bool, window: int = 2, n: int = 12, batch_size: int = 2) -> dict:
    """Scenario: ``Running(SumMetric(sync_on_compute=sync_on_compute), window=window)`` updated with each
    batch's summed ``value``, then ``compute()`` on every rank.

    Record keys: ``seen_ids``, ``computed``, ``state_syncs``, ``collectives`` (see ``WrappersProbe``),
    ``wrapper_sync_on_compute`` (the ``Running`` object's own flag).
    """
    metric = Running(SumMetric(sync_on_compute=sync_on_compute), window=window)
    model = WrappersProbe(metric, "running")
    ddp_trainer(info).validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {
        "seen_ids": model.seen_ids,
        "computed": model.computed,
        "state_syncs": model.state_syncs,
        "collectives": model.collectives,
        "wrapper_sync_on_compute": metric.sync_on_compute,
    }


def collection(info: RankInfo, compute_groups: bool, n: int = 14, batch_size: int = 2) -> dict:
    """Scenario: ``MetricCollection([BinaryPrecision(), BinaryRecall(), BinaryF1Score()],
    compute_groups=compute_groups)`` updated with each batch's ``pred`` and ``target``, then ``compute()``
    on every rank.

    Record keys: ``seen_ids``, ``computed`` (``{metric name: float}``), ``state_syncs``, ``collectives``,
    ``groups`` (``MetricCollection.compute_groups`` after the updates: ``{group: [metric names]}``),
    ``states`` (``{metric name: number of states}``, each a tensor that ``_sync_dist`` all-gathers).
    """
    metrics = MetricCollection([BinaryPrecision(), BinaryRecall(), BinaryF1Score()], compute_groups=compute_groups)
    model = WrappersProbe(metrics, "collection")
    ddp_trainer(info).validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {
        "seen_ids": model.seen_ids,
        "computed": model.computed,
        "state_syncs": model.state_syncs,
        "collectives": model.collectives,
        "groups": {str(k): list(v) for k, v in metrics.compute_groups.items()},
        "states": {name: len(m._defaults) for name, m in metrics.items(keep_base=True, copy_state=False)},
    }

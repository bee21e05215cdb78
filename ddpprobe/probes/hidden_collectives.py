"""The hidden-collectives probe: code that looks local but runs a collective, on some ranks only or a
different number of times per rank.

=========================  ==========================================================================
scenario                   what each rank does
=========================  ==========================================================================
``metrics_read``           logs ``value`` with ``sync_dist=True`` and reads ``trainer.callback_metrics``
                           (or ``logged_metrics``, ``progress_bar_metrics``) in a hook, on every rank
                           or under ``if trainer.is_global_zero:``, optionally followed by a collective
                           of its own on every rank; with or without the default progress bar
``list_state``             a torchmetrics metric with list states updated a different number of times
                           per rank (some never), then ``compute()``: a ``Metric`` with one list state
                           (``dist_reduce_fx="cat"`` or ``None``), a ``CatMetric`` or a
                           ``BinaryAUROC(thresholds=None)``
``all_gather_leaves``      ``self.all_gather`` of a dict holding a tensor, a Python float, an int, a
                           bool, a NumPy array and a list of strings; and ``all_gather_object`` of it
``half_precision``         logs a float16 value with ``sync_dist=True`` (step and epoch) and
                           all_reduces the same float16 tensor with ``torch.distributed.all_reduce``
=========================  ==========================================================================

The numbers each rank contributes are pure functions of its rank (``local_extra``, ``list_item``,
``half_value``) or of the sample ids of its ``DistributedSampler`` shard, so a fact computes every
expected value without Lightning. Collectives are counted with ``trace.CollectiveTrace``, which wraps
``torch.distributed``'s Python functions (written before the call enters the backend), so a record says
how many collectives a read of a metrics property ran and which.

When a peer's failure makes the launcher raise, a fact reads what the ranks that completed got from
``WorldError.records``.

Sources: pytorch_lightning/trainer/connectors/logger_connector/logger_connector.py
``_LoggerConnector.metrics``, ``callback_metrics``, ``logged_metrics``, ``progress_bar_metrics``,
``epoch_end_reached``; .../logger_connector/result.py ``_ResultCollection.metrics``, ``_get_cache``,
``_ResultMetric.update``, ``_ResultMetric.compute``; pytorch_lightning/loops/fit_loop.py
``_FitLoop.on_advance_end``; pytorch_lightning/loops/evaluation_loop.py ``_on_evaluation_epoch_end``;
pytorch_lightning/callbacks/progress/progress_bar.py ``ProgressBar.setup``, ``get_metrics``;
.../progress/tqdm_progress.py ``TQDMProgressBar.on_train_epoch_end``; torchmetrics/metric.py
``Metric._sync_dist``; torchmetrics/utilities/distributed.py ``gather_all_tensors``;
pytorch_lightning/core/module.py ``LightningModule.all_gather``; lightning_fabric/utilities/apply_func.py
``convert_to_tensors``.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed
from torchmetrics import CatMetric, Metric, SumMetric
from torchmetrics.classification import BinaryAUROC

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, floats, id_loader, recorded_warnings
from ddpprobe.trace import CollectiveTrace, read_trace

#: Where ``MetricsReadProbe`` reads a metrics property: the stage it runs (``fit`` or ``validate``) and hook.
READ_WHERE = {
    "on_train_epoch_end": "fit",
    "on_validation_epoch_end": "validate",
    "training_step": "fit",
}

#: Who reads: every rank, global rank 0 only (``if trainer.is_global_zero:``), or nobody.
READERS = ("every_rank", "rank0", "nobody")

#: The collective every rank runs after the read (``"nothing"``: none). See ``MetricsReadProbe``.
THEN = ("nothing", "reduce", "metric_compute", "all_gather")

#: The Trainer's metrics properties.
PROPERTIES = ("callback_metrics", "logged_metrics", "progress_bar_metrics")

#: The key ``MetricsReadProbe`` logs in its step, and the key it logs in the hook (``log_in_hook=True``).
KEY, HOOK_KEY = "value", "hook_value"


def local_extra(rank: int) -> float:
    """The number rank ``rank`` reduces or all-gathers after the read: ``1000 * (rank + 1)``."""
    return 1000.0 * (rank + 1)


def hook_value(rank: int) -> float:
    """The number rank ``rank`` logs as ``HOOK_KEY`` in the hook: ``0.5 * (rank + 1)``."""
    return 0.5 * (rank + 1)


class MetricsReadProbe(pl.LightningModule):
    """Logs ``KEY`` = the batch's summed ``value`` with ``on_step=False, on_epoch=True, sync_dist=True,
    reduce_fx="sum"`` in ``training_step`` (fit) or ``validation_step`` (validate), updates a
    ``SumMetric`` with the batch's sample ids, and in the hook ``where`` runs:

    .. code-block:: python

        if reader == "every_rank" or (reader == "rank0" and self.trainer.is_global_zero):
            self.read = dict(getattr(self.trainer, prop))       # e.g. trainer.callback_metrics
        if then == "reduce":         self.then_value = self.trainer.strategy.reduce(local_extra(rank), "sum")
        if then == "metric_compute": self.then_value = self.ids.compute()
        if then == "all_gather":     self.then_value = self.all_gather(local_extra(rank))

    (``training_step`` reads on batch 0 only: mid-epoch.) With ``read_first=True`` the hook first reads
    ``trainer.callback_metrics`` on every rank (the fix), before all of the above. With
    ``log_in_hook=True`` it first logs ``HOOK_KEY`` = ``hook_value(rank)`` there (``sync_dist=True``,
    ``reduce_fx="sum"``).

    The logged epoch value is one sync (``reduce_fx="sum"``): a barrier and an all_reduce
    (lightning_fabric/utilities/distributed.py ``_sync_ddp``); ``strategy.reduce`` is the same pair;
    ``SumMetric.compute()`` a barrier and an all_gather (``gather_all_tensors``); ``self.all_gather``
    one all_gather.
    """

    def __init__(
        self,
        where: str,
        reader: str,
        then: str,
        prop: str = "callback_metrics",
        read_first: bool = False,
        log_in_hook: bool = False,
    ):
        super().__init__()
        for name, value, allowed in (
            ("where", where, tuple(READ_WHERE)),
            ("reader", reader, READERS),
            ("then", then, THEN),
            ("prop", prop, PROPERTIES),
        ):
            if value not in allowed:
                raise ValueError(f"MetricsReadProbe({name}={value!r}): use one of {allowed}")
        self.layer = torch.nn.Linear(2, 1)
        self.ids = SumMetric()
        self.where, self.reader, self.then, self.prop, self.read_first = where, reader, then, prop, read_first
        self.log_in_hook = log_in_hook
        self.trace = None
        self.read = None
        self.read_seqs = None
        self.first_read_seqs = None
        self.then_value = None
        self.seen_ids: list = []

    def _step(self, batch):
        ids = batch_ids(batch)
        self.seen_ids.append(ids)
        self.ids.update(batch["id"].float())
        self.log(KEY, batch["value"].sum(), on_step=False, on_epoch=True, sync_dist=True, reduce_fx="sum")

    def training_step(self, batch, batch_idx):
        self._step(batch)
        if self.where == "training_step" and batch_idx == 0:
            self._read_then()
        return self.layer(batch["x"] / 100.0).square().mean()

    def validation_step(self, batch, batch_idx):
        self._step(batch)

    def on_train_epoch_end(self):
        if self.where == "on_train_epoch_end":
            self._read_then()

    def on_validation_epoch_end(self):
        if self.where == "on_validation_epoch_end":
            self._read_then()

    def _read_then(self):
        if self.log_in_hook:
            value = torch.tensor(hook_value(self.global_rank))
            self.log(HOOK_KEY, value, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="sum")
        if self.read_first:
            first = self.trace.collectives_seen
            dict(self.trainer.callback_metrics)
            self.first_read_seqs = [first, self.trace.collectives_seen]
        before = self.trace.collectives_seen
        if self.reader == "every_rank" or (self.reader == "rank0" and self.trainer.is_global_zero):
            self.read = floats(getattr(self.trainer, self.prop))
        self.read_seqs = [before, self.trace.collectives_seen]
        extra = torch.tensor(local_extra(self.global_rank))
        if self.then == "reduce":
            self.then_value = float(self.trainer.strategy.reduce(extra, reduce_op="sum"))
        elif self.then == "metric_compute":
            self.then_value = float(self.ids.compute())
        elif self.then == "all_gather":
            self.then_value = self.all_gather(extra).tolist()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def metrics_read(
    info: RankInfo,
    where: str,
    reader: str,
    then: str,
    n: int,
    batch_size: int,
    prop: str = "callback_metrics",
    progress_bar: bool = False,
    read_first: bool = False,
    log_in_hook: bool = False,
) -> dict:
    """Scenario: ``trainer.fit`` (one epoch, no validation) or ``trainer.validate`` a ``MetricsReadProbe``
    over ``IdDataset(n)`` in batches of ``batch_size``.

    Args:
        where, reader, then, prop, read_first, log_in_hook: see ``MetricsReadProbe``.
        progress_bar: ``enable_progress_bar`` (the default ``TQDMProgressBar``; enabled on global rank 0
            only, ``ProgressBar.setup``).

    Record keys: ``read`` (``{key: float}`` the read returned here, None where this rank did
    not read), ``read_collectives`` (the ``torch.distributed`` calls the read ran: ``[op, ...]``),
    ``first_read_collectives`` (those the ``read_first`` read of ``callback_metrics`` ran; ``[]`` without it),
    ``then_value`` (what the collective
    after the read returned: a float, or a list for ``all_gather``), ``callback_metrics`` (after the run),
    ``seen_ids``.
    """
    stage = READ_WHERE.get(where)
    if stage is None:
        raise ValueError(f"where={where!r}: use one of {tuple(READ_WHERE)}")
    model = MetricsReadProbe(where, reader, then, prop=prop, read_first=read_first, log_in_hook=log_in_hook)
    path = os.path.join(info.rank_dir, "collectives.jsonl")
    loader = id_loader(n, batch_size)
    with CollectiveTrace(path, model) as trace:
        model.trace = trace
        trainer = ddp_trainer(info, enable_progress_bar=progress_bar, max_epochs=1, num_sanity_val_steps=0)
        if stage == "fit":
            trainer.fit(model, train_dataloaders=loader)
        else:
            trainer.validate(model, dataloaders=loader, verbose=False)
    events = [e for e in read_trace(path) if e["event"] == "collective"]
    low, high = model.read_seqs if model.read_seqs else (0, 0)
    first_low, first_high = model.first_read_seqs if model.first_read_seqs else (0, 0)
    return {
        "read": model.read,
        "read_collectives": [e["op"] for e in events if low <= e["seq"] < high],
        "first_read_collectives": [e["op"] for e in events if first_low <= e["seq"] < first_high],
        "then_value": model.then_value,
        "callback_metrics": floats(trainer.callback_metrics),
        "seen_ids": model.seen_ids,
    }


# -- torchmetrics list states ---------------------------------------------------------------------

#: ``dist_reduce_fx`` values ``ListStateMetric`` takes (``"none"`` stands for ``None``).
LIST_REDUCTIONS = ("cat", "none")

#: The dtypes ``list_item`` can make.
ITEM_DTYPES = {"float32": torch.float32, "int64": torch.int64, "int32": torch.int32}


def list_item(rank: int, k: int, dtype: str = "float32") -> torch.Tensor:
    """The 1-D tensor rank ``rank`` appends at its ``k``-th update (k = 0, 1, ...): ``k + 2`` entries
    ``100 * (rank + 1) + 10 * k + j`` (``j < k + 2``), so entries differ between updates and ranks, no
    entry is 0 (a zero padding entry left in a result cannot pass for data) and no item has one element
    (``Metric.compute`` squeezes one-element tensors to 0-d)."""
    base = 100 * (rank + 1) + 10 * k
    return torch.arange(base, base + k + 2).to(ITEM_DTYPES[dtype])


class ListStateMetric(Metric):
    """A metric with one list state ``items`` (``add_state("items", default=[], dist_reduce_fx=...)``);
    ``update(t)`` appends ``t``; ``compute()`` returns the state as synced: one tensor (``"cat"``) or a
    list of tensors (``None``)."""

    full_state_update = False

    def __init__(self, dist_reduce_fx, **kwargs):
        super().__init__(**kwargs)
        self.add_state("items", default=[], dist_reduce_fx=dist_reduce_fx)

    def update(self, item: torch.Tensor) -> None:
        self.items.append(item)

    def compute(self):
        return self.items


def _describe(value) -> dict:
    if isinstance(value, torch.Tensor):
        return {"dtype": str(value.dtype).replace("torch.", ""), "values": value.tolist()}
    return {"list": [_describe(v) for v in value]}


class ListStateProbe(pl.LightningModule):
    """In ``on_validation_epoch_end``, rank ``r`` updates a metric ``updates[r]`` times and every rank calls
    ``compute()``; the metric is a ``ListStateMetric(reduce)`` fed ``list_item(r, k, dtype)``, a
    ``CatMetric`` fed the same items, or a ``BinaryAUROC(thresholds=None)`` fed predictions
    ``list_item(r, k) / 1000`` and targets ``k % 2`` (int64).

    Args:
        metric: ``"list_state"``, ``"cat_metric"`` or ``"binary_auroc"``.
        reduce: ``"cat"`` or ``"none"`` (``ListStateMetric`` only).
        updates: one count per rank.
        dtype: the items' dtype (``ITEM_DTYPES``).
        fill_empty: a rank with no update calls ``update`` once with empty tensors of the right dtypes
            (``torch.empty(0, dtype=...)``; for ``binary_auroc`` float32 predictions and int64 targets).
    """

    def __init__(
        self, metric: str, updates: list, reduce: str = "cat", dtype: str = "float32", fill_empty: bool = False
    ):
        super().__init__()
        if reduce not in LIST_REDUCTIONS:
            raise ValueError(f"ListStateProbe(reduce={reduce!r}): use one of {LIST_REDUCTIONS}")
        if dtype not in ITEM_DTYPES:
            raise ValueError(f"ListStateProbe(dtype={dtype!r}): use one of {tuple(ITEM_DTYPES)}")
        if metric == "list_state":
            self.metric = ListStateMetric("cat" if reduce == "cat" else None)
        elif metric == "cat_metric":
            self.metric = CatMetric()
        elif metric == "binary_auroc":
            self.metric = BinaryAUROC(thresholds=None)
        else:
            raise ValueError(f"ListStateProbe(metric={metric!r}): use list_state, cat_metric or binary_auroc")
        self.layer = torch.nn.Linear(2, 1)
        self.kind, self.updates, self.dtype_name, self.fill_empty = metric, updates, dtype, fill_empty
        self.computed = None
        self.state_before = None

    def validation_step(self, batch, batch_idx):
        return None

    def on_validation_epoch_end(self):
        rank = self.global_rank
        for k in range(self.updates[rank]):
            item = list_item(rank, k, self.dtype_name)
            if self.kind == "binary_auroc":
                self.metric.update(item.float() / 1000.0, torch.full_like(item, k % 2, dtype=torch.int64))
            else:
                self.metric.update(item)
        if self.fill_empty and self.updates[rank] == 0:
            empty = torch.empty(0, dtype=ITEM_DTYPES[self.dtype_name])
            if self.kind == "binary_auroc":
                self.metric.update(empty.float(), empty.long())
            else:
                self.metric.update(empty)
        self.computed = _describe(self.metric.compute())


def list_state(
    info: RankInfo, metric: str, updates: list, reduce: str = "cat", dtype: str = "float32", fill_empty: bool = False
) -> dict:
    """Scenario: ``trainer.validate`` a ``ListStateProbe`` (one batch per rank, nothing logged); the
    arguments are ``ListStateProbe``'s.

    Record keys: ``computed`` (``{"dtype", "values"}`` for a tensor, ``{"list": [...]}`` for a
    list of tensors), ``warnings``.
    """
    if not isinstance(updates, (list, tuple)) or len(updates) != info.world_size:
        raise ValueError(f"updates must give one count per rank ({info.world_size}), got {updates!r}")
    model = ListStateProbe(metric, list(updates), reduce=reduce, dtype=dtype, fill_empty=fill_empty)
    with recorded_warnings() as warnings:
        ddp_trainer(info).validate(model, dataloaders=id_loader(info.world_size, 1), verbose=False)
    return {"computed": model.computed, "warnings": warnings}


# -- self.all_gather of what is not a tensor ------------------------------------------------------------


def leaves(rank: int) -> dict:
    """The dict rank ``rank`` all-gathers: a (2,) float32 tensor, a Python float, int and bool, a (3,)
    float64 NumPy array, a list of two strings and a string, all functions of the rank."""
    return {
        "tensor": torch.tensor([rank + 0.25, rank + 0.75]),
        "python_float": rank + 0.5,
        "python_int": 10 * (rank + 1),
        "python_bool": rank % 2 == 0,
        "numpy": np.arange(3, dtype=np.float64) + 10.0 * rank,
        "strings": [f"rank{rank}-a", f"rank{rank}-b"],
        "string": f"rank{rank}",
    }


def _leaf(value) -> dict:
    """``{"type", "shape", "dtype", "values"}`` of a gathered leaf (shape and dtype for a tensor only)."""
    if isinstance(value, torch.Tensor):
        return {
            "type": "Tensor",
            "shape": list(value.shape),
            "dtype": str(value.dtype).replace("torch.", ""),
            "values": value.tolist(),
        }
    if isinstance(value, np.ndarray):
        return {"type": "ndarray", "shape": list(value.shape), "dtype": str(value.dtype), "values": value.tolist()}
    return {"type": type(value).__name__, "values": value}


class LeavesProbe(pl.LightningModule):
    """In ``on_validation_epoch_end``: ``gathered = self.all_gather(leaves(rank))`` and
    ``torch.distributed.all_gather_object(objects, leaves(rank))`` (the fix for what is not a tensor)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.gathered = None
        self.objects = None

    def validation_step(self, batch, batch_idx):
        return None

    def on_validation_epoch_end(self):
        gathered = self.all_gather(leaves(self.global_rank))
        self.gathered = {key: _leaf(value) for key, value in sorted(gathered.items())}
        objects = [None] * self.trainer.world_size
        torch.distributed.all_gather_object(objects, leaves(self.global_rank))
        self.objects = [{key: _leaf(value) for key, value in sorted(obj.items())} for obj in objects]


def all_gather_leaves(info: RankInfo) -> dict:
    """Scenario: ``trainer.validate`` a ``LeavesProbe``.

    Record keys: ``gathered`` (``{key: leaf}`` after ``self.all_gather``, see ``_leaf``), ``objects``
    (``all_gather_object``'s list, one ``{key: leaf}`` per rank), ``warnings``.
    """
    model = LeavesProbe()
    with recorded_warnings() as warnings:
        ddp_trainer(info).validate(model, dataloaders=id_loader(info.world_size, 1), verbose=False)
    return {"gathered": model.gathered, "objects": model.objects, "warnings": warnings}


# -- float16 values in synced logs --------------------------------------------------------------------


def half_value(rank: int) -> float:
    """The float16 value rank ``rank`` logs and all-reduces: ``2 ** 15 + 2 ** 12 * (2 ** rank - 1)``
    (32768, 36864, 45056: multiples of 32, so exact in float16, whose largest finite number is 65504;
    any sum over 2 or more ranks overflows float16)."""
    return float(2**15 + 2**12 * (2**rank - 1))


class HalfPrecisionProbe(pl.LightningModule):
    """In its one ``validation_step`` (one sample per rank), logs ``half_value(rank)`` as a float16 0-d
    tensor under ``"half_mean"`` (default ``reduce_fx="mean"``) and ``"half_sum"`` (``reduce_fx="sum"``),
    both with ``on_step=True, on_epoch=True, sync_dist=True``; then all_reduces (SUM) a float16 copy with
    ``torch.distributed.all_reduce``."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.plain = None
        self.step_dtypes = None
        self.value_dtype = None

    def validation_step(self, batch, batch_idx):
        value = torch.tensor(half_value(self.global_rank), dtype=torch.float16)
        self.value_dtype = str(value.dtype).replace("torch.", "")
        self.log("half_mean", value, on_step=True, on_epoch=True, sync_dist=True, batch_size=1)
        self.log("half_sum", value, on_step=True, on_epoch=True, sync_dist=True, reduce_fx="sum", batch_size=1)
        plain = value.clone()
        torch.distributed.all_reduce(plain)
        self.plain = {"dtype": str(plain.dtype).replace("torch.", ""), "value": float(plain)}


def half_precision(info: RankInfo) -> dict:
    """Scenario: ``trainer.validate`` a ``HalfPrecisionProbe`` over ``IdDataset(W)`` (one batch of one).

    Record keys: ``value_dtype`` (the dtype of the tensor given to ``self.log``), ``plain`` (``{"dtype",
    "value"}`` of the float16 all_reduce), ``logged`` (``{key: float}``
    of ``trainer.logged_metrics``: ``half_mean_step``, ``half_mean_epoch``, ``half_sum_step``,
    ``half_sum_epoch``), ``logged_dtypes`` (``{key: dtype}``), ``warnings``.
    """
    model = HalfPrecisionProbe()
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info)
        trainer.validate(model, dataloaders=id_loader(info.world_size, 1), verbose=False)
    logged = dict(trainer.logged_metrics)
    return {
        "value_dtype": model.value_dtype,
        "plain": model.plain,
        "logged": floats(logged),
        "logged_dtypes": {k: str(v.dtype).replace("torch.", "") for k, v in sorted(logged.items())},
        "warnings": warnings,
    }

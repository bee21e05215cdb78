"""The rank side of an audit: build the user's module and data, run one stage under DDP, and record
every ``self.log`` call, the final ``callback_metrics``, removed 1.x hooks, dataset sizes and what
reached the logger.

Runs inside each rank process (``ddpprobe.run_world`` imports :func:`audit_rank` by name); it returns
a JSON-ready record and never prints, so the rank's stdout holds only what the user's code printed.
"""

from __future__ import annotations

import math
import os
import sys
import traceback
from typing import Optional

import torch
from torch.utils.data import DataLoader

from ddpprobe._lightning import pl
from ddpprobe.audit.evidence._stages import TRAINER_LOADERS
from ddpprobe.audit.worlds import _partitions, _reference
from ddpprobe.audit.worlds._errors import AuditInputError
from ddpprobe.audit.worlds._inputs import resolve_ref
from ddpprobe.audit.worlds._loaders import as_loaders, describe
from ddpprobe.contract import state_recorder
from ddpprobe.hazards import REMOVED_HOOKS
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, recorded_warnings
from ddpprobe.trace import CollectiveTrace


def _float(value):
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if math.isfinite(number) else str(number)


def _jsonable(value):
    """A short JSON-ready rendering of an argument passed to ``logger.experiment``."""
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return _float(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and len(value) <= 8:
        return [_jsonable(v) for v in value]
    return f"<{type(value).__name__}>"


class _RecordingExperiment:
    """Stands in for ``logger.experiment``: any method call (``add_scalar``, ``log_metrics``, ``log``, ...)
    is accepted and recorded as ``{"method", "args", "kwargs", "hook"}`` (``hook``: the LightningModule
    hook running, read from ``model_ref[0]``). On global rank 0 these are what the logger gets; on
    every other rank the real experiment is a no-op, and the record is what the rank's code tried to write."""

    def __init__(self, model_ref: list = None):
        self.calls: list = []
        self._model_ref = model_ref if model_ref is not None else [None]

    def __getattr__(self, method: str):
        if method.startswith("__"):
            raise AttributeError(method)

        def record(*args, **kwargs):
            self.calls.append(
                {
                    "method": method,
                    "args": [_jsonable(a) for a in args],
                    "kwargs": {k: _jsonable(v) for k, v in kwargs.items()},
                    "hook": getattr(self._model_ref[0], "_current_fx_name", None),
                }
            )

        return record


class RecordingLogger(pl.loggers.Logger):
    """A Lightning logger that writes nothing and records what it was given, on global rank 0 only.

    Like every Lightning logger its ``experiment`` is the real object on rank 0 and a no-op
    ``_DummyExperiment`` elsewhere (lightning_fabric/loggers/logger.py ``rank_zero_experiment``), and
    ``log_metrics`` runs on rank 0 only (``rank_zero_only``), so what it records is what a real
    logger would have written.
    """

    def __init__(self, save_dir: str):
        super().__init__()
        self._save_dir = save_dir
        self.model_ref: list = [None]
        self._experiment = _RecordingExperiment(self.model_ref)
        self._noop_experiment = _RecordingExperiment(self.model_ref)
        self.metrics: list = []

    @property
    def name(self) -> str:
        return "ddpprobe_audit"

    @property
    def version(self) -> int:
        return 0

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def root_dir(self) -> str:
        return self._save_dir

    @property
    def log_dir(self) -> str:
        return self._save_dir

    @property
    def experiment(self):
        if pl.utilities.rank_zero_only.rank > 0:
            return self._noop_experiment  # records, writes nothing: as _DummyExperiment
        return self._experiment

    @pl.utilities.rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append({"step": step, "metrics": {k: _float(v) for k, v in sorted(metrics.items())}})

    @pl.utilities.rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


#: The fields of a ``self.log`` call that make one row of the summary (values and batch sizes vary per call).
SUMMARY_FIELDS = ("name", "hook", "on_step", "on_epoch", "sync_dist", "reduce_fx", "rank_zero_only", "metric_object")


def _summarise_calls(calls: list) -> list:
    """One entry per (name, hook, options) with the number of calls, in first-call order."""
    summary: dict = {}
    for call in calls:
        call = {"name": call["key"], **{k: call[k] for k in SUMMARY_FIELDS[1:]}}
        key = tuple(sorted(call.items()))
        if key in summary:
            summary[key]["calls"] += 1
        else:
            summary[key] = {**call, "calls": 1}
    return list(summary.values())


def check_model(model, model_ref: str) -> None:
    """Raise ``AuditInputError`` unless ``model`` is a LightningModule of the package this process runs."""
    if isinstance(model, pl.LightningModule):
        return
    from ddpprobe import _lightning

    other = _lightning.trainer_package_of(type(model))
    if other is not None:
        fix = (
            f"it subclasses {other}'s LightningModule but this process runs {_lightning.chosen()}; run the "
            f"audit in a fresh process (python -m ddpprobe audit ...) so it can choose {other}"
        )
    else:
        fix = "make the factory return an instance of your LightningModule subclass, e.g. `return MyModel()`"
    raise AuditInputError(f"the model factory {model_ref} returned {describe(model)}, not a LightningModule; {fix}")


def _loader_info(loaders) -> list:
    """``[{"dataset_size", "per_rank", "batches", "sampler"}]`` for a loader or a list of loaders: the set's
    size, this rank's shard in samples and in batches (``len(loader)``); None where the dataset has no length,
    e.g. an ``IterableDataset``."""
    if loaders is None:
        return []
    if isinstance(loaders, DataLoader):
        loaders = [loaders]
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    out = []
    for loader in loaders:
        entry = {
            "dataset_size": None,
            "per_rank": None,
            "batches": None,
            "sampler": type(getattr(loader, "sampler", None)).__name__,
        }
        try:
            entry["batches"] = len(loader)
            entry["dataset_size"] = len(loader.dataset)
            entry["per_rank"] = len(loader.sampler)
        except TypeError:
            pass
        out.append(entry)
    return out


def _stdout_flush():
    sys.stdout.flush()


#: The folder under a world's trace folder that its ranks share as their working directory (:func:`working_folder`).
WORK = "work"


def working_folder(trace_dir: str) -> str:
    """Make ``<trace_dir>/work`` this rank's working directory and return it: the ranks of one world share it, as
    the processes of one launch share theirs (a relative ``preds.csv`` is one file for all of them), and it is the
    audit's own, removed with the audit's folder, so what the user's code writes by a relative path never lands
    among the user's files. Lightning's ``default_root_dir`` is this folder too, as it is the working directory
    in a run started from a shell."""
    work = os.path.join(trace_dir, WORK)
    os.makedirs(work, exist_ok=True)
    os.chdir(work)
    return work


def trace_path(trace_dir: str, rank: int) -> str:
    """The trace file of ``rank`` in ``trace_dir`` (``rank<r>.jsonl``)."""
    return os.path.join(trace_dir, f"rank{rank}.jsonl")


def audit_rank(
    info: RankInfo,
    model_ref: str,
    data_ref: Optional[str],
    stage: str = "validate",
    limit_batches=None,
    max_epochs: int = 1,
    seed: int = 0,
    sys_path: list = (),
    trace_dir: str = "",
    weights: str = "",
    reference: str = "",
    one_rank_ddp: bool = False,
    sampler_order: str = "",
) -> dict:
    """Scenario: build ``model_ref()`` and ``data_ref()``, run ``stage`` under DDP, record what happened.

    Args:
        model_ref, data_ref: ``"package.module:function"`` of the factories (called with no arguments);
            ``data_ref`` None: the module's own ``*_dataloader`` methods give the data.
        stage: ``"validate"``, ``"fit"``, ``"test"`` or ``"predict"``.
        limit_batches: ``limit_{train,val,test,predict}_batches`` for the Trainer (None: all batches).
        max_epochs: epochs for ``fit``.
        seed: rank r's generators start at ``seed + r`` before the factories run (:func:`_draw_as_a_process`):
            the ranks draw apart as processes do, and rank 0 draws what the single process draws.
        sys_path: import paths of the process that started the audit, prepended where missing (the
            rank's working directory is its own scratch folder, so the caller's ``""`` entry would
            not find the user's package).
        trace_dir: folder for this rank's trace (``rank<r>.jsonl``, ddpprobe/trace/), written
            while the stage runs; default: the rank's own folder. The audit gives a folder of its own,
            which outlives a world that dies or hangs (the launcher removes the rank folders). After
            ``fit``, rank 0 saves the trained weights there (``weights.pt``).
        weights: a ``state_dict`` file (``weights.pt`` of a ``fit``) loaded into the model before ``stage``
            runs, so a single process can validate the weights a distributed ``fit`` trained; the data
            factory's validation loader is used (stage ``"validate"`` only).
        reference: the trace folder of a distributed ``fit`` (ddpprobe/audit/worlds/_reference.py): this single process
            loads its initial weights and makes one optimizer step on its ranks' first batches put together
            (stage ``"fit"``, ``world_size`` of that run in ``limit_batches``' place is not needed: the folder holds
            one batch file per rank).
        one_rank_ddp: at W=1, run the stage in a one-rank DDP world (``Trainer(strategy="ddp")``, a process group of
            one rank, the module wrapped in ``DistributedDataParallel``) instead of the user's single process
            (:func:`single_process_trainer`): the second reference, which separates DDP's wrap from more than one
            rank.
        sampler_order: run the stage's samples in another order (ddpprobe/audit/worlds/_partitions.py): ``"blocks"``
            (each rank a contiguous block of DistributedSampler's list) or ``"padded:<W>"`` (one process runs the
            padded list W ranks run); ``""``: as Lightning samples.

    Record keys: ``input_error`` (a message, and nothing else, when a factory returned the wrong
    type), ``model_class``, ``log_calls`` (one entry per distinct call site: name, hook, on_step,
    on_epoch, sync_dist, reduce_fx, rank_zero_only, metric_object, calls), ``callback_metrics``
    (name -> float), ``removed_hooks``, ``loaders`` (kind -> list of dataset_size/per_rank/sampler),
    ``raised`` (``{"type", "message", "traceback"}`` if the stage raised, the traceback as
    ``traceback.format_exception`` lines; else None), ``experiment_calls`` and
    ``logger_metrics`` (what reached the logger; rank 0 only), ``experiment_attempts`` (the
    ``logger.experiment`` calls this rank's code made, reaching the logger on rank 0 only), ``warnings``,
    ``predictions`` (``predict`` only: number of prediction batches this rank returned), ``weights_digest``
    (see :func:`weights_digest`) and ``global_step`` (optimizer steps the stage made).
    """
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    work = working_folder(trace_dir or info.rank_dir)
    try:
        model, loaders = _build(model_ref, data_ref, stage, seed, weights or _initial(reference), info.rank)
    except AuditInputError as exc:
        return {"input_error": str(exc) if str(exc).startswith("the model") else f"{data_ref}: {exc}"}
    limits = _limits(stage, limit_batches)
    if reference:
        loaders = _reference.reference_loaders(reference, len(_batch_files(reference)))
        if loaders is None:
            return {"input_error": None, "reference": "the ranks' first batches cannot be put together"}
        limits = _reference.REFERENCE_TRAINER
    logger = RecordingLogger(work)
    logger.model_ref[0] = model
    folder = trace_dir or info.rank_dir
    with (
        recorded_warnings() as warnings,
        CollectiveTrace(trace_path(folder, info.rank), model) as trace,
    ):
        trace.writers.watch(loaders.get("datamodule"), "datamodule")
        callbacks = [
            trace.batch_recorder(),
            state_recorder(lambda record: trace.write("state", **record, writers=dict(trace.writers.last))),
        ]
        if stage == "fit" and info.world_size > 1:
            callbacks.append(_reference.FirstBatchSaver(folder, info.rank))
        if info.world_size == 1 and not one_rank_ddp:
            make = single_process_trainer
        else:
            make = ddp_trainer
        trainer = make(info, logger=logger, max_epochs=max_epochs, callbacks=callbacks, default_root_dir=work, **limits)
        trace.stage_started(stage, info.rank, info.world_size)
        with _partitions.sampler_order(sampler_order):
            raised, predictions = _run_stage(trainer, model, stage, loaders, trace)
    _stdout_flush()
    if stage == "fit" and info.rank == 0 and raised is None:
        torch.save(model.state_dict(), os.path.join(trace_dir or info.rank_dir, WEIGHTS_FILE))
    return {
        "input_error": None,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "log_calls": _summarise_calls(trace.log_calls),
        "callback_metrics": {k: _float(v) for k, v in sorted(trainer.callback_metrics.items())},
        "removed_hooks": [hook for hook in REMOVED_HOOKS if callable(getattr(model, hook, None))],
        "loaders": {kind: _loader_info(getattr(trainer, attr, None)) for kind, attr in TRAINER_LOADERS.items()},
        "raised": raised,
        "experiment_calls": logger._experiment.calls,
        "experiment_attempts": logger._experiment.calls or logger._noop_experiment.calls,
        "logger_metrics": logger.metrics,
        "warnings": warnings,
        "predictions": predictions,
        "weights_digest": weights_digest(model),
        "callbacks": callback_states(trainer),
        "metrics": _metric_settings(model),
        "global_step": int(trainer.global_step),
    }


#: The variables a launcher sets that describe a distributed world (ddpprobe/launch/_rank.py ``_set_environment``,
#: and what torchrun sets): a user's ``python train.py`` has none of them.
WORLD_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "RANK",
    "TORCHELASTIC_USE_AGENT_STORE",
)


def single_process_trainer(info: RankInfo, **overrides):
    """The user's single process: ``Trainer(accelerator=..., devices=1)`` with Lightning's default strategy
    (``SingleDeviceStrategy``: no process group, no ``DistributedDataParallel`` wrap, no ``DistributedSampler``),
    in a process whose environment names no world (:data:`WORLD_ENV` removed, so Lightning's cluster detection
    sees a plain process, lightning_fabric/plugins/environments/torchelastic.py ``detect``). Progress bar, model
    summary and checkpointing are off unless ``overrides`` turn them on, as in ``ddp_trainer``."""
    for name in WORLD_ENV:
        os.environ.pop(name, None)
    kwargs = dict(
        accelerator=info.accelerator,
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=info.rank_dir,
    )
    kwargs.update(overrides)
    return pl.Trainer(**kwargs)


def _metric_settings(model) -> list:
    """``[{"name", "class", "sync_on_compute"}]`` of every torchmetrics ``Metric`` the module holds (a
    ``MetricCollection``'s metrics included, ``named_modules`` order)."""
    try:
        from torchmetrics import Metric
    except ImportError:
        return []
    return [
        {"name": name, "class": type(m).__name__, "sync_on_compute": bool(getattr(m, "sync_on_compute", True))}
        for name, m in model.named_modules()
        if isinstance(m, Metric)
    ]


def _initial(reference: str) -> str:
    return os.path.join(reference, _reference.INITIAL_WEIGHTS) if reference else ""


def _batch_files(folder: str) -> list:
    return [f for f in os.listdir(folder) if f.startswith("first_batch_rank")]


def _draw_as_a_process(seed: int, rank: int) -> None:
    """Seed this rank's generators (torch, NumPy, ``random``) with ``seed + rank``: as in a real launch, where
    each process starts from its own state, ranks draw apart unless the user's code seeds (then that seed's
    draws), and rank 0 and the single process draw alike, so every run is reproducible. ``PL_GLOBAL_SEED`` is not
    set (``seed_everything`` would set it): Lightning's DDP strategy re-seeds every rank from it when it sets up
    (pytorch_lightning/strategies/ddp.py ``setup_environment``, ``reset_seed``), which would make the ranks draw
    alike again where a real launch that seeds nothing draws apart."""
    import random

    import numpy

    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        os.environ.pop(name, None)

    random.seed(seed + rank)
    numpy.random.seed((seed + rank) % 2**32)
    torch.manual_seed(seed + rank)


def _build(model_ref: str, data_ref: Optional[str], stage: str, seed: int, weights: str, rank: int = 0) -> tuple:
    """``(model, Trainer keyword arguments)`` from the factories, after :func:`_draw_as_a_process`;
    with ``weights``, the model holds them and the arguments are the data's
    validation loaders (for a ``fit`` reference run, the caller replaces the loaders).

    Raises:
        AuditInputError: the model is not a LightningModule of this package, or the data is not usable.
    """
    model_factory = resolve_ref(model_ref)
    data_factory = resolve_ref(data_ref) if data_ref else lambda: None
    _draw_as_a_process(seed, rank)
    model = model_factory()
    check_model(model, model_ref)
    loaders = as_loaders(data_factory(), "fit" if weights else stage)
    if weights:
        model.load_state_dict(torch.load(weights, weights_only=True))
        if stage != "fit":
            loaders = _validation_of(loaders)
    return model, loaders


def _limits(stage: str, limit_batches: Optional[int]) -> dict:
    """The Trainer's ``limit_*_batches`` for ``stage`` (none when ``limit_batches`` is None)."""
    if limit_batches is None:
        return {}
    return {
        "fit": {"limit_train_batches": limit_batches, "limit_val_batches": limit_batches},
        "validate": {"limit_val_batches": limit_batches},
        "test": {"limit_test_batches": limit_batches},
        "predict": {"limit_predict_batches": limit_batches},
    }[stage]


def _run_stage(trainer, model, stage: str, loaders: dict, trace: CollectiveTrace) -> tuple:
    """Run ``stage``; return ``(raised, predictions)``: ``{"type", "message"}`` where the user's module
    raised (a finding, not an audit error), and for ``predict`` the number of prediction batches."""
    predictions = None
    try:
        if stage == "fit":
            trainer.fit(model, **loaders)
        elif stage == "predict":
            out = trainer.predict(model, return_predictions=True, **loaders)
            predictions = len(out) if out is not None else 0
        else:
            getattr(trainer, stage)(model, verbose=False, **loaders)
    except Exception as exc:  # noqa: BLE001 - what the user's module raises is a finding
        trace.stage_raised(exc)
        error = {"type": type(exc).__name__, "message": str(exc)}
        return {**error, "traceback": traceback.format_exception(exc)}, predictions
    trace.stage_ended({k: _float(v) for k, v in sorted(trainer.callback_metrics.items())})
    return None, predictions


#: The file in a world's trace folder where rank 0 saves the weights a ``fit`` trained.
WEIGHTS_FILE = "weights.pt"


def _score(value):
    return _float(value) if value is not None else None


def callback_states(trainer) -> list:
    """Each ``ModelCheckpoint``'s and ``EarlyStopping``'s state at the end of the stage, in the Trainer's
    order: ``{"callback", "monitor", ...}`` with, for ``ModelCheckpoint``, ``best_model_path``,
    ``best_model_score``, ``best_k_models`` (path -> score) and ``files`` (the checkpoint files that exist in
    its ``dirpath``, which every rank takes from rank 0: ``ModelCheckpoint.setup`` broadcasts it), as file
    names; for ``EarlyStopping``, ``wait_count``,
    ``stopped_epoch`` and ``stopping_reason`` (the ``EarlyStoppingReason`` name)."""
    out = []
    for cb in trainer.callbacks:
        if isinstance(cb, pl.callbacks.ModelCheckpoint):
            files = (
                sorted(f for f in os.listdir(cb.dirpath) if f.endswith(".ckpt"))
                if cb.dirpath and os.path.isdir(cb.dirpath)
                else []
            )
            out.append(
                {
                    "callback": "ModelCheckpoint",
                    "monitor": cb.monitor,
                    "best_model_path": os.path.basename(cb.best_model_path) if cb.best_model_path else "",
                    "best_model_score": _score(cb.best_model_score),
                    "best_k_models": {os.path.basename(k): _score(v) for k, v in cb.best_k_models.items()},
                    "files": files,
                }
            )
        elif isinstance(cb, pl.callbacks.EarlyStopping):
            reason = getattr(cb, "stopping_reason", None)
            out.append(
                {
                    "callback": "EarlyStopping",
                    "monitor": cb.monitor,
                    "wait_count": int(cb.wait_count),
                    "stopped_epoch": int(cb.stopped_epoch),
                    "stopping_reason": getattr(reason, "name", None if reason is None else str(reason)),
                }
            )
    return out


def weights_digest(model) -> str:
    """SHA-1 (12 hex digits) over the model's ``state_dict`` tensors: equal digests, equal weights. A tensor whose
    values cannot be read (a lazy layer's parameter before its first forward, a meta tensor:
    ``ddpprobe.contract.unreadable_reason``) enters the digest by its name and that reason, never by an error: the
    audit's record never fails the user's run."""
    import hashlib

    from ddpprobe.contract._state import unreadable_reason

    digest = hashlib.sha1()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        reason = unreadable_reason(tensor) if isinstance(tensor, torch.Tensor) else f"not a tensor: {type(tensor)}"
        if reason is not None:
            digest.update(f"unreadable: {reason}".encode())
            continue
        digest.update(tensor.detach().cpu().contiguous().float().numpy().tobytes())
    return digest.hexdigest()[:12]


def _validation_of(loaders: dict) -> dict:
    """``Trainer.validate`` keyword arguments from ``fit``'s: the datamodule, or the validation loaders."""
    if "datamodule" in loaders:
        return loaders
    if "val_dataloaders" in loaders:
        return {"dataloaders": loaders["val_dataloaders"]}
    return {}

"""The rank side of an audit: build the user's module and data, run one stage under DDP, and record
every ``self.log`` call, the final ``callback_metrics``, removed 1.x hooks, dataset sizes and what
reached the logger.

Runs inside each rank process (``ddpprobe.run_world`` imports :func:`audit_rank` by name); it returns
a JSON-ready record and never prints, so the rank's stdout holds only what the user's code printed.
"""

from __future__ import annotations

import functools
import importlib
import math
import sys

import torch
from torch.utils.data import DataLoader

from ddpprobe._lightning import fabric, pl
from ddpprobe.audit._verdict import REMOVED_HOOKS
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, recorded_warnings, seed_everything

#: Stages an audit can run, and the Trainer method for each.
STAGES = ("validate", "fit", "test")



class InputError(Exception):
    """A factory returned something the audit cannot run (reported back as ``record["input_error"]``)."""


def resolve_ref(ref: str):
    """Import ``"package.module:qualname"`` (or ``"package.module.name"``) and return the object.

    Raises:
        ImportError / AttributeError: the module or the name inside it does not exist.
    """
    module_name, sep, qualname = ref.partition(":")
    if not sep:
        module_name, _, qualname = ref.rpartition(".")
    if not module_name or not qualname:
        raise ImportError(f"{ref!r} is not of the form 'package.module:function'")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


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
    """Stands in for ``logger.experiment`` on global rank 0: any method call (``add_scalar``,
    ``log_metrics``, ``log``, ...) is accepted and recorded as ``{"method", "args", "kwargs"}``."""

    def __init__(self):
        self.calls: list = []

    def __getattr__(self, method: str):
        if method.startswith("__"):
            raise AttributeError(method)

        def record(*args, **kwargs):
            self.calls.append({"method": method, "args": [_jsonable(a) for a in args],
                               "kwargs": {k: _jsonable(v) for k, v in kwargs.items()}})

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
        self._experiment = _RecordingExperiment()
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
            return importlib.import_module(f"{fabric.__name__}.loggers.logger")._DummyExperiment()
        return self._experiment

    @pl.utilities.rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append({"step": step, "metrics": {k: _float(v) for k, v in sorted(metrics.items())}})

    @pl.utilities.rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def _reduce_fx_name(reduce_fx) -> str:
    if isinstance(reduce_fx, str):
        return reduce_fx
    return getattr(reduce_fx, "__name__", repr(reduce_fx))


def _wrap_log(model) -> list:
    """Replace ``model.log`` (on the instance only) by a wrapper that records each call's hook and
    resolved options, then calls the original. ``log_dict`` goes through ``self.log``, so it is
    recorded too. Returns the list the records go to (one entry per call)."""
    _FxValidator = importlib.import_module(f"{pl.__name__}.trainer.connectors.logger_connector.fx_validator")._FxValidator
    from torchmetrics import Metric

    calls: list = []
    original = model.log

    @functools.wraps(original)
    def log(name, value, *args, **kwargs):
        options = dict(zip(("prog_bar", "logger", "on_step", "on_epoch", "reduce_fx", "enable_graph", "sync_dist",
                            "sync_dist_group", "add_dataloader_idx", "batch_size", "metric_attribute",
                            "rank_zero_only"), args))
        options.update(kwargs)
        fx = model._current_fx_name
        result = original(name, value, *args, **kwargs)
        try:
            on_step, on_epoch = _FxValidator.check_logging_and_get_default_levels(
                fx, on_step=options.get("on_step"), on_epoch=options.get("on_epoch"))
        except Exception:  # noqa: BLE001 - the original call accepted it; keep what was given
            on_step, on_epoch = options.get("on_step"), options.get("on_epoch")
        calls.append({
            "name": name,
            "hook": fx,
            "on_step": bool(on_step),
            "on_epoch": bool(on_epoch),
            "sync_dist": bool(options.get("sync_dist", False)),
            "reduce_fx": _reduce_fx_name(options.get("reduce_fx", "mean")),
            "rank_zero_only": bool(options.get("rank_zero_only", False)),
            "metric_object": isinstance(value, Metric),
        })
        return result

    model.log = log
    return calls


def _summarise_calls(calls: list) -> list:
    """One entry per (name, hook, options) with the number of calls, in first-call order."""
    summary: dict = {}
    for call in calls:
        key = tuple(sorted(call.items()))
        if key in summary:
            summary[key]["calls"] += 1
        else:
            summary[key] = {**call, "calls": 1}
    return list(summary.values())


def _describe(value) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__} {value!r}"[:200]


def _as_loaders(data, stage: str) -> dict:
    """Turn what the data factory returned into ``Trainer`` keyword arguments for ``stage``.

    Accepted: a ``LightningDataModule``; a ``DataLoader`` (the stage's loader: validation for
    ``validate``, training for ``fit``, test for ``test``); a dict with keys ``"train"``, ``"val"``,
    ``"test"``; for ``fit`` a ``(train, val)`` tuple.
    """
    if isinstance(data, pl.LightningDataModule):
        return {"datamodule": data}
    if isinstance(data, DataLoader):
        return {{"validate": "dataloaders", "test": "dataloaders", "fit": "train_dataloaders"}[stage]: data}
    if isinstance(data, (tuple, list)) and stage == "fit" and len(data) == 2:
        data = {"train": data[0], "val": data[1]}
    if isinstance(data, dict) and data and set(data) <= {"train", "val", "test"}:
        if stage == "fit":
            if "train" not in data:
                raise InputError("the data factory returned a dict without 'train'; stage 'fit' needs a training loader")
            return {"train_dataloaders": data["train"], **({"val_dataloaders": data["val"]} if "val" in data else {})}
        key = "val" if stage == "validate" else "test"
        if key not in data:
            raise InputError(f"the data factory returned a dict without {key!r}; stage {stage!r} needs it")
        return {"dataloaders": data[key]}
    raise InputError(
        f"the data factory returned {_describe(data)}; return a LightningDataModule, a DataLoader, or a dict "
        "{'train': DataLoader, 'val': DataLoader}"
    )


def _loader_info(loaders) -> list:
    """``[{"dataset_size", "per_rank", "sampler"}]`` for a loader or a list of loaders (None entries
    where the dataset has no length, e.g. an ``IterableDataset``)."""
    if loaders is None:
        return []
    if isinstance(loaders, DataLoader):
        loaders = [loaders]
    out = []
    for loader in loaders:
        entry = {"dataset_size": None, "per_rank": None, "sampler": type(getattr(loader, "sampler", None)).__name__}
        try:
            entry["dataset_size"] = len(loader.dataset)
            entry["per_rank"] = len(loader.sampler)
        except TypeError:
            pass
        out.append(entry)
    return out


def _stdout_flush():
    sys.stdout.flush()


def audit_rank(
    info: RankInfo,
    model_ref: str,
    data_ref: str,
    stage: str = "validate",
    limit_batches=None,
    max_epochs: int = 1,
    seed: int = 0,
    sys_path: list = (),
) -> dict:
    """Scenario: build ``model_ref()`` and ``data_ref()``, run ``stage`` under DDP, record what happened.

    Args:
        model_ref, data_ref: ``"package.module:function"`` of the factories (called with no arguments).
        stage: ``"validate"``, ``"fit"`` or ``"test"``.
        limit_batches: ``limit_{train,val,test}_batches`` for the Trainer (None: all batches).
        max_epochs: epochs for ``fit``.
        seed: passed to ``pytorch_lightning.seed_everything`` before the factories run, so every rank
            and every world builds the same initial weights.
        sys_path: import paths of the process that started the audit, prepended where missing (the
            rank's working directory is its own scratch folder, so the caller's ``""`` entry would
            not find the user's package).

    Record keys: ``input_error`` (a message, and nothing else, when a factory returned the wrong
    type), ``model_class``, ``log_calls`` (one entry per distinct call site: name, hook, on_step,
    on_epoch, sync_dist, reduce_fx, rank_zero_only, metric_object, calls), ``callback_metrics``
    (name -> float), ``removed_hooks``, ``loaders`` (kind -> list of dataset_size/per_rank/sampler),
    ``raised`` (``{"type", "message"}`` if the stage raised, else None), ``experiment_calls`` and
    ``logger_metrics`` (what reached the logger; rank 0 only), ``warnings``.
    """
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    model_factory, data_factory = resolve_ref(model_ref), resolve_ref(data_ref)
    seed_everything(seed, workers=True)
    model = model_factory()
    if not isinstance(model, pl.LightningModule):
        if any(base.__module__.startswith("lightning.pytorch") for base in type(model).__mro__):
            fix = ("it subclasses lightning.pytorch.LightningModule; ddpprobe runs pytorch_lightning, so import "
                   "LightningModule from pytorch_lightning")
        else:
            fix = "make the factory return an instance of your LightningModule subclass, e.g. `return MyModel()`"
        return {"input_error": f"the model factory {model_ref} returned {_describe(model)}, not a "
                               f"pytorch_lightning.LightningModule; {fix}"}
    try:
        loaders = _as_loaders(data_factory(), stage)
    except InputError as exc:
        return {"input_error": f"{data_ref}: {exc}"}

    removed = [hook for hook in REMOVED_HOOKS if callable(getattr(model, hook, None))]
    calls = _wrap_log(model)
    logger = RecordingLogger(info.rank_dir)
    limits = {}
    if limit_batches is not None:
        limits = {"fit": {"limit_train_batches": limit_batches, "limit_val_batches": limit_batches},
                  "validate": {"limit_val_batches": limit_batches},
                  "test": {"limit_test_batches": limit_batches}}[stage]
    raised = None
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info, logger=logger, max_epochs=max_epochs, **limits)
        try:
            if stage == "fit":
                trainer.fit(model, **loaders)
            else:
                getattr(trainer, stage)(model, verbose=False, **loaders)
        except Exception as exc:  # noqa: BLE001 - what the user's module raises is a finding
            raised = {"type": type(exc).__name__, "message": str(exc)}
    _stdout_flush()
    loader_kinds = {"train": "train_dataloader", "val": "val_dataloaders", "test": "test_dataloaders"}
    return {
        "input_error": None,
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "log_calls": _summarise_calls(calls),
        "callback_metrics": {k: _float(v) for k, v in sorted(trainer.callback_metrics.items())},
        "removed_hooks": removed,
        "loaders": {kind: _loader_info(getattr(trainer, attr, None)) for kind, attr in loader_kinds.items()},
        "raised": raised,
        "experiment_calls": logger._experiment.calls,
        "logger_metrics": logger.metrics,
        "warnings": warnings,
    }

"""Writing a rank's trace: :class:`CollectiveTrace`, the listener of the shared patch (``_patch.py``) that
writes each collective, and the wrappers of the module's ``log`` and ``all_gather``."""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from typing import Optional

import torch
import torch.distributed

from ddpprobe import _lightning
from ddpprobe.trace import _gradients, _patch
from ddpprobe.trace._batches import batch_recorder
from ddpprobe.trace._classify import RANK_NAMES, CallClassifier, call_site_of
from ddpprobe.trace._files import FileWrites
from ddpprobe.trace._hooks import HookCounter
from ddpprobe.trace._patch import pg_seq
from ddpprobe.trace._writers import AttributeWriters

#: Version of the JSON-lines format described in this module's docstring.
TRACE_SCHEMA = 1

#: Environment variable (and value) that turns torch's Flight Recorder on in a rank; the audit passes
#: it to ``run_world(env=...)``. Entries kept per rank.
FLIGHT_RECORDER_ENV = {"TORCH_FR_BUFFER_SIZE": "4000"}


class CollectiveTrace:
    """Record this rank's collectives, ``self.log`` calls and batches to ``path`` (JSON lines) while active.

    Args:
        path: the trace file; created (appended to if it exists); each line is flushed to the OS as it
            is written.
        model: the LightningModule whose ``log`` is recorded (the wrapper is set on the instance only)
            and whose hook names label the collectives.

    Use as a context manager; on exit ``torch.distributed`` and ``model.log`` are restored. The
    callback from :meth:`batch_recorder` records the batches; pass it to the Trainer.
    """

    def __init__(self, path: str, model):
        self.path = path
        self.model = model
        self._file = None
        self.classifier = CallClassifier(model)
        self._listener = _TraceListener(self)
        self.log_calls: list = []

    @property
    def collectives_seen(self) -> int:
        """How many collectives this trace has written (the next ``collective`` event's ``seq``)."""
        return self._listener.seq

    # -- writing ---------------------------------------------------------------------------------

    def write(self, event: str, **fields) -> None:
        """Append one line ``{"event": event, **fields, "t": seconds since the epoch}`` and flush it."""
        line = json.dumps({"event": event, **fields, "t": round(time.time(), 6)}, default=str)
        self._file.write(line + "\n")
        self._file.flush()

    def stage_started(self, stage: str, rank: int, world_size: int) -> None:
        """Write ``stage`` with ``status="start"``."""
        self.write("stage", status="start", stage=stage, rank=rank, world_size=world_size)

    def stage_raised(self, exc: BaseException) -> None:
        """Write ``stage`` with ``status="raised"`` and the error text (2,000 characters at most)."""
        self.write("stage", status="raised", error=f"{type(exc).__name__}: {exc}"[:2000])

    def stage_ended(self, callback_metrics: dict) -> None:
        """Write ``stage`` with ``status="end"``, then ``metrics`` with the rank's ``callback_metrics``
        (name -> float, or ``"nan"``/``"inf"`` strings)."""
        self.write("stage", status="end")
        self.write("metrics", values=callback_metrics)

    def __enter__(self) -> "CollectiveTrace":
        self._file = open(self.path, "a", encoding="utf-8")
        self.write("start", schema=TRACE_SCHEMA, pid=os.getpid())
        _patch.attach(self._listener)
        _gradients.watch(self)
        self._hooks = HookCounter(lambda event, **fields: self.write(event, **fields))
        self._hooks.install()
        running = lambda: getattr(self.model, "_current_fx_name", None)  # noqa: E731 - the hook running, when asked
        self._files = FileWrites(self.write, self.classifier.user_code, running)
        self._files.install()
        self.writers = AttributeWriters(self.classifier.user_code, running)
        self.writers.watch(self.model, "module")
        self._original_log = self.model.log
        self.model.log = self._wrap_log(self.model.log)
        self._original_all_gather = self.model.all_gather
        self.model.all_gather = self._wrap_all_gather(self.model.all_gather)
        return self

    def __exit__(self, *exc) -> None:
        _patch.detach(self._listener)
        _gradients.unwatch(self)
        self._hooks.uninstall()
        self._files.uninstall()
        self.writers.unwatch()
        self.model.log = self._original_log
        self.model.all_gather = self._original_all_gather
        self.dump_flight_recorder()
        self._file.close()

    def dump_flight_recorder(self) -> None:
        """Write torch's Flight Recorder entries for this rank (an ``unavailable`` reason where it cannot)."""
        try:
            from torch._C._distributed_c10d import _dump_fr_trace_json

            entries = json.loads(_dump_fr_trace_json()).get("entries", [])
        except Exception as exc:  # noqa: BLE001 - off, or not built into this torch
            self.write("flight_recorder", entries=[], unavailable=f"{type(exc).__name__}: {exc}")
            return
        keep = ("collective_seq_id", "profiling_name", "input_sizes", "input_dtypes", "state", "process_group")
        self.write("flight_recorder", entries=[{k: e.get(k) for k in keep} for e in entries])

    # -- the wrappers ----------------------------------------------------------------------------

    def _wrap_log(self, original):
        trace, model = self, self.model

        @functools.wraps(original)
        def log(name, value, *args, **kwargs):
            options = dict(zip(LOG_OPTIONS, args))
            options.update(kwargs)
            fx = model._current_fx_name
            user = trace.classifier.user_code(sys._getframe(1))
            result_metric = _result_metric(model, fx, name)
            before = _cumulated(result_metric)
            out = original(name, value, *args, **kwargs)
            result_metric = result_metric or _result_metric(model, fx, name)
            call = _log_event(name, value, fx, options, result_metric, before)
            call["call_site"] = call_site_of(user)
            call["reads_rank"] = sorted(set(user.f_code.co_names) & RANK_NAMES) if user is not None else []
            trainer = getattr(model, "_trainer", None)
            call["sanity"] = bool(getattr(trainer, "sanity_checking", False))
            call["epoch"] = int(getattr(trainer, "current_epoch", 0) or 0)
            trace.log_calls.append(call)
            trace.classifier.note_log(name, fx, call["call_site"])
            trace.write("log", **call)
            return out

        return log

    def _wrap_all_gather(self, original):
        trace, model = self, self.model

        @functools.wraps(original)
        def all_gather(data, *args, **kwargs):
            out = original(data, *args, **kwargs)
            leaves = [
                {"path": path, "type": type(leaf).__name__, "unchanged": returned is leaf}
                for path, leaf, returned in _paired_leaves(data, out)
                if not isinstance(leaf, torch.Tensor)
            ]
            if leaves:
                trace.write(
                    "all_gather",
                    hook=model._current_fx_name,
                    call_site=trace.classifier.user_frame(sys._getframe(1)),
                    leaves=leaves[:20],
                    unchanged=sum(1 for leaf in leaves if leaf["unchanged"]),
                )
            return out

        return all_gather

    def batch_recorder(self):
        """A Lightning ``Callback`` that writes a ``batch`` event for every batch of every loop."""
        return batch_recorder(self)


class _TraceListener(_patch.Listener):
    """Writes ``collective`` before each call and ``done`` / ``raised`` after it."""

    def __init__(self, trace: CollectiveTrace):
        self.trace = trace
        self.seq = 0
        self.seqs = threading.local()

    def before(self, call: _patch.Call) -> None:
        seq, self.seq = self.seq, self.seq + 1
        self.seqs.current = seq
        try:
            group_size = torch.distributed.get_world_size(call.kwargs.get("group"))
        except Exception:  # noqa: BLE001
            group_size = None
        fields = {
            **call.fields,
            "group_size": group_size,
            "pg_seq": pg_seq(),
            **self.trace.classifier.context(call.frame, call.name),
            **call.extra,
        }
        values = _small_values(call, before=True)
        self.trace.write("collective", seq=seq, **fields, **({"values": values} if values is not None else {}))

    def after(self, call: _patch.Call, error) -> None:
        seq = self.seqs.current
        if error is not None:
            self.trace.write("raised", seq=seq, error=f"{type(error).__name__}: {error}"[:2000])
        else:
            # A gradient bucket's hook returns a future before its all_reduce has finished: what its buffer holds now
            # depends on the timing, so no values are read back.
            gradient = call.extra.get("source") == "gradient"
            values = None if gradient else _small_values(call, before=False)
            self.trace.write("done", seq=seq, pg_seq=pg_seq(), **({"values": values} if values is not None else {}))


#: Collectives whose tensor's values the trace records (in the ``collective`` event: what the rank put in; in
#: ``done``: what it got back), when the tensor has at most ``SMALL_VALUES`` elements.
VALUED_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor")
SMALL_VALUES = 8


def _small_values(call: _patch.Call, before: bool) -> Optional[list]:
    """The values (a flat list of floats) of the tensor a small collective puts in (``before``) or gets back: the
    reduced or broadcast tensor, for a gather the input, then the gathered tensors; None for other collectives and
    larger tensors."""
    if call.name not in VALUED_OPS:
        return None
    args = list(call.args) + list(call.kwargs.values())
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and all(isinstance(t, torch.Tensor) for t in a)]
    if call.name == "all_gather":
        chosen = tensors[:1] if before else (lists[0] if lists else [])
    elif call.name == "all_gather_into_tensor":
        chosen = tensors[1:2] if before else tensors[:1]
    else:
        chosen = tensors[:1]
    if not chosen or sum(t.numel() for t in chosen) > SMALL_VALUES * (1 if before else 16):
        return None
    try:
        return [float(v) for t in chosen for v in t.detach().flatten().cpu().tolist()]
    except (RuntimeError, TypeError, ValueError):
        return None


#: ``LightningModule.log``'s parameters after ``name`` and ``value``, in order (for positional arguments).
LOG_OPTIONS = (
    "prog_bar",
    "logger",
    "on_step",
    "on_epoch",
    "reduce_fx",
    "enable_graph",
    "sync_dist",
    "sync_dist_group",
    "add_dataloader_idx",
    "batch_size",
    "metric_attribute",
    "rank_zero_only",
)


def _log_event(name: str, value, fx, options: dict, result_metric, before: Optional[int]) -> dict:
    """The fields of a ``log`` event but ``call_site`` and ``reads_rank``, after Lightning took the call."""
    from torchmetrics import Metric

    after = _cumulated(result_metric)
    on_step, on_epoch = _levels(fx, options)
    if isinstance(value, Metric):
        number = step_value = _scalar(getattr(value, "_forward_cache", None))
    else:
        number = _scalar(value)
        step_value = _scalar(getattr(result_metric, "_forward_cache", None)) if on_step else None
    reduce_fx = options.get("reduce_fx", "mean")
    return {
        "key": name,
        "hook": fx,
        "value": number,
        "step_value": step_value,
        "batch_size": (after - before) if after is not None and before is not None else after,
        "on_step": bool(on_step),
        "on_epoch": bool(on_epoch),
        "sync_dist": bool(options.get("sync_dist", False)),
        "reduce_fx": reduce_fx if isinstance(reduce_fx, str) else getattr(reduce_fx, "__name__", repr(reduce_fx)),
        "rank_zero_only": bool(options.get("rank_zero_only", False)),
        "metric_object": isinstance(value, Metric),
    }


def _paired_leaves(data, out, path: str = "") -> list:
    """``[(path, leaf of data, what came back in its place)]`` over the dicts, lists and tuples of ``data``
    (``out`` walked alongside; a leaf whose place in ``out`` is missing pairs with None)."""
    if isinstance(data, dict):
        returned = out if isinstance(out, dict) else {}
        return [p for k, v in data.items() for p in _paired_leaves(v, returned.get(k), f"{path}[{k!r}]")]
    if isinstance(data, (list, tuple)):
        returned = out if isinstance(out, (list, tuple)) and len(out) == len(data) else [None] * len(data)
        return [p for i, (v, o) in enumerate(zip(data, returned)) for p in _paired_leaves(v, o, f"{path}[{i}]")]
    return [(path or "(the value)", data, out)]


def _scalar(value) -> Optional[float]:
    try:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                return None
            value = value.item()
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return number


def _result_metric(model, fx, name):
    try:
        results = model.trainer._results
        return results.get(f"{fx}.{name}") if results is not None else None
    except Exception:  # noqa: BLE001 - no trainer attached, or another release's layout
        return None


def _cumulated(result_metric) -> Optional[int]:
    if result_metric is None or not getattr(result_metric, "is_tensor", False):
        return None
    if not result_metric.meta.is_mean_reduction:
        return None
    return int(result_metric.cumulated_batch_size)


def _levels(fx, options) -> tuple:
    import importlib

    try:
        validator = importlib.import_module(
            f"{_lightning.pl.__name__}.trainer.connectors.logger_connector.fx_validator"
        )
        return validator._FxValidator.check_logging_and_get_default_levels(
            fx, on_step=options.get("on_step"), on_epoch=options.get("on_epoch")
        )
    except Exception:  # noqa: BLE001 - the original call accepted it; keep what was given
        return options.get("on_step"), options.get("on_epoch")

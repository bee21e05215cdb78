"""A per-rank trace of what a Lightning run did under DDP: every collective in order, every ``self.log``
call, every batch the loops ran. Written as JSON lines while the rank runs, so a rank that aborts or is
killed still leaves its trace up to the collective it was in.

Used by the audit (ddpprobe/audit/) in its ranks::

    with CollectiveTrace(path, model) as trace:     # patches torch.distributed in this process only
        trainer = ddp_trainer(info, callbacks=[trace.batch_recorder()])
        trainer.validate(model, dataloaders=loader)

One JSON object per line (``TRACE_SCHEMA`` version 1); ``event`` says which kind. This module writes every
event and reads them back (:func:`read_trace`, :func:`split_trace`); the other rooms call it:

``collective`` (written *before* the call enters the backend)
    ``seq`` (0, 1, ... per rank, Python-level calls), ``op`` (``"all_reduce"``, ``"all_gather"``,
    ``"all_gather_object"``, ``"broadcast"``, ``"barrier"``, ``"reduce_scatter_tensor"`` ...),
    ``reduce_op`` (``"SUM"``, ``"AVG"`` ... or None), ``dtype`` (``"float32"``; ``"object"`` for the
    ``*_object`` calls), ``shape`` (list of ints, the tensor the rank contributes; None for objects
    and barriers), ``source`` (``"self.log"``: Lightning syncing a logged value;
    ``"torchmetrics"``: a ``Metric`` syncing its states at ``compute()``; ``"user"``: called from the
    user's code, e.g. ``self.all_gather``; ``"library"``: Lightning's or torch's own, e.g. a barrier
    of the Trainer or a broadcast in ``DistributedDataParallel.forward``), ``origin`` (the function that
    called ``torch.distributed``: ``"torch/nn/parallel/distributed.py:1580 in _sync_buffers"``),
    ``key`` (the logged name, where there is one), ``sync`` (for ``self.log``: ``"step"``, the sync of a
    step value in ``self.log`` itself, or ``"epoch"``, the sync of the epoch value at the epoch's end),
    ``metric``, ``states`` and ``state_sizes`` (the ``Metric`` class, its state names, and each state's size
    at the sync: ``"list of 3"``, ``"tensor [2]"``), ``hook`` (the hook the key was logged from, else the
    hook running), ``running`` (the LightningModule or callback hook running, ``_current_fx_name``),
    ``call_site`` (``"file.py:42 in validation_step"``: the innermost frame of the user's code,
    else None), ``pg_seq`` (the default process group's sequence number before the call; the Flight
    Recorder numbers the backend's collectives ``pg_seq + 1 ...``).
``done`` / ``raised``
    ``seq``, and for ``raised`` the ``error`` text: the collective returned or raised; ``done`` also
    has ``pg_seq`` after the call (the backend collectives it ran are ``pg_seq`` before + 1 .. after).
``log``
    one ``self.log`` call: ``key``, ``hook``, ``value`` (float for a scalar tensor or number; a logged
    ``Metric``'s batch value from its ``forward``; else None), ``step_value`` (with ``on_step``: the step
    value Lightning keeps, after the ``sync_dist`` all_reduce where there is one), ``batch_size`` (what
    Lightning added to the key's cumulated batch size; None where it keeps none), ``on_step``, ``on_epoch``,
    ``sync_dist``, ``reduce_fx``, ``rank_zero_only``, ``metric_object``, ``call_site``, ``reads_rank`` (the
    names of ``RANK_NAMES`` the calling function's code uses, e.g. ``["global_rank"]``).
``batch``
    a batch a loop ran: ``stage`` (``"train"``, ``"val"``, ``"test"``, ``"predict"``), ``sanity`` (true for
    the sanity check's validation batches before ``fit`` trains), ``epoch`` (``trainer.current_epoch``),
    ``batch_idx``,
    ``dataloader_idx``, ``size``, ``ids`` (the batch's ``id``/``ids``/``idx``/``index`` field) or
    ``hashes`` (one content hash per sample, from the rows of its tensors), ``sampler`` (the type
    name of the loader's sampler, first batch only).
``all_gather``
    a ``self.all_gather`` call whose data held leaves that are not tensors: ``hook``, ``call_site``,
    ``leaves`` (up to 20 ``{"path", "type", "unchanged"}``: e.g. ``"['names'][0]"``, ``"str"``, and whether the
    very object came back: Lightning gathers tensors only, pytorch_lightning/core/module.py ``all_gather``,
    ``apply_to_collection(data, Tensor, ...)`` after converting numbers), ``unchanged`` (how many came back).
``stage`` and ``metrics`` (:meth:`CollectiveTrace.stage_started`, ``stage_raised``, ``stage_ended``)
    ``stage``: ``status`` ``"start"`` (with ``stage``, ``rank``, ``world_size``), ``"end"`` or ``"raised"``
    (with ``error``); ``metrics``: ``values``, the rank's ``trainer.callback_metrics`` after a stage that
    ended, so a rank that finished is known even when another rank hangs and the world is killed.
``flight_recorder``
    written at the end of a stage that returned or raised (not by a killed rank): ``entries``, torch's
    Flight Recorder entries for this rank (``collective_seq_id``, ``profiling_name`` such as
    ``"gloo:all_reduce"``, ``input_sizes``, ``input_dtypes``), or ``unavailable`` with the reason.

Flight Recorder: on torch 2.13 it records gloo collectives too (enable with ``TORCH_FR_BUFFER_SIZE``,
read with ``torch._C._distributed_c10d._dump_fr_trace_json``), including those Python never sees (the
DDP reducer's gradient buckets), and its ``collective_seq_id`` equals the process group's sequence
number. It cannot serve alone: its buffer lives in the rank's memory and is dumped on request (NCCL's
watchdog also dumps on a timeout; gloo has no watchdog), so a rank that gloo aborts leaves nothing;
on gloo every entry stays ``"scheduled"`` (no completion is tracked), so it cannot say who waits; and
it knows no Lightning key, hook or torchmetrics state. So the Python-level functions of
``torch.distributed`` are wrapped while the trace is active, each call is written before it enters the
backend, and the Flight Recorder's entries are added at the end with ``pg_seq`` to line them up.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import sysconfig
import threading
import time
from typing import Optional

import torch
import torch.distributed

from ddpprobe._lightning import fabric, pl

#: Version of the JSON-lines format described in this module's docstring.
TRACE_SCHEMA = 1

#: Environment variable (and value) that turns torch's Flight Recorder on in a rank; the audit passes
#: it to ``run_world(env=...)``. Entries kept per rank.
FLIGHT_RECORDER_ENV = {"TORCH_FR_BUFFER_SIZE": "4000"}

#: ``torch.distributed`` functions wrapped while a trace is active.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "monitored_barrier",
)

#: Names that read the rank (attributes or functions): a ``self.log`` call whose function uses one of them
#: may log a value that depends on the rank (``log`` events' ``reads_rank``).
RANK_NAMES = frozenset({"global_rank", "local_rank", "node_rank", "get_rank", "rank"})

#: Batch fields taken as a sample's identity.
ID_FIELDS = ("id", "ids", "idx", "index", "indices", "sample_id")


def _library_dirs() -> tuple:
    import lightning_utilities
    import torchmetrics

    dirs = {os.path.dirname(m.__file__) for m in (torch, torchmetrics, lightning_utilities, pl, fabric)}
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # ddpprobe itself
    for name in ("stdlib", "platstdlib"):
        dirs.add(sysconfig.get_paths()[name])
    return tuple(d + os.sep for d in dirs)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _contributed(op: str, args, kwargs):
    """``(dtype, shape)`` of the tensor this rank contributes to the collective."""
    if op == "barrier" or op == "monitored_barrier":
        return None, None
    if op.endswith("_object") or op.endswith("_object_list"):
        return "object", None
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    if op in ("all_gather", "gather") and len(tensors) >= 1:
        tensor = tensors[0]
    elif op in ("all_gather_into_tensor", "reduce_scatter_tensor") and len(tensors) >= 2:
        tensor = tensors[1]
    elif tensors:
        tensor = tensors[0]
    else:
        lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        tensor = lists[-1][0] if lists else None
    if tensor is None:
        return None, None
    return _dtype_name(tensor.dtype), list(tensor.shape)


def _reduce_op(args, kwargs) -> Optional[str]:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.distributed.ReduceOp.RedOpType):
            return value.name
        if type(value).__name__ == "ReduceOp":
            return str(value).rsplit(".", 1)[-1]
    return None


def collective_fields(op: str, args, kwargs) -> dict:
    """``{"op", "reduce_op", "dtype", "shape"}`` of a call of the ``torch.distributed`` function ``op`` with
    ``args``/``kwargs``, as the trace's ``collective`` event and the guard's entry name them."""
    dtype, shape = _contributed(op, args, kwargs)
    return {"op": op, "reduce_op": _reduce_op(args, kwargs), "dtype": dtype, "shape": shape}


def pg_seq() -> Optional[int]:
    """The default process group's sequence number: how many collectives the backend has run on it (the
    Flight Recorder's ``collective_seq_id``); None where this backend or release does not say."""
    try:
        return int(torch.distributed.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - not every backend or release has it
        return None


def call_site_of(frame) -> Optional[str]:
    """``"file.py:42 in validation_step"``: where ``frame`` is (its file's name, line and function), or None."""
    if frame is None:
        return None
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


class CallClassifier:
    """Where a Python-level collective of a Lightning run comes from: the trace's ``source``, ``key``,
    ``metric``, ``states``, ``hook``, ``call_site`` and ``origin`` fields (see the module docstring).

    Shared by :class:`CollectiveTrace` and ``ddpprobe.guard.CollectiveGuard``, so both name a collective
    alike.

    Args:
        model: the LightningModule whose ``_current_fx_name`` is the hook of a collective no key names.
    """

    def __init__(self, model):
        self.model = model
        self.library = _library_dirs()
        loops = pl.loops.loop
        self._loop_types = tuple(
            t for t in (pl.Trainer, getattr(loops, "_Loop", None), getattr(loops, "Loop", None)) if t
        )
        #: ``(key, hook) -> call_site`` of the latest ``self.log`` call of each key (:meth:`note_log`).
        self.log_sites: dict = {}

    def note_log(self, key: str, hook: Optional[str], call_site: Optional[str]) -> None:
        """Remember where ``key`` was last logged from in ``hook``: a sync Lightning makes later, in its
        loop, is placed there."""
        self.log_sites[(key, hook)] = call_site

    def user_code(self, frame):
        """The innermost frame at or above ``frame`` of the user's code (outside torch, torchmetrics,
        Lightning, ddpprobe and the standard library), or None if there is none."""
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith(self.library) and not filename.startswith("<"):
                return frame
            frame = frame.f_back
        return None

    def user_frame(self, frame) -> Optional[str]:
        """``"file.py:42 in validation_step"`` of :meth:`user_code`, or None."""
        return call_site_of(self.user_code(frame))

    def context(self, frame, loops_are_library: bool = False) -> dict:
        """``{"source", "key", "sync", "metric", "states", "state_sizes", "hook", "running", "call_site",
        "origin"}`` of the collective called from ``frame`` (the caller of the ``torch.distributed``
        function): ``sync`` is ``"epoch"`` for a logged key's sync at ``compute()``, ``"step"`` for its
        step sync; ``state_sizes`` each Metric state's size at the sync; ``running`` the hook running.

        With ``loops_are_library``, a collective reached from the user's code only through the Trainer or
        one of its loops (``trainer.fit(...)`` in the user's script, then Lightning's own broadcast or a
        sync at the epoch end) has no call site of its own (a synced key gets the line that logged it),
        so it is ``"library"`` where no key or metric names it, not ``"user"``; the walk up the stack
        stops at that loop."""
        from torchmetrics import Metric

        key = hook = metric = states = sync = state_sizes = None
        source = None
        through_loop = reached_user = False
        f = frame
        while f is not None:
            reached_user = reached_user or not f.f_code.co_filename.startswith((*self.library, "<"))
            owner = f.f_locals.get("self")
            if owner is not None:
                kind = type(owner).__name__
                if loops_are_library and not reached_user and isinstance(owner, self._loop_types):
                    through_loop = True
                    break
                if kind == "_ResultMetric" and key is None:
                    key, hook = owner.meta.name, owner.meta.fx
                    sync = "epoch" if f.f_code.co_name == "compute" else "step"
                    source = source or "self.log"
                elif isinstance(owner, Metric) and metric is None and kind != "_ResultMetric":
                    metric, states = type(owner).__name__, list(getattr(owner, "_defaults", {}))
                    state_sizes = {name: _state_size(getattr(owner, name, None)) for name in states}
                    source = "torchmetrics"
            f = f.f_back
        call_site = None if through_loop else self.user_frame(frame)
        code = frame.f_code
        parts = code.co_filename.replace(os.sep, "/").split("/")
        tail = parts[-3:] if "site-packages" not in parts else parts[parts.index("site-packages") + 1 :]
        origin = f"{'/'.join(tail)}:{frame.f_lineno} in {code.co_name}"
        if call_site is None and key is not None:  # a logged value synced by the loop: where it was logged
            call_site = self.log_sites.get((key, hook))
        if source is None:
            source = "user" if call_site else "library"
        running = getattr(self.model, "_current_fx_name", None)
        return {
            "source": source,
            "key": key,
            "sync": sync,
            "metric": metric,
            "states": states,
            "state_sizes": state_sizes,
            "hook": hook if hook is not None else running,
            "running": running,
            "call_site": call_site,
            "origin": origin,
        }


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
        self._seq = 0
        self._local = threading.local()
        self._originals: dict = {}
        self.classifier = CallClassifier(model)
        self.log_calls: list = []

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
        for name in COLLECTIVES:
            original = getattr(torch.distributed, name, None)
            if original is not None:
                self._originals[name] = original
                setattr(torch.distributed, name, self._wrap(name, original))
        self._original_log = self.model.log
        self.model.log = self._wrap_log(self.model.log)
        self._original_all_gather = self.model.all_gather
        self.model.all_gather = self._wrap_all_gather(self.model.all_gather)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._originals.items():
            setattr(torch.distributed, name, original)
        self._originals.clear()
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

    def _wrap(self, name: str, original):
        trace = self

        @functools.wraps(original)
        def collective(*args, **kwargs):
            if getattr(trace._local, "inside", False):
                return original(*args, **kwargs)
            seq, trace._seq = trace._seq, trace._seq + 1
            group = kwargs.get("group")
            try:
                group_size = torch.distributed.get_world_size(group)
            except Exception:  # noqa: BLE001
                group_size = None
            trace.write(
                "collective",
                seq=seq,
                **collective_fields(name, args, kwargs),
                group_size=group_size,
                pg_seq=pg_seq(),
                **trace.classifier.context(sys._getframe(1)),
            )
            trace._local.inside = True
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                trace.write("raised", seq=seq, error=f"{type(exc).__name__}: {exc}"[:2000])
                raise
            finally:
                trace._local.inside = False
            trace.write("done", seq=seq, pg_seq=pg_seq())
            return result

        return collective

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
        return _BatchRecorder(self)


def _state_size(value) -> Optional[str]:
    """A ``Metric`` state's size in words: ``"list of 3"`` or ``"tensor [2]"``."""
    if isinstance(value, list):
        return f"list of {len(value)}"
    if isinstance(value, torch.Tensor):
        return f"tensor {list(value.shape)}"
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
        validator = importlib.import_module(f"{pl.__name__}.trainer.connectors.logger_connector.fx_validator")
        return validator._FxValidator.check_logging_and_get_default_levels(
            fx, on_step=options.get("on_step"), on_epoch=options.get("on_epoch")
        )
    except Exception:  # noqa: BLE001 - the original call accepted it; keep what was given
        return options.get("on_step"), options.get("on_epoch")


def _leaves(batch) -> list:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in _leaves(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in _leaves(v)]
    return []


def describe_batch(batch) -> dict:
    """``{"size", "ids", "hashes"}`` of a batch: ``ids`` from an id field (``ID_FIELDS``) of a dict batch,
    else one SHA-1 (12 hex digits) per sample over its rows of every tensor whose first dimension is
    the batch size; ``size`` None when the batch holds no tensor."""
    leaves = [t for t in _leaves(batch) if t.dim() > 0]
    if not leaves:
        return {"size": None, "ids": None, "hashes": None}
    size = int(leaves[0].shape[0])
    if isinstance(batch, dict):
        for field in ID_FIELDS:
            ids = batch.get(field)
            if isinstance(ids, torch.Tensor) and ids.dim() == 1 and not ids.is_floating_point():
                return {"size": size, "ids": [int(i) for i in ids], "hashes": None}
    rows = [t.detach().cpu().contiguous() for t in leaves if t.shape[0] == size]
    hashes = []
    for j in range(size):
        digest = hashlib.sha1()
        for t in rows:
            digest.update(t[j].numpy().tobytes() if t.dtype != torch.bfloat16 else t[j].float().numpy().tobytes())
        hashes.append(digest.hexdigest()[:12])
    return {"size": size, "ids": None, "hashes": hashes}


class _BatchRecorder(pl.Callback):
    def __init__(self, trace: CollectiveTrace):
        self.trace = trace
        self.samplers: set = set()

    def _record(self, trainer, stage: str, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        fields = {
            "stage": stage,
            "sanity": bool(getattr(trainer, "sanity_checking", False)),
            "epoch": int(getattr(trainer, "current_epoch", 0)),
            "batch_idx": batch_idx,
            "dataloader_idx": dataloader_idx,
            **describe_batch(batch),
        }
        if (stage, dataloader_idx) not in self.samplers:
            self.samplers.add((stage, dataloader_idx))
            fields["sampler"] = _sampler_name(trainer, stage, dataloader_idx)
        self.trace.write("batch", **fields)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._record(trainer, "train", batch, batch_idx)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._record(trainer, "val", batch, batch_idx, dataloader_idx)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._record(trainer, "test", batch, batch_idx, dataloader_idx)

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._record(trainer, "predict", batch, batch_idx, dataloader_idx)


def _sampler_name(trainer, stage: str, dataloader_idx: int) -> Optional[str]:
    attr = {
        "train": "train_dataloader",
        "val": "val_dataloaders",
        "test": "test_dataloaders",
        "predict": "predict_dataloaders",
    }[stage]
    try:
        loaders = getattr(trainer, attr)
        if isinstance(loaders, (list, tuple)):
            loaders = loaders[dataloader_idx]
        elif isinstance(loaders, dict):
            loaders = list(loaders.values())[dataloader_idx]
        if isinstance(getattr(loaders, "dataset", None), torch.utils.data.IterableDataset):
            return "IterableDataset (no sampler)"
        sampler = getattr(loaders, "sampler", None)
        batch_sampler = getattr(loaders, "batch_sampler", None)
        inner = getattr(batch_sampler, "sampler", None)
        if inner is not None and type(sampler).__name__ == "SequentialSampler" and inner is not sampler:
            sampler = inner
        return type(sampler).__name__ if sampler is not None else None
    except Exception:  # noqa: BLE001
        return None


def describe_collective(entry: dict) -> str:
    """One collective (a ``collective`` event of this trace, or an entry of the audit's sequences) in words, as
    the audit's divergence report and the guard's errors print it: ``all_reduce float32 [] (self.log epoch sync
    of 'val_loss', logged in validation_step) at module.py:12 in validation_step``; an entry without ``sync``
    (the guard's) leaves out whether it synced a step or an epoch value."""
    shape = "" if entry.get("shape") is None else f" {list(entry['shape'])}"
    text = f"{entry['op']}{(' ' + entry['dtype']) if entry.get('dtype') else ''}{shape}"
    source = entry.get("source")
    if source == "torchmetrics":
        text += f" ({entry.get('metric')} state sync at compute()"
        if entry.get("key"):
            text += f", logged as {entry['key']!r}"
        text += ")"
    elif source == "self.log":
        level = {"step": "step ", "epoch": "epoch "}.get(entry.get("sync"), "")
        text += f" (self.log {level}sync of {entry.get('key')!r}, logged in {entry.get('hook')})"
    elif source == "internal":
        text += " (not called from Python: e.g. DDP's gradient all_reduce in backward)"
    elif source == "library":
        text += f" (called by {entry.get('origin') or 'Lightning or torch'}" + (
            f", in {entry['hook']})" if entry.get("hook") else ")"
        )
    else:
        text += " (your code)"
    if entry.get("call_site"):
        text += f" at {entry['call_site']}"
    return text


# -- reading ---------------------------------------------------------------------------------------


def read_trace(path: str) -> list:
    """The events of a trace file, in order; a last line cut off by a killed rank is dropped."""
    events = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    except FileNotFoundError:
        pass
    return events


def batch_samples(batches: list) -> list:
    """The samples of ``batch`` events, in order: ``("id", 3)`` from ``ids``, ``("hash", "ab12...")`` from
    ``hashes``."""
    out = []
    for batch in batches:
        if batch.get("ids") is not None:
            out += [("id", i) for i in batch["ids"]]
        elif batch.get("hashes") is not None:
            out += [("hash", h) for h in batch["hashes"]]
    return out


def sample_label(sample: tuple) -> str:
    """A sample of :func:`batch_samples` as the report writes it: ``"3"``, or ``"#ab12cd"`` for a hash."""
    return str(sample[1]) if sample[0] == "id" else f"#{sample[1][:6]}"


def _step_loop(hook: str) -> Optional[str]:
    """The loop whose batch a ``*_step`` hook is running (``"val"`` for ``validation_step``), else None."""
    if not hook.endswith("_step"):
        return None
    for part, loop in (("train", "train"), ("validation", "val"), ("test", "test"), ("predict", "predict")):
        if part in hook:
            return loop
    return None


class _Reader:
    """Folds one rank's events into :func:`split_trace`'s groups; one method per event."""

    def __init__(self):
        self.by_seq: dict = {}
        self.current: dict = {}  # loop -> the batch event it is running
        self.out = {
            "collectives": [],
            "logs": [],
            "batches": [],
            "flight_recorder": None,
            "flight_recorder_unavailable": None,
            "stage": None,
            "stage_error": None,
            "all_gathers": [],
        }

    def on_collective(self, event: dict) -> None:
        entry = {k: v for k, v in event.items() if k not in ("event", "t")}
        entry["status"] = "pending"
        self.by_seq[event["seq"]] = entry
        self.out["collectives"].append(entry)

    def on_done(self, event: dict) -> None:
        entry = self.by_seq.get(event.get("seq"))
        if entry is not None:
            entry["status"], entry["pg_seq_after"] = event["event"], event.get("pg_seq")
            if event["event"] == "raised":
                entry["error"] = event.get("error")

    on_raised = on_done

    def on_log(self, event: dict) -> None:
        running = self.current.get(_step_loop(event.get("hook") or ""))
        samples = batch_samples([running]) if running else []
        self.out["logs"].append({**event, "batch_ids": [sample_label(s) for s in samples] or None})

    def on_batch(self, event: dict) -> None:
        self.out["batches"].append(event)
        self.current[event.get("stage")] = event

    def on_metrics(self, event: dict) -> None:
        self.out["callback_metrics"] = event.get("values") or {}

    def on_all_gather(self, event: dict) -> None:
        self.out["all_gathers"].append(event)

    def on_flight_recorder(self, event: dict) -> None:
        self.out["flight_recorder"] = event.get("entries") or []
        self.out["flight_recorder_unavailable"] = event.get("unavailable")

    def on_stage(self, event: dict) -> None:
        if event.get("status") in ("end", "raised"):
            self.out["stage"], self.out["stage_error"] = event["status"], event.get("error")


def split_trace(events: list) -> dict:
    """Group one rank's trace events (:func:`read_trace`): ``collectives`` (each ``collective`` event with
    ``status`` ``"done"``, ``"raised"`` (and ``error``) or ``"pending"``: entered and never left, and
    ``pg_seq_after``), ``logs`` (``log`` events; one from a ``*_step`` hook gets ``batch_ids``: the samples
    of the batch its loop was running, else None), ``batches``, ``flight_recorder`` (entries, or None when
    not written) and ``flight_recorder_unavailable``, ``stage`` (``"end"``, ``"raised"``, or None: the rank
    never finished its stage), ``stage_error``, ``callback_metrics`` (only when a ``metrics`` event was
    written) and ``all_gathers`` (the ``all_gather`` events)."""
    reader = _Reader()
    for event in events:
        handler = getattr(reader, f"on_{event.get('event')}", None)
        if handler is not None:
            handler(event)
    return reader.out

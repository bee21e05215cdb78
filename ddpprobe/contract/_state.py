"""A rank's state as one flat record of named fields: what the contract (``_table.py``) compares across ranks.

:func:`snapshot` reads, from a running ``Trainer`` and its LightningModule, a fixed schema of fields, each a
path (``"optimizer[0].group[0].lr"``) and a JSON-ready value. Large tensors are recorded as a digest with a
few numbers a person can read; small values as themselves. A field that cannot be read is recorded as
``{"unreadable": "<error>"}``, never guessed. The schema, field by field:

``trainer.global_step``, ``trainer.current_epoch`` (ints), ``trainer.should_stop`` (bool),
``trainer.num_training_batches`` (int or ``"inf"``), ``trainer.num_val_batches`` (list),
``trainer.accumulate_grad_batches``
    the loop's counters and flags (pytorch_lightning/trainer/trainer.py properties).
``optimizer[i].type``
    the optimizer's class name.
``optimizer[i].group[j].<name>``
    every hyperparameter of a param group (``lr``, ``momentum``, ``betas``, ``weight_decay`` ...): numbers,
    bools, strings and tuples of them as values, anything else as its type name.
``optimizer[i].group[j].params``
    the names of the group's parameters (``module.named_parameters`` order), each with ``"(frozen)"`` when its
    ``requires_grad`` is False.
``optimizer[i].state_size``
    how many parameters have optimizer state (momentum buffers, Adam's moments): 0 before the first step.
``scheduler[i].<name>``
    the scalar entries of an LR scheduler's ``state_dict()`` (``last_epoch``, ``_step_count``, ``base_lrs``,
    ``_last_lr``), and ``scheduler[i].interval`` / ``.frequency`` from Lightning's scheduler config.
``param.<name>``
    a parameter: :func:`tensor_value` (digest, shape, dtype, sum and norm; the values themselves when it has
    at most ``SMALL`` elements). ``param.<name>.requires_grad``: bool.
``buffer.<name>``
    a buffer (BatchNorm's running stats ...), as a parameter.
``callback.<Class>.<name>``
    the scalar entries of each callback's ``state_dict()`` (``best_model_path``, ``wait_count``, ``best_score``
    ...); other entries as :func:`object_value`.
``module.attr.<name>``, ``datamodule.attr.<name>``
    each attribute the user's code set on the LightningModule or LightningDataModule instance (its
    ``__dict__`` less Lightning's and torch's own attributes and private names): :func:`object_value`.
``loader.<stage>[i].dataset``
    the dataset a rank's loader reads (``train``, ``val``, ``test``, ``predict``): its type, length and a digest
    of its first ``DATASET_ITEMS`` items, so ranks that read different datasets show it.

Each record also names its boundary (:data:`BOUNDARIES`): the hook after which it was taken.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Optional

#: Tensors with at most this many elements are recorded value by value.
SMALL = 8
#: Items of a dataset whose digest is recorded (the first ones, in index order).
DATASET_ITEMS = 32

#: The boundaries a record is taken at, in the order a ``fit`` passes them: ``setup`` (the callbacks' ``setup`` hook:
#: the factories ran, DDP has not wrapped the module yet), ``start`` (``on_fit_start`` / ``on_validation_start`` ...:
#: after DDP's wrap, before any batch), ``train_start`` (the first ``on_train_batch_start``: the loaders are built
#: and the module's own ``on_fit_start`` and ``on_train_start`` ran, before any training step), ``eval_start`` (the
#: same for ``validate``, ``test`` and ``predict``: their loop's first batch start, after the module's own
#: ``on_validation_start`` ...), ``train_batch_end`` (after each training batch, so after its optimizer step),
#: ``<stage>_epoch_end`` and ``end`` (``on_fit_end`` ...).
BOUNDARIES = (
    "setup",
    "start",
    "train_start",
    "eval_start",
    "train_batch_end",
    "train_epoch_end",
    "val_epoch_end",
    "test_epoch_end",
    "end",
)


def _number(value):
    number = float(value)
    return number if math.isfinite(number) else str(number)


_ADDRESS = re.compile(r"at 0x[0-9a-fA-F]+")


def _digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:12]


def tensor_value(tensor) -> dict:
    """``{"digest", "shape", "dtype", "sum", "norm"}`` of a tensor, plus ``"values"`` (a flat list) when it has at
    most :data:`SMALL` elements. The digest is a SHA-1 (12 hex digits) of its bytes: equal digests, equal tensors;
    ``sum`` and ``norm`` are float32 reductions, for reading (about 6 digits)."""
    import torch

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.layout != torch.strided:  # a sparse gradient (nn.Embedding(sparse=True)): its dense values
        t = t.to_dense()
    t = t.contiguous()
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    out = {
        "digest": _digest(memoryview(raw.numpy()).cast("B")),
        "shape": list(t.shape),
        "dtype": str(t.dtype).replace("torch.", ""),
    }
    if t.is_floating_point() or t.is_complex():
        f = (t.abs() if t.is_complex() else t).float()  # float32 sums: a float64 reduction costs 400x more here
        out["sum"] = _number(f.sum())
        out["norm"] = _number(f.norm())
    elif t.dtype != torch.bool:
        out["sum"] = int(t.sum())
    if t.numel() <= SMALL:
        out["values"] = [_number(v) if isinstance(v, float) else v for v in t.flatten().tolist()]
    return out


def object_value(value):
    """A JSON-ready value of any attribute: numbers, strings, bools and None as themselves; a tensor as
    :func:`tensor_value`; a list, tuple, dict or set as ``{"type", "len", "digest"}`` (the digest of its
    ``repr``, tensors by their bytes); anything else as ``{"type"}``."""
    import torch

    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, torch.Tensor):
        return tensor_value(value)
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        items = list(value.items()) if isinstance(value, dict) else list(value)
        parts = [_item_bytes(item) for item in items[:256]]
        if isinstance(value, (set, frozenset)):
            parts.sort()  # a set's order depends on the process's string hashing (PYTHONHASHSEED)
        digest = hashlib.sha1()
        for part in parts:
            digest.update(part)
        return {"type": type(value).__name__, "len": len(value), "digest": digest.hexdigest()[:12]}
    return {"type": type(value).__name__}


def _item_bytes(item) -> bytes:
    import torch

    if isinstance(item, torch.Tensor):
        return (
            item.detach().cpu().contiguous().numpy().tobytes() if item.dtype != torch.bfloat16 else repr(item).encode()
        )
    if isinstance(item, tuple):
        return b"(" + b",".join(_item_bytes(i) for i in item) + b")"
    # An object's default repr holds its memory address, which differs from process to process.
    return _ADDRESS.sub("at 0x?", repr(item)).encode()


def _read(out: dict, path: str, reader) -> None:
    """``out[path] = reader()``, or ``{"unreadable": "<error>"}`` when reading raises."""
    try:
        out[path] = reader()
    except Exception as exc:  # noqa: BLE001 - a field a rank cannot read is recorded as such
        out[path] = {"unreadable": f"{type(exc).__name__}: {exc}"[:200]}


def _trainer_fields(out: dict, trainer) -> None:
    _read(out, "trainer.global_step", lambda: int(trainer.global_step))
    _read(out, "trainer.current_epoch", lambda: int(trainer.current_epoch))
    _read(out, "trainer.should_stop", lambda: bool(trainer.should_stop))
    _read(out, "trainer.accumulate_grad_batches", lambda: int(trainer.accumulate_grad_batches))
    if trainer.training or trainer.state.fn == "fit":
        _read(out, "trainer.num_training_batches", lambda: object_value(trainer.num_training_batches))
    if trainer.state.fn in ("fit", "validate"):
        _read(out, "trainer.num_val_batches", lambda: [object_value(n) for n in trainer.num_val_batches])


def _hyper(value):
    if isinstance(value, (bool, str, int, float)) or value is None:
        return object_value(value)
    if isinstance(value, (tuple, list)) and all(isinstance(v, (int, float, bool)) for v in value):
        return [object_value(v) for v in value]
    return object_value(value)


def _optimizer_fields(out: dict, trainer, names: dict) -> None:
    for i, optimizer in enumerate(getattr(trainer, "optimizers", None) or []):
        inner = getattr(optimizer, "optimizer", optimizer)  # Lightning's LightningOptimizer wraps it
        out[f"optimizer[{i}].type"] = type(inner).__name__
        for j, group in enumerate(inner.param_groups):
            for key, value in group.items():
                if key == "params":
                    out[f"optimizer[{i}].group[{j}].params"] = [
                        names.get(id(p), "<not a module parameter>") + ("" if p.requires_grad else " (frozen)")
                        for p in value
                    ]
                else:
                    _read(out, f"optimizer[{i}].group[{j}].{key}", lambda v=value: _hyper(v))
        out[f"optimizer[{i}].state_size"] = len(inner.state)
    for i, config in enumerate(getattr(trainer, "lr_scheduler_configs", None) or []):
        out[f"scheduler[{i}].type"] = type(config.scheduler).__name__
        out[f"scheduler[{i}].interval"] = config.interval
        out[f"scheduler[{i}].frequency"] = config.frequency
        try:
            state = config.scheduler.state_dict()
        except Exception as exc:  # noqa: BLE001
            out[f"scheduler[{i}].state"] = {"unreadable": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        for key, value in state.items():
            if isinstance(value, (int, float, bool, str)) or (
                isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value)
            ):
                out[f"scheduler[{i}].{key}"] = _hyper(value)


def _module_fields(out: dict, module) -> None:
    for name, param in module.named_parameters():
        _read(out, f"param.{name}", lambda p=param: tensor_value(p))
        out[f"param.{name}.requires_grad"] = bool(param.requires_grad)
    for name, buffer in module.named_buffers():
        if buffer is not None:
            _read(out, f"buffer.{name}", lambda b=buffer: tensor_value(b))


def _callback_fields(out: dict, trainer) -> None:
    for callback in getattr(trainer, "callbacks", None) or []:
        name = type(callback).__name__
        if name.startswith("_"):
            continue  # ddpprobe's own recorders
        try:
            state = callback.state_dict()
        except Exception as exc:  # noqa: BLE001
            out[f"callback.{name}"] = {"unreadable": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        for key, value in (state or {}).items():
            _read(out, f"callback.{name}.{key}", lambda v=value: object_value(v))


#: Attribute names a LightningModule or LightningDataModule sets itself (checked against an instance made
#: without arguments, once per class of Lightning; see :func:`_own_attributes`).
_OWN: dict = {}


def _own_attributes(base) -> frozenset:
    if base not in _OWN:
        try:
            _OWN[base] = frozenset(vars(base()))
        except Exception:  # noqa: BLE001 - a base that cannot be built bare: keep every public name
            _OWN[base] = frozenset()
    return _OWN[base]


def _attribute_fields(out: dict, prefix: str, obj, base) -> None:
    import torch

    own = _own_attributes(base)
    for name, value in vars(obj).items():
        if name.startswith("_") or name in own or isinstance(value, torch.nn.Module):
            continue
        _read(out, f"{prefix}.attr.{name}", lambda v=value: object_value(v))


def _loader_fields(out: dict, trainer) -> None:
    attrs = {
        "train": "train_dataloader",
        "val": "val_dataloaders",
        "test": "test_dataloaders",
        "predict": "predict_dataloaders",
    }
    for stage, attr in attrs.items():
        try:
            loaders = getattr(trainer, attr, None)
        except Exception:  # noqa: BLE001 - a property that builds nothing yet
            continue
        if loaders is None:
            continue
        if isinstance(loaders, dict):
            loaders = list(loaders.values())
        elif not isinstance(loaders, (list, tuple)):
            loaders = [loaders]
        for i, loader in enumerate(loaders):
            dataset = getattr(loader, "dataset", None)
            if dataset is not None:
                _read(out, f"loader.{stage}[{i}].dataset", lambda d=dataset: dataset_value(d))


#: ``{id(dataset): (dataset, value)}``: a dataset's value is read once (reading items can be slow).
_DATASETS: dict = {}


def dataset_value(dataset) -> dict:
    """``{"type", "len", "digest"}`` of a map-style dataset (the digest over its first :data:`DATASET_ITEMS`
    items); ``{"type", "len": None}`` for one without ``__len__`` (an ``IterableDataset``).

    The items are read once per dataset object (later calls return the first value), under a fixed random state
    that is put back afterwards: a random augmentation in ``__getitem__`` then reads alike on every rank, and the
    run's own random draws are not disturbed."""
    cached = _DATASETS.get(id(dataset))
    if cached is not None and cached[0] is dataset:
        return cached[1]
    try:
        size = len(dataset)
    except TypeError:
        return {"type": type(dataset).__name__, "len": None}
    digest = hashlib.sha1()
    with _fixed_random_state():
        for index in range(min(size, DATASET_ITEMS)):
            digest.update(_item_bytes(_as_tuple(dataset[index])))
    value = {"type": type(dataset).__name__, "len": size, "digest": digest.hexdigest()[:12]}
    _DATASETS[id(dataset)] = (dataset, value)
    return value


class _fixed_random_state:
    """Within: torch's, NumPy's and ``random``'s generators seeded 0; after: each put back as it was."""

    def __enter__(self):
        import random

        import numpy
        import torch

        self._states = (torch.get_rng_state(), numpy.random.get_state(), random.getstate())
        torch.manual_seed(0)
        numpy.random.seed(0)
        random.seed(0)

    def __exit__(self, *exc):
        import random

        import numpy
        import torch

        torch.set_rng_state(self._states[0])
        numpy.random.set_state(self._states[1])
        random.setstate(self._states[2])


def _as_tuple(item):
    if isinstance(item, dict):
        return tuple(item[k] for k in sorted(item))
    if isinstance(item, list):
        return tuple(item)
    return item


def snapshot(trainer, module, fields: Optional[tuple] = None) -> dict:
    """The rank's state as ``{path: value}`` (the schema of this module's docstring).

    Args:
        trainer: the running ``Trainer``.
        module: its LightningModule (the user's instance, not DDP's wrapper).
        fields: the path prefixes to read (``("param.", "optimizer")``); default every field.

    Reads only: nothing in the run changes, and no collective is made.
    """
    from ddpprobe import _lightning

    pl = _lightning.pl
    names = {id(p): n for n, p in module.named_parameters()}
    out: dict = {}
    wanted = (
        (lambda prefix: True)
        if fields is None
        else (lambda prefix: any(f.startswith(prefix) or prefix.startswith(f) for f in fields))
    )
    if wanted("trainer."):
        _trainer_fields(out, trainer)
    if wanted("optimizer") or wanted("scheduler"):
        _optimizer_fields(out, trainer, names)
    if wanted("param.") or wanted("buffer."):
        _module_fields(out, module)
    if wanted("callback."):
        _callback_fields(out, trainer)
    if wanted("module.attr."):
        _attribute_fields(out, "module", module, pl.LightningModule)
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and wanted("datamodule.attr."):
        _attribute_fields(out, "datamodule", datamodule, pl.LightningDataModule)
    if wanted("loader."):
        _loader_fields(out, trainer)
    if fields is not None:
        out = {k: v for k, v in out.items() if any(k.startswith(f) for f in fields)}
    return out


def show(value) -> str:
    """A recorded value as reports write it: a number as itself (floats to 6 digits), a string quoted, a tensor by its
    values when small, else by its norm and digest, a container by its type, length and digest, a field no rank
    holds as ``(no such field)``. One wording for the audit and the guard."""
    if isinstance(value, float):
        return format(value, ".6g")
    if isinstance(value, dict):
        if "unreadable" in value:
            return "unreadable"
        if "values" in value:
            return "[" + ", ".join(show(v) for v in value["values"]) + "]"
        if "norm" in value:
            return f"norm {show(value['norm'])} (digest {value['digest'][:8]})"
        if "digest" in value:
            size = f" of {value['len']}" if value.get("len") is not None else ""
            return f"{value.get('type', 'tensor')}{size} (digest {value['digest'][:8]})"
        if "type" in value:
            return f"an object of type {value['type']}"
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value[:6]) + (", ..." if len(value) > 6 else "") + "]"
    if value == "(no such field)":
        return value
    return "none" if value is None else repr(value) if isinstance(value, str) else str(value)

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
    the dataset a rank's loader reads (``train``, ``val``, ``test``, ``predict``): :func:`dataset_value`, its type,
    length and a digest of its own state (the tensors, arrays, index and file lists it holds; never its items,
    never its random generators), so ranks that hold different datasets show it.

A record changes nothing in the run and never fails it: it reads attributes and tensors only (no item of a
dataset, no forward, no random draw), and a field it cannot read (a lazy layer's parameter before its first
forward, a meta tensor) is recorded as ``{"unreadable": "<reason>"}``.

Each record also names its boundary (:data:`BOUNDARIES`): the hook after which it was taken.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
import types
import weakref
from typing import Optional

#: Tensors with at most this many elements are recorded value by value.
SMALL = 8

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

    reason = unreadable_reason(tensor)
    if reason is not None:
        return {"unreadable": reason}
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


def unreadable_reason(tensor):
    """Why ``tensor``'s values cannot be read, or None: a lazy module's parameter or buffer before its first forward
    (``torch.nn.parameter.UninitializedParameter`` / ``UninitializedBuffer``: no shape, no data yet) or a meta tensor
    (``device="meta"``: a shape without data). Reading either raises in torch; a record says this instead."""
    from torch.nn.parameter import UninitializedTensorMixin

    if isinstance(tensor, UninitializedTensorMixin):
        return f"{type(tensor).__name__}: a lazy module's tensor before its first forward (no shape or data yet)"
    if tensor.is_meta:
        return f"a meta tensor of shape {list(tensor.shape)}: a shape without data"
    return None


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
        reason = unreadable_reason(item)
        if reason is not None:
            return f"unreadable: {reason}".encode()
        return bytes(_tensor_bytes(item))
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
        if getattr(config, "monitor", None):
            out[f"scheduler[{i}].monitor"] = str(config.monitor)
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


#: How deep :func:`dataset_value` follows the objects a dataset holds (a wrapper's dataset, a transform's fields).
DATASET_DEPTH = 6
#: Elements of a list, tuple, dict or set a dataset holds that are read one by one (a longer one of plain values
#: is read whole from its ``repr``; of other values, its first ones and its length).
DATASET_ELEMENTS = 10_000


def _generator_types() -> tuple:
    """The random generators a dataset may hold for its own draws: ``random.Random``, NumPy's ``Generator``,
    ``RandomState``, ``BitGenerator`` and ``SeedSequence``, ``torch.Generator``."""
    import random

    import numpy
    import torch

    np_random = numpy.random
    return (
        random.Random,
        torch.Generator,
        np_random.Generator,
        np_random.RandomState,
        np_random.BitGenerator,
        np_random.SeedSequence,
    )


def _is_seed(path: str, value) -> bool:
    """An integer attribute named as a seed (``seed``, ``aug_seed``, ``base_seed`` ...): the seed of the dataset's
    own generator, which may be the rank's as the generator is."""
    return isinstance(value, int) and not isinstance(value, bool) and "seed" in path.rsplit(".", 1)[-1].lower()


#: Values read as their ``repr`` (which holds no memory address).
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


class _DatasetDigest:
    """The walk of :func:`dataset_value`: every value a dataset holds fed to one SHA-1, by reading attributes
    (``vars``) only; ``left_out`` the paths of the random generators it skipped, ``unreadable`` the paths and
    reasons of the tensors that hold no data."""

    def __init__(self):
        self.hash = hashlib.sha1()
        self.left_out: list = []
        self.unreadable: list = []
        self._generators = _generator_types()
        self._seen: set = set()

    def feed(self, value, path: str, depth: int) -> None:
        import numpy
        import torch

        update = self.hash.update
        if isinstance(value, self._generators) or _is_seed(path, value):
            self.left_out.append(path)  # a per-rank generator is right: each rank draws its own augmentation
            update(b"generator;")
            return
        if isinstance(value, _PLAIN):
            update(f"{type(value).__name__}:{value!r};".encode())
            return
        if isinstance(value, torch.Tensor):
            reason = unreadable_reason(value)
            if reason is not None:
                self.unreadable.append(f"{path}: {reason}")
                update(f"unreadable tensor {list(value.shape) if value.is_meta else ''};".encode())
                return
            update(f"tensor {value.dtype} {list(value.shape)};".encode())
            update(_held_tensor_digest(value))
            return
        if isinstance(value, numpy.ndarray):
            update(f"ndarray {value.dtype} {list(value.shape)};".encode())
            if value.dtype.hasobject:
                self.feed(value.ravel().tolist(), path, depth)
            else:
                update(memoryview(numpy.ascontiguousarray(value)).cast("B"))
            return
        if isinstance(value, numpy.generic):
            update(f"{type(value).__name__}:{value!r};".encode())
            return
        if isinstance(value, os.PathLike):
            update(f"path:{os.fspath(value)!r};".encode())
            return
        if id(value) in self._seen or depth <= 0:
            update(f"{type(value).__qualname__} (not followed);".encode())
            return
        self._seen.add(id(value))
        try:
            self._feed_container(value, path, depth)
        finally:
            self._seen.discard(id(value))

    def _feed_container(self, value, path: str, depth: int) -> None:
        update = self.hash.update
        if isinstance(value, (list, tuple, set, frozenset, dict)):
            items = list(value.items()) if isinstance(value, dict) else value
            update(f"{type(value).__name__} of {len(value)};".encode())
            if all(type(v) in _PLAIN for v in (value if isinstance(value, (list, tuple)) else ())):
                update(repr(value).encode())  # an index list, a list of file names: read whole
                return
            if isinstance(value, (set, frozenset)):  # a set's order follows the process's string hashing
                items = sorted(value, key=repr) if all(type(v) in _PLAIN for v in value) else list(value)
            elif isinstance(value, dict):
                items = sorted(items, key=lambda kv: repr(kv[0])) if all(type(k) in _PLAIN for k in value) else items
            for i, item in enumerate(itertools.islice(items, DATASET_ELEMENTS)):
                if isinstance(value, dict):
                    update(f"key {item[0]!r};".encode() if type(item[0]) in _PLAIN else b"key;")
                    self.feed(item[1], f"{path}[{item[0]!r}]", depth - 1)
                else:
                    self.feed(item, f"{path}[{i}]", depth - 1)
            return
        if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType)):
            name = getattr(value, "__qualname__", None) or getattr(value, "__name__", "")
            update(f"{type(value).__name__} {getattr(value, '__module__', '')}.{name};".encode())
            return
        update(f"object {type(value).__module__}.{type(value).__qualname__};".encode())
        attributes = getattr(value, "__dict__", None)
        if not isinstance(attributes, dict):
            return  # slots or a C object: its type only
        for name in sorted(attributes):
            update(f"attr {name};".encode())
            self.feed(attributes[name], f"{path}.{name}", depth - 1)


#: ``{id(tensor): (weak reference, version, data pointer, digest)}``: a tensor a dataset holds is hashed again only
#: when torch's version counter says it changed in place (or it is another tensor); a dataset of a few hundred MB
#: then costs its hash once, not at every boundary.
_HELD: dict = {}


def _held_tensor_digest(tensor) -> bytes:
    key = (tensor._version, tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), str(tensor.dtype))
    cached = _HELD.get(id(tensor))
    if cached is not None and cached[0]() is tensor and cached[1] == key:
        return cached[2]
    digest = hashlib.sha1(_tensor_bytes(tensor)).digest()
    try:
        _HELD[id(tensor)] = (weakref.ref(tensor, lambda _, k=id(tensor): _HELD.pop(k, None)), key, digest)
    except TypeError:  # a tensor subclass without weak references: hashed every time
        pass
    return digest


def _tensor_bytes(tensor) -> memoryview:
    import torch

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.layout != torch.strided:
        t = t.to_dense()
    t = t.contiguous()
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    return memoryview(raw.numpy()).cast("B")


def dataset_value(dataset) -> dict:
    """``{"type", "len", "digest"}`` of the dataset a rank's loader reads, from the dataset's own state: its
    class, its length (``len(dataset)``, None for one without ``__len__``, an ``IterableDataset``) and a SHA-1
    (12 hex digits) over every value it holds, read attribute by attribute (``vars``): tensors and arrays by
    their bytes, index and file lists, strings and numbers by their ``repr``, and the objects it holds the same
    way, ``DATASET_DEPTH`` levels deep (``Subset``'s dataset and indices, ``ConcatDataset``'s datasets, a
    transform's fields). Also ``"left_out"``: the paths (``"dataset.generator"``) of the random generators it holds
    (``random.Random``, NumPy's, ``torch.Generator``) and of the integers named as their seeds (``"seed"`` in the
    attribute's name), which are not read: a generator seeded per rank is right.
    And ``"unreadable"``: the tensors that hold no data (meta tensors, lazy parameters), each ``"path: reason"``.

    Reads only: no item is read (``__getitem__`` is never called), no random number is drawn, no property or
    method of the dataset runs but ``__len__``; nothing is kept between calls, so a dataset changed later reads
    as changed. Raises what ``__len__`` raises but ``TypeError`` (the caller records it as unreadable)."""
    try:
        size = len(dataset)
    except TypeError:
        size = None
    walk = _DatasetDigest()
    walk.feed(dataset, "dataset", DATASET_DEPTH)
    value = {"type": type(dataset).__name__, "len": size, "digest": walk.hash.hexdigest()[:12]}
    if walk.left_out:
        value["left_out"] = walk.left_out
    if walk.unreadable:
        value["unreadable_parts"] = walk.unreadable
    return value


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

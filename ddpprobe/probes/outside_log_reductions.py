"""The outside-``self.log`` reduction probe: ``trainer.strategy.reduce`` and Fabric's ``all_reduce`` called by
hand, on int64, bool and float tensors and on plain Python numbers.

Each rank builds its input from a table the test chooses (``values[kind][rank]``, a list for a tensor, a
number for a Python number), calls the reduction once per op, and records what it got back and what became
of its input. Both calls end in the same helper:
``DDPStrategy.reduce`` (pytorch_lightning/strategies/ddp.py) and ``Fabric.all_reduce``
(lightning_fabric/fabric.py, via lightning_fabric/strategies/ddp.py ``DDPStrategy.all_reduce``) call
lightning_fabric/utilities/distributed.py ``_sync_ddp``, which all-reduces *in place* with SUM and, for
``"mean"`` on gloo (no ``ReduceOp.AVG`` there), divides by the world size: ``result.div_(W)`` for a float
tensor, ``result.copy_(result / W)`` for any other dtype. ``DDPStrategy.reduce`` hands a non-tensor back
untouched; ``Fabric.all_reduce`` first converts numbers to tensors (``convert_to_tensors``: bool -> uint8,
int -> int32, float -> float32; lightning_fabric/utilities/apply_func.py ``CONVERSION_DTYPES``).
"""

from __future__ import annotations

import torch

from ddpprobe._lightning import fabric, pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, id_loader
from ddpprobe.trace import pg_seq

#: ``kind -> torch dtype`` of the tensor inputs; the other kinds are Python numbers. ``"int64_clone"`` is an
#: int64 tensor passed as ``x.clone()``: its record's ``input_after`` is the original ``x``.
TENSOR_KINDS = {
    "int64": torch.int64,
    "bool": torch.bool,
    "float32": torch.float32,
    "float64": torch.float64,
    "int64_clone": torch.int64,
}
#: ``"python_bool_all"`` is a second bool table (e.g. True on every rank).
NUMBER_KINDS = {"python_int": int, "python_float": float, "python_bool": bool, "python_bool_all": bool}

#: The calls the probe makes: name -> keyword arguments of the reduction (``{}``: its default op).
OPS = {"default": {}, "mean": {"reduce_op": "mean"}, "sum": {"reduce_op": "sum"}}


def _plain(value):
    """A tensor or number as JSON: ``{"type", "dtype", "value"}`` (``value`` a list for a tensor)."""
    if isinstance(value, torch.Tensor):
        return {"type": "Tensor", "dtype": str(value.dtype).replace("torch.", ""), "value": value.tolist()}
    return {"type": type(value).__name__, "dtype": None, "value": value}


def _make(kind: str, value):
    if kind in TENSOR_KINDS:
        return torch.tensor(value, dtype=TENSOR_KINDS[kind])
    return NUMBER_KINDS[kind](value)


def _reduce_each(reduce, values: dict, rank: int) -> dict:
    """``{kind: {op: {"returned", "input_after", "same_object", "collectives", "error"}}}`` for one reduction
    function.

    Each call gets a fresh input built from ``values[kind][rank]``, so the calls do not feed each other.
    ``same_object`` is whether the returned object is the one built from the table (``input_after``).
    ``collectives`` is how many collectives the call ran on the default process group (its sequence number
    after the call minus before; None where the backend does not number them).
    ``error`` is ``{"type", "message"}`` when the call raised (the other fields are then None).
    """
    out: dict = {}
    for kind, per_rank in values.items():
        out[kind] = {}
        for op, kwargs in OPS.items():
            given = _make(kind, per_rank[rank])
            passed = given.clone() if kind.endswith("_clone") else given
            entry = {"returned": None, "input_after": None, "same_object": None, "collectives": None, "error": None}
            before = pg_seq()
            try:
                returned = reduce(passed, **kwargs)
            except Exception as exc:  # noqa: BLE001 - what the reduction raises is the record
                entry["error"] = {"type": type(exc).__name__, "message": str(exc)}
            else:
                entry.update(returned=_plain(returned), input_after=_plain(given), same_object=returned is given)
            after = pg_seq()
            if before is not None and after is not None:
                entry["collectives"] = after - before
            out[kind][op] = entry
    return out


class _ReduceProbe(pl.LightningModule):
    def __init__(self, values: dict):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.values = values
        self.reduced: dict = {}

    def validation_step(self, batch, batch_idx):
        return None

    def on_validation_epoch_end(self):
        self.reduced = _reduce_each(self.trainer.strategy.reduce, self.values, self.global_rank)


def strategy_reduce(info: RankInfo, values: dict) -> dict:
    """Scenario: in ``on_validation_epoch_end`` of a ``trainer.validate``, call
    ``trainer.strategy.reduce(x)``, ``reduce(x, reduce_op="mean")`` and ``reduce(x, reduce_op="sum")`` on
    ``x`` built from ``values[kind][rank]`` for every ``kind`` given: a tensor from a list for the kinds of
    ``TENSOR_KINDS`` (``"int64"``, ``"bool"``, ``"float32"``, ``"float64"``, ``"int64_clone"``), a number for
    ``"python_int"``, ``"python_float"``, ``"python_bool"``, ``"python_bool_all"``.

    Record keys: ``reduced`` (``{kind: {"default"|"mean"|"sum": {"returned", "input_after", "same_object",
    "collectives", "error"}}}``; ``returned`` and ``input_after`` are ``{"type", "dtype", "value"}``,
    ``same_object`` whether the returned object is the input, ``collectives`` the number of collectives the
    call ran, see ``_reduce_each``).
    """
    model = _ReduceProbe(values)
    trainer = ddp_trainer(info)
    trainer.validate(model, dataloaders=id_loader(info.world_size, 1), verbose=False)
    return {"reduced": model.reduced}


def fabric_all_reduce(info: RankInfo, values: dict) -> dict:
    """Scenario: ``Fabric(strategy=DDPStrategy(gloo), devices=W)`` joins the world (``fabric.launch()``:
    the processes exist already, ``LOCAL_RANK`` is set), then calls ``fabric.all_reduce(x)`` with the
    default op, ``"mean"`` and ``"sum"`` on the same inputs as :func:`strategy_reduce`.

    Record keys: ``reduced``, as :func:`strategy_reduce`.
    """
    import datetime

    strategy = fabric.strategies.DDPStrategy(
        process_group_backend=info.backend, timeout=datetime.timedelta(seconds=info.pg_timeout)
    )
    runner = fabric.Fabric(
        accelerator=info.accelerator, devices=info.devices, num_nodes=info.num_nodes, strategy=strategy
    )
    runner.launch()
    return {"reduced": _reduce_each(runner.all_reduce, values, info.rank)}

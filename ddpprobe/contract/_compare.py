"""Where the ranks' state records break the contract: one function of the records, shared by the audit (after
the run, from the trace's ``state`` events) and the guard (during the run, from the fields the ranks exchange).

A record is ``{"boundary", "hook", "step", "epoch", "fields": {path: value}}`` (ddpprobe/contract/_state.py).
The ranks' records are aligned by boundary and occurrence (the third ``train_batch_end`` of rank 0 with the third
of rank 1), so ranks that ran different numbers of batches are compared where both have a record.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from ddpprobe.contract._table import ContractRow, row_for


@dataclasses.dataclass(frozen=True)
class Break:
    """A field the contract says must be equal on every rank, first seen differing at one boundary.

    Attributes:
        field: the field's path (``"optimizer[0].group[0].lr"``).
        row: its :class:`~ddpprobe.contract.ContractRow`.
        boundary: the boundary of the first record where it differed (``"start"``, ``"train_batch_end"`` ...).
        hook: the Lightning hook that record was taken after (``"on_fit_start"``).
        step, epoch: ``trainer.global_step`` and ``trainer.current_epoch`` at that record (rank 0's).
        position: the record's index in rank 0's sequence (earlier breaks have smaller positions).
        per_rank: the field's value on each rank there (:data:`MISSING` where a rank has no such field).
        root: the field of the first break when this one came later (it may be its consequence), else None.
    """

    field: str
    row: ContractRow
    boundary: str
    hook: Optional[str]
    step: Optional[int]
    epoch: Optional[int]
    position: int
    per_rank: list
    root: Optional[str] = None

    def to_dict(self) -> dict:
        return {
            "field": self.field,
            "row": self.row.name,
            "rule": self.row.rule,
            "keeps_it": self.row.keeps_it,
            "facts": list(self.row.facts),
            "boundary": self.boundary,
            "hook": self.hook,
            "step": self.step,
            "epoch": self.epoch,
            "per_rank": self.per_rank,
            "root": self.root,
            "position": self.position,
        }


def aligned(records: list) -> list:
    """``[(position, [record of rank 0, record of rank 1, ...])]``: the records every rank has, matched by
    boundary and occurrence, in rank 0's order."""
    keyed = []
    for rank_records in records:
        seen: dict = {}
        table = {}
        for record in rank_records:
            n = seen.get(record["boundary"], 0)
            seen[record["boundary"]] = n + 1
            table[(record["boundary"], n)] = record
        keyed.append(table)
    out = []
    seen = {}
    for position, record in enumerate(records[0] if records else []):
        n = seen.get(record["boundary"], 0)
        seen[record["boundary"]] = n + 1
        key = (record["boundary"], n)
        if all(key in table for table in keyed[1:]):
            out.append((position, [table[key] for table in keyed]))
    return out


#: What :func:`breaks` puts in ``per_rank`` for a rank that has no such field in its record.
MISSING = "(no such field)"


def _comparable(value, missing_is_a_value: bool) -> bool:
    if value == MISSING:
        return missing_is_a_value
    return not (isinstance(value, dict) and "unreadable" in value)


def differs(values: list, missing_is_a_value: bool = False) -> bool:
    """The values are not all equal. A value a rank could not read is no difference; nor, unless
    ``missing_is_a_value`` (an attribute some ranks set and others never did), is a rank without the field
    (:data:`MISSING`). A value of None is a value: an attribute still None on one rank and set on another differs."""
    present = [v for v in values if _comparable(v, missing_is_a_value)]
    return any(v != present[0] for v in present[1:])


def _container(value) -> bool:
    """A recorded list, tuple, dict or set (``object_value``'s ``{"type", "len", "digest"}``)."""
    return (
        isinstance(value, dict)
        and "len" in value
        and value.get("type") in ("list", "tuple", "dict", "set", "frozenset")
    )


#: Fields that a rank may lack where another has them only because its code set them there: attributes.
_SET_BY_CODE = ("module.attr.", "datamodule.attr.")
#: What a dataset's record keeps once its loop ran batches: its ``__getitem__`` may have changed the dataset's own
#: state since (a cache of the items it read, a count of its calls), and each rank read its own shard.
_DATASET_KEPT = ("type", "len")


def named_by_rank(values: list) -> bool:
    """Whether the values (one per rank, rank 0 first) are strings that differ only by each rank's own number in
    them, as a whole number (``"preds_rank0.csv"``, ``"preds_rank1.csv"``): a name made per rank (a file each rank
    writes), not state that must be equal; or are the ranks' own numbers themselves (``0, 1, ...``: the rank kept in
    an attribute). What such a value feeds that must be equal (a learning rate, a parameter) breaks on its own."""
    if len(values) >= 2 and all(type(v) is int for v in values):
        return values == list(range(len(values)))  # the rank's own number kept (self.my_rank = self.global_rank)
    if len(values) < 2 or not all(isinstance(v, str) for v in values):
        return False
    parts = [re.split(r"(\d+)", v) for v in values]  # text, number, text, number ... text
    if len({len(p) for p in parts}) > 1:
        return False
    by_rank = False
    for i, column in enumerate(zip(*parts)):
        if len(set(column)) == 1:
            continue
        if i % 2 == 0 or any(int(number) != rank for rank, number in enumerate(column)):
            return False  # other text, or a number that is not each rank's own
        by_rank = True
    return by_rank


def _loop_of(path: str) -> Optional[str]:
    """``"train"`` of ``"loader.train[0].dataset"``; None for any other field."""
    if not (path.startswith("loader.") and path.endswith(".dataset")):
        return None
    return path[len("loader.") :].split("[", 1)[0]


def _read_by_its_loop(path: str, per_rank: list) -> bool:
    """Whether the dataset of ``path`` was read by its loop before these records (``loops_ran`` of any rank; a
    record without it, by ``batches_ran``)."""
    loop = _loop_of(path)
    return loop is not None and any(
        loop in r.get("loops_ran", ("train", "val", "test", "predict") if r.get("batches_ran") else ())
        for r in per_rank
    )


def _dataset_kept(value):
    return (
        {k: v for k, v in value.items() if k in _DATASET_KEPT}
        if isinstance(value, dict) and "digest" in value
        else value
    )


def _equal_next(positions: list, index: int, path: str) -> bool:
    """The field is equal on every rank at the record after ``index`` (the module's own ``setup`` runs after the
    callbacks' ``setup``, where the ``setup`` record is taken: pytorch_lightning/trainer/call.py
    ``_call_setup_hook``)."""
    if index + 1 >= len(positions):
        return False
    values = [r["fields"].get(path, MISSING) for r in positions[index + 1][1]]
    return not differs(values, missing_is_a_value=True)


def breaks(records: list) -> list:
    """The :class:`Break` of every must-be-equal field that differs between the ranks, at the first boundary where
    it differs, in the order the run met them; a break after the first one names the first as its ``root``.

    A module field that differs at ``setup`` but is equal at the next record is no break: that record is taken in the
    callbacks' ``setup``, before the module's own ``setup``, which may set the field alike on every rank. An attribute
    whose values are strings that differ only by each rank's own number in them
    (:func:`named_by_rank`: a file name per rank) is no break. Once batches ran, a list or dict attribute may hold
    rank-local outputs and is not compared; once a loop ran batches, its dataset (``loader.<loop>[i].dataset``) is
    compared by type and length only, since its ``__getitem__`` may have changed its state with the items of the
    rank's own shard (a record's ``loops_ran``: the loops whose batches ran before it; one without it counts every
    loop as run once ``batches_ran``).

    Args:
        records: per rank, the list of its records in the order taken (one list per rank, rank 0 first).
    """
    found: dict = {}
    positions = list(aligned(records))
    for index, (position, per_rank) in enumerate(positions):
        boundary = per_rank[0]["boundary"]
        ran = any(r.get("batches_ran") for r in per_rank)
        paths = set().union(*(r["fields"] for r in per_rank))
        for path in sorted(paths):
            if path in found:
                continue
            row = row_for(path)
            if row is None or not row.must_be_equal(boundary):
                continue
            values = [r["fields"].get(path, MISSING) for r in per_rank]
            if ran and path.startswith(_SET_BY_CODE) and any(_container(v) for v in values):
                continue  # after batches ran, a list or dict attribute may hold rank-local outputs
            if _read_by_its_loop(path, per_rank):
                values = [_dataset_kept(v) for v in values]  # only its type and length still must be equal
            if path.startswith(_SET_BY_CODE) and named_by_rank(values):
                continue  # a file name (or another name) made per rank: each rank's own by design
            if differs(values, missing_is_a_value=path.startswith(_SET_BY_CODE)):
                if boundary == "setup" and path.startswith("module.") and _equal_next(positions, index, path):
                    continue  # the callbacks' setup runs before the module's own, which set it alike on every rank
                first = per_rank[0]
                found[path] = Break(
                    path, row, boundary, first.get("hook"), first.get("step"), first.get("epoch"), position, values
                )
    ordered = sorted(found.values(), key=lambda b: (b.position, b.field))
    if not ordered:
        return []
    first_position = ordered[0].position
    root = ordered[0].field
    return [b if b.position == first_position else dataclasses.replace(b, root=root) for b in ordered]

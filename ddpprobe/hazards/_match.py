"""What must be equal on every rank at one position of the ranks' collective sequences: the fields of a collective
(as the trace names them, ddpprobe/trace/) that both the audit's sequences (ddpprobe/audit/evidence/_sequences.py)
and the guard's entries (ddpprobe/guard/_entries.py) compare, each with the kind of divergence a difference in it
is. One table, two callers.

- :data:`MISMATCH`: the ranks call different collectives (op, reduce op, dtype, shape, group, source or
  destination rank, the lengths of the call's tensor lists): the backend pairs calls that do not fit, which raises,
  hangs or exchanges garbage.
- :data:`KEYS`: the same collective syncs different logged keys (or one key logged in different hooks): each
  rank's value is reduced with another key's.
- :data:`PURPOSE`: the same collective made for different purposes (a ``self.log`` sync, a Metric's state sync,
  the user's own call, a gradient bucket; a step and an epoch sync of one key): unrelated values are reduced
  together.
- :data:`ORDER`: the user's own collectives of the same kind from different lines of their code: each rank's value
  is reduced with the value another line meant.

Pure Python, importing nothing.
"""

from __future__ import annotations

MISMATCH = "mismatch"
KEYS = "keys"
PURPOSE = "purpose"
ORDER = "order"

#: ``(field, kind)`` in the order a difference is reported.
MUST_MATCH = (
    ("op", MISMATCH),
    ("reduce_op", MISMATCH),
    ("dtype", MISMATCH),
    ("shape", MISMATCH),
    ("group_size", MISMATCH),
    ("root", MISMATCH),
    ("lists", MISMATCH),
    ("key", KEYS),
    ("log_hook", KEYS),
    ("source", PURPOSE),
    ("sync", PURPOSE),
    ("metric", PURPOSE),
    ("bucket", PURPOSE),
    ("site", ORDER),
)
#: The compared fields, in order.
FIELDS = tuple(name for name, _ in MUST_MATCH)
#: Collectives whose ranks may contribute tensors of different shapes (uneven splits): shape not compared.
UNEVEN_SPLITS = ("all_to_all", "all_to_all_single")


def compared(fields: dict) -> dict:
    """``{field: value}`` of :data:`FIELDS` for a collective's trace fields: ``log_hook`` is the hook of a ``self.log``
    sync (else None), ``site`` the call site of the user's own collective (else None: Lightning's and torchmetrics'
    collectives are named by their key or metric), ``shape`` None for :data:`UNEVEN_SPLITS`; a field the fields do
    not hold is None."""
    out = {name: fields.get(name) for name in FIELDS}
    out["log_hook"] = fields.get("hook") if fields.get("source") == "self.log" else None
    out["site"] = fields.get("call_site") if fields.get("source") == "user" else None
    if fields.get("op") in UNEVEN_SPLITS:
        out["shape"] = None
    if isinstance(out["shape"], tuple):
        out["shape"] = list(out["shape"])
    return out


def differing(values: list, kind: str = "") -> dict:
    """``{field: [value per side]}`` of the fields whose values differ between ``values`` (each side's
    :func:`compared`), only those of ``kind`` where given, in :data:`MUST_MATCH` order."""
    out = {}
    for name, of in MUST_MATCH:
        if kind and of != kind:
            continue
        column = [v.get(name) for v in values]
        if len({repr(v) for v in column}) > 1:
            out[name] = column
    return out


def differing_kinds(values: list) -> set:
    """The kinds (:data:`MISMATCH`, :data:`KEYS` ...) of the fields whose values differ between ``values``."""
    kind_of = dict(MUST_MATCH)
    return {kind_of[name] for name in differing(values)}

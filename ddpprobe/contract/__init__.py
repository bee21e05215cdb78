"""The DDP contract: what must be equal on every rank, and what must equal one process.

Data-parallel training holds for every module whatever its kind only while some state is equal on every rank
(the parameters after each step, the optimizer's settings, the dataset each rank shards, the loop's counters)
and while W ranks of batch b compute what one process computes on the W*b samples. A module breaks it in
endlessly many ways; each shows up as a recorded field that differs where the contract says it must not.

- :func:`snapshot` (``_state.py``): a rank's state as ``{path: value}``, a fixed schema documented field by
  field; :func:`state_recorder` (``_recorder.py``) takes it at every boundary of a Lightning run.
- :data:`CONTRACT` (``_table.py``): one row per kind of field: must be equal on every rank (at which
  boundaries) or may differ, what DDP and Lightning do with it, and the fact that shows it.
- :func:`breaks` (``_compare.py``): the fields that break the contract, where first, and which came after the
  first (its possible consequences); one function for the audit and the guard.
- :func:`compare_first_step` (``_single.py``): the first optimizer step's gradients of W ranks against one
  process on the same samples and initial weights.

Loading this package imports torch lazily and no Lightning, so the guard and the audit can load it before the
Lightning package is chosen.
"""

from __future__ import annotations

from ddpprobe.contract._compare import MISSING, Break, aligned, breaks, differs, named_by_rank
from ddpprobe.contract._recorder import gradient_fields, state_recorder
from ddpprobe.contract._single import FirstStep, compare_first_step, not_comparable_reason
from ddpprobe.contract._state import (
    BOUNDARIES,
    dataset_value,
    object_value,
    show,
    snapshot,
    tensor_value,
    unreadable_reason,
)
from ddpprobe.contract._table import (
    CONTRACT,
    EQUAL,
    MAY_DIFFER,
    SINGLE_PROCESS_FILES,
    SINGLE_PROCESS_SCHEDULE,
    SINGLE_PROCESS_STEP,
    ContractRow,
    row_for,
)

__all__ = [
    "BOUNDARIES",
    "CONTRACT",
    "EQUAL",
    "MAY_DIFFER",
    "MISSING",
    "SINGLE_PROCESS_FILES",
    "SINGLE_PROCESS_SCHEDULE",
    "SINGLE_PROCESS_STEP",
    "Break",
    "ContractRow",
    "FirstStep",
    "aligned",
    "breaks",
    "compare_first_step",
    "dataset_value",
    "differs",
    "gradient_fields",
    "named_by_rank",
    "not_comparable_reason",
    "object_value",
    "row_for",
    "show",
    "snapshot",
    "state_recorder",
    "tensor_value",
    "unreadable_reason",
]

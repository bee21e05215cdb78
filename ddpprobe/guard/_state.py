"""The guard's state checks: the DDP contract's must-be-equal fields (ddpprobe/contract/), compared at the
boundaries of a run through the guard's store protocol, never through a collective.

At each checked boundary a rank reads its state with :func:`ddpprobe.contract.snapshot` (narrowed to the
guard's field prefixes), keeps the fields whose contract row (:func:`ddpprobe.contract.row_for`) says they
must be equal there, and posts a ``state`` entry whose ``id`` holds a digest of them (:func:`entry`). Equal
digests end the check like any other (ddpprobe/guard/_exchange.py: five store requests per rank); different
ones make every rank post its entry in full, and every rank reads the ranks' records into the contract's one
comparison, :func:`ddpprobe.contract.breaks` (the audit's), and raises the same :class:`StateDiverged`
(:func:`diverged`).

Boundaries (the names of ddpprobe/contract/_state.py ``BOUNDARIES``): ``start`` (``on_fit_start``, and
``on_validation_start`` / ``on_test_start`` / ``on_predict_start`` of their own stages: after DDP's wrap,
before any batch), ``train_batch_end`` after the first optimizer step only, ``train_epoch_end``,
``val_epoch_end`` (not the sanity check's), ``test_epoch_end`` and ``end`` (``on_fit_end`` ...). Not
``setup``: DDP has not broadcast rank 0's weights yet, and the module's own ``setup`` runs after the
callbacks' (pytorch_lightning/trainer/call.py ``_call_setup_hook``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Optional

from ddpprobe.contract import breaks, row_for, show, snapshot
from ddpprobe.guard import _writers
from ddpprobe.guard._errors import StateDiverged
from ddpprobe.hazards import NO_FIX

#: The field prefixes ``CollectiveGuard(state=True)`` reads: every row of the contract table but three, which
#: correct runs break by design and the guard decides another way. The batch counts
#: (``trainer.num_training_batches``, ``trainer.num_val_batches``): shards of different lengths are right where
#: no collective pairs their batches (exact evaluation), and the guard's boundary checks stop them where one
#: does. The datamodule's attributes: Lightning runs ``prepare_data`` on local rank 0 only
#: (pytorch_lightning/trainer/connectors/data_connector.py), and what it records there differs by design.
#: ``loader.`` is dropped where the Trainer does not shard (``use_distributed_sampler=False``): each rank then
#: reads its own dataset on purpose (:func:`prefixes`).
DEFAULT_FIELDS = (
    "trainer.global_step",
    "trainer.current_epoch",
    "trainer.should_stop",
    "trainer.accumulate_grad_batches",
    "optimizer",
    "scheduler",
    "param.",
    "buffer.",
    "module.attr.",
    "callback.",
    "loader.",
)


#: The small must-be-equal fields compared at every training batch's end, after its optimizer step (folded into
#: that boundary's check: no store request and no collective added): the loop's counters and stop flag, every
#: optimizer's hyperparameters and param-group membership, every scheduler's state. Parameters, buffers and
#: datasets, whose digests cost milliseconds, stay at the boundaries of :class:`StateHooks`.
STEP_FIELDS = (
    "trainer.global_step",
    "trainer.current_epoch",
    "trainer.should_stop",
    "trainer.accumulate_grad_batches",
    "optimizer",
    "scheduler",
)


def step_fields(fields: Optional[tuple]) -> tuple:
    """The prefixes of :data:`STEP_FIELDS` that ``fields`` (the guard's ``state`` prefixes) covers, narrowed to
    them: ``("optimizer",)`` gives ``("optimizer",)``, ``("param.",)`` gives ``()``."""
    out = []
    for step in STEP_FIELDS:
        for f in fields or ():
            if step.startswith(f):
                out.append(step)
            elif f.startswith(step):
                out.append(f)
    return tuple(dict.fromkeys(out))


def step_record(trainer, module, fields: tuple) -> Optional[dict]:
    """This rank's record of the :func:`step_fields` at a training batch's end (boundary ``train_batch_end``, the
    contract's record shape), and the digest of its fields as ``record["digest"]`` (16 hex digits); None when
    ``fields`` is empty. Reads only (ddpprobe/contract/_state.py ``snapshot``)."""
    if not fields:
        return None
    record = take(trainer, module, "train_batch_end", "on_train_batch_end", fields, batches_ran=True)
    record["loops_ran"] = ["train"]
    blob = json.dumps(record["fields"], sort_keys=True, default=str).encode()
    record["digest"] = hashlib.blake2b(blob, digest_size=8).hexdigest()
    return record


def fields_option(state) -> Optional[tuple]:
    """The field prefixes of ``CollectiveGuard(state=...)``: ``True`` :data:`DEFAULT_FIELDS`, ``False`` None (no
    state check), a tuple or list of non-empty strings itself. Raises ``ValueError`` for anything else."""
    if state is True:
        return DEFAULT_FIELDS
    if state is False:
        return None
    if isinstance(state, (tuple, list)) and state and all(isinstance(p, str) and p for p in state):
        return tuple(state)
    raise ValueError(
        f"CollectiveGuard(state={state!r}): use True, False or a tuple of field prefixes such as "
        '("optimizer", "param.") (the paths of ddpprobe/contract/_state.py)'
    )


def prefixes(fields: tuple, trainer) -> tuple:
    """``fields`` less ``loader.`` where the Trainer does not shard with DistributedSampler."""
    connector = getattr(trainer, "_accelerator_connector", None)
    if getattr(connector, "use_distributed_sampler", True):
        return fields
    return tuple(f for f in fields if not f.startswith("loader"))


def take(
    trainer, module, boundary: str, hook: str, fields: tuple, batches_ran: bool = False, loops_ran: tuple = ()
) -> dict:
    """This rank's record at ``boundary`` (``{"boundary", "hook", "step", "epoch", "batches_ran", "loops_ran",
    "fields"}``, the contract's record shape) holding only the fields of ``fields`` that must be equal there. Reads
    only: no item of a dataset, no random draw, no collective (ddpprobe/contract/_state.py)."""
    state = snapshot(trainer, module, prefixes(fields, trainer)) if fields else {}
    return {
        "boundary": boundary,
        "hook": hook,
        "step": int(trainer.global_step),
        "epoch": int(trainer.current_epoch),
        "batches_ran": batches_ran,
        "loops_ran": list(loops_ran),
        "fields": must_be_equal(state, boundary),
    }


def must_be_equal(state: dict, boundary: str) -> dict:
    """The fields of ``state`` (``{path: value}``) whose contract row says they must be equal at ``boundary``."""
    out = {}
    for path, value in state.items():
        row = row_for(path)
        if row is not None and row.must_be_equal(boundary):
            out[path] = value
    return out


def entry(n: int, rank: int, record: dict) -> dict:
    """The ``state`` entry of ``record``: its ``id`` holds the boundary, the hook and a digest of the compared
    fields (BLAKE2b of their JSON), so the store protocol compares 16 hex digits per rank; the record itself
    crosses the store only when the digests differ."""
    blob = json.dumps(record["fields"], sort_keys=True, default=str).encode()
    where = f"{record['hook']}, epoch {record['epoch']}, step {record['step']}"
    return {
        "kind": "state",
        "n": n,
        "rank": rank,
        "id": ["state", record["boundary"], record["hook"], hashlib.blake2b(blob, digest_size=8).hexdigest()],
        "fields": {"hook": record["hook"], "batch_idx": None},
        "record": record,
        "text": f"is at the state check of {record['boundary']} ({where})",
    }


def same_check(entries: list) -> bool:
    """Every entry is a state check at the same boundary and hook (so only the state may differ), or every entry
    is the same hook boundary carrying a step record (:func:`step_record`) whose digests alone differ."""
    if all(e["kind"] == "state" for e in entries) and len({tuple(e["id"][1:3]) for e in entries}) == 1:
        return True
    return (
        all(e["kind"] == "boundary" and e.get("record") for e in entries)
        and len({json.dumps(e["id"][:-1]) for e in entries}) == 1
    )


def diverged(head: str, n: int, entries: list) -> Optional[StateDiverged]:
    """The :class:`StateDiverged` of the ranks' state entries at one check (:func:`same_check`), from the
    contract's :func:`~ddpprobe.contract.breaks`; None where no field breaks the contract though the digests
    differ (a field missing or unreadable on some rank is no difference)."""
    ordered = sorted(entries, key=lambda e: e["rank"])
    found = [b.to_dict() for b in breaks([[e["record"]] for e in ordered])]
    if not found:
        return None
    first = found[0]
    where = f"{first['boundary']} ({first['hook']}, epoch {first['epoch']}, step {first['step']})"
    lines = [f"{head}: state that must be equal on every rank differs, first at {where}:"]
    records = [e["record"] for e in ordered]
    for b in found:
        lines.append(f"  {b['field']}: " + ", ".join(f"rank {r} {show(v)}" for r, v in enumerate(b["per_rank"])))
        lines += _writers.lines(b["field"], records)  # the line that last set it, or the hooks since it was equal
    rows = {}
    for b in found:
        rows.setdefault(b["row"], b)
    for b in rows.values():
        lines.append(
            f"The contract ({b['row']}): {b['rule']} at {b['boundary']}; {b['keeps_it']} (shown by "
            f"{'; '.join(b['facts'])})"
        )
    lines += fix_lines(found)
    error = StateDiverged("\n".join(lines), n, {e["rank"]: e["text"] for e in ordered}, found)
    error.written = next(filter(None, (_writers.first_site(b["field"], records) for b in found)), None)
    return error


def fix_lines(found: list) -> list:
    """The registry's fix for the differing fields: the registry (ddpprobe/hazards/) holds no entry whose
    evidence is a state field yet, so, as the audit says for a contract break (ddpprobe/audit/causes/_contract.py),
    no proven fix applies."""
    fields = ", ".join(b["field"] for b in found)
    return [f"{NO_FIX}: no registry entry's evidence holds for {fields}"]


class StateHooks:
    """The state checks' hooks, mixed into ``CollectiveGuard`` (which holds ``_exchange``, ``_check`` and
    ``_state_fields``): ``start`` and ``end`` of every stage here; the first optimizer step's batch end and the
    epochs' ends from the guard's own hooks (``_state_after_batch``, ``_state_check``)."""

    _state_fields: Optional[tuple] = None
    _writers = None
    _stepped = False
    _started_training = False
    _batches_ran = False
    _loops_ran: tuple = ()

    def _state_check(self, trainer, pl_module, boundary: str, hook: str) -> None:
        if self._exchange is None or not self._state_fields:
            return
        ex = self._exchange
        if self._writers is not None:  # the optimizers exist from on_fit_start; load_state_dict replaces groups
            self._writers.watch(trainer)
        record = take(trainer, pl_module, boundary, hook, self._state_fields, self._batches_ran, self._loops_ran)
        self._check(entry(ex.n, ex.rank, record))

    def _state_after_batch(self, trainer, pl_module) -> None:
        """``train_batch_end`` once, at the first batch end after an optimizer step (``global_step`` > 0)."""
        self._ran("train")
        if not self._stepped and trainer.global_step > 0:
            self._stepped = True
            self._state_check(trainer, pl_module, "train_batch_end", "on_train_batch_end")

    def _ran(self, loop: str) -> None:
        """Batches of ``loop`` (``"train"``, ``"val"``, ``"test"``) ran: its dataset may have changed its own state."""
        self._batches_ran = True
        if loop not in self._loops_ran:
            self._loops_ran = self._loops_ran + (loop,)

    def _state_before_batch(self, trainer, pl_module) -> None:
        """``train_start`` once, at the first training batch's start: after the module's own ``on_train_start``."""
        if not self._started_training:
            self._started_training = True
            self._state_check(trainer, pl_module, "train_start", "on_train_batch_start")

    def on_fit_start(self, trainer, pl_module):
        self._stepped = self._started_training = False
        self._state_check(trainer, pl_module, "start", "on_fit_start")

    def on_validation_start(self, trainer, pl_module):
        if trainer.state.fn != "fit":
            self._state_check(trainer, pl_module, "start", "on_validation_start")

    def on_test_start(self, trainer, pl_module):
        self._state_check(trainer, pl_module, "start", "on_test_start")

    def on_predict_start(self, trainer, pl_module):
        self._state_check(trainer, pl_module, "start", "on_predict_start")

    def on_fit_end(self, trainer, pl_module):
        self._state_check(trainer, pl_module, "end", "on_fit_end")

    def on_validation_end(self, trainer, pl_module):
        if trainer.state.fn != "fit":
            self._state_check(trainer, pl_module, "end", "on_validation_end")

    def on_test_end(self, trainer, pl_module):
        self._state_check(trainer, pl_module, "end", "on_test_end")

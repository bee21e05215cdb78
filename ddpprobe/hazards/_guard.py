"""Which registry entry a guard mismatch proves, from the entries the ranks posted at the failing check
(ddpprobe/guard/_entries.py): ``kind`` (``"collective"``, ``"boundary"``, ``"raised"``), ``rank``, ``id`` and
``fields`` (``op``, ``key``, ``metric``, ``source``, ``hook``, ``root``, and where the guard records them
``running``, ``call_site``, ``sync``, ``call``: the public library call of the trace's call chain)."""

from __future__ import annotations

from typing import Optional

__all__ = ["Known", "alone", "alone_cause", "guard_hazard", "known", "read_numbers", "reads_metrics", "recognise"]

#: Public calls (the trace's call chain) that read the logged metrics and so run the epoch sync.
METRICS_PROPERTIES = ("Trainer.callback_metrics", "Trainer.logged_metrics", "Trainer.progress_bar_metrics")


def _ranks(entries: list) -> list:
    return sorted(e["rank"] for e in entries)


def _function_of(call_site: Optional[str]) -> Optional[str]:
    """``"validation_step"`` of ``"module.py:12 in validation_step"``."""
    if not call_site or " in " not in call_site:
        return None
    return call_site.rsplit(" in ", 1)[1]


def reads_metrics(fields: dict) -> bool:
    """A ``self.log`` epoch sync made by reading the logged metrics from the user's code: the call chain names a
    metrics property, or the sync of a key ran from a line of the user's code in another function than the
    one that logged it (a sync Lightning's loop makes has the logging line as its call site)."""
    call = fields.get("call") or ""
    if any(call.startswith(p) for p in METRICS_PROPERTIES):
        return True
    if fields.get("source") != "self.log" or fields.get("sync") == "step":
        return False
    function = _function_of(fields.get("call_site"))
    return bool(function) and function != fields.get("hook") and function == fields.get("running")


class Known(str):
    """Words for a field an entry lacks, saying what is known in its place (``"the logged metrics"`` for a read's
    key): its ``repr`` is the words themselves, so a registry template's ``{key!r}`` reads them unquoted, where a
    field the entry has is quoted."""

    def __repr__(self) -> str:
        return str(self)


def known(value, words: str):
    """``value`` where the entry has it (neither None nor empty), else :class:`Known` ``words``."""
    return value if value not in (None, "") else Known(words)


def read_numbers(fields: dict, ranks: list) -> dict:
    """The numbers of ``metrics_read_on_some_ranks``'s cause for a read of the logged metrics (a trace entry, a
    guard entry's fields, or a lone read of the audit's ``lone_reads``) that ``ranks`` made: a read without a key
    runs the epoch sync of the logged metrics, one without a call site is the module's, and a read a library
    callback's hook made (Lightning ran it: the trace's ``callback`` with a ``loop_step``) is that hook's, as the
    trace's words name it (``TQDMProgressBar.on_train_epoch_end``, the default progress bar)."""
    if fields.get("callback") and fields.get("loop_step"):
        where = f"`{fields['callback']}`"
    else:
        where = f"line {fields['call_site']}" if fields.get("call_site") else "the module"
    return dict(
        where=where,
        call=f"`{fields.get('call') or 'trainer.callback_metrics'}`",
        key=known(fields.get("key"), "the logged metrics"),
        op=known(fields.get("op"), "a collective"),
        ranks=f"rank(s) {ranks}",
    )


def alone_cause(fields: dict, ranks: list) -> tuple:
    """``(name or None, cause, evidence)`` of a collective that only ``ranks`` made (:func:`alone`), its cause
    worded from its fields and call chain. A field the entry lacks is worded by what is known (:func:`known`): a
    ``Metric`` whose class is not recorded is ``torchmetrics.Metric``, a ``self.log`` call without a key
    ``self.log(...)``, a collective without an op ``a collective``, a line without its call site ``a line of
    your code``."""
    from ddpprobe.hazards._entries import HAZARDS

    found = alone(fields, ranks)
    if found is None:
        return None, "", {"ranks": ranks, "source": fields.get("source"), "origin": fields.get("origin")}
    name, evidence = found
    who = f"rank(s) {ranks}"
    hook = fields.get("running") or fields.get("hook")
    where = f" in {hook}" if hook else ""
    key = known(fields.get("key"), "...")
    numbers = {
        "metrics_read_on_some_ranks": lambda: read_numbers(fields, ranks),
        "metric_compute_on_some_ranks": lambda: dict(
            metric=known(fields.get("metric"), "torchmetrics.Metric"), ranks=who, where=where
        ),
        "rank0_only_synced_log": lambda: dict(key=key, ranks=who),
        "key_on_some_ranks": lambda: dict(key=key, ranks=who),
        "collective_on_some_ranks": lambda: dict(
            what=known(fields.get("op"), "a collective"),
            call_site=known(fields.get("call_site"), "a line of your code"),
            ranks=who,
            where=where,
        ),
    }[name]()
    return name, HAZARDS[name].cause(**numbers), evidence


def alone(fields: dict, ranks: list) -> Optional[tuple]:
    """``(name, evidence)`` of a collective ``ranks`` make while the others do not (they are at a hook boundary,
    or in another collective), from its ``fields``; None where no entry explains it (Lightning's own barrier
    or broadcast)."""
    source = fields.get("source")
    evidence = {
        "ranks": ranks,
        "op": fields.get("op"),
        "key": fields.get("key"),
        "metric": fields.get("metric"),
        "call": fields.get("call"),
        "call site": fields.get("call_site"),
        "source": source,
    }
    if "reads_rank" in fields:  # recorded by the guard: what the user's frames of the call read of the rank
        evidence["rank branch"] = bool(fields["reads_rank"])
    evidence["running hook"] = fields.get("running")
    if reads_metrics(fields):
        return "metrics_read_on_some_ranks", evidence
    if source == "torchmetrics":
        return "metric_compute_on_some_ranks", evidence
    if source == "self.log":
        evidence["sync_dist"] = True
        return ("rank0_only_synced_log" if ranks == [0] else "key_on_some_ranks"), evidence
    if source == "user":
        return "collective_on_some_ranks", evidence
    return None


def _lightnings_own(fields: dict) -> bool:
    """A collective Lightning or DDP makes on its own on every rank (a barrier or broadcast of its loops or Trainer,
    DDP's gradient all_reduce of a bucket; no key, metric or user's call): what the other ranks' next collective is
    when some make one of their own."""
    return fields.get("source") in ("library", "gradient")


def recognise(sides: list) -> Optional[tuple]:
    """``(name, evidence)`` of the registry entry that the ranks' collectives at one position prove, or None: the
    one recogniser of a collective mismatch, shared by the guard (the entries of a failing check) and the audit
    (the first divergence of the ranks' traces).

    ``sides``: per rank, in rank order, the trace's fields of the collective it makes there (``op``, ``dtype``,
    ``shape``, ``source``, ``key``, ``hook``, ``metric``, ``state_sizes``, ``call``, ``call_site``, ``running``,
    ``sync``, ``root``, and ``rank``), or None for a rank that makes none there (at a hook boundary, or gone).
    """
    present = [f for f in sides if f is not None]
    if not present:
        return None
    ranks = [f.get("rank", i) for i, f in enumerate(sides) if f is not None]
    if len(present) < len(sides):
        groups: dict = {}
        for f in present:
            groups.setdefault(_purpose(f), []).append(f)
        return alone(present[0], ranks) if len(groups) == 1 else None
    if len({f.get("op") for f in present}) > 1 or len({f.get("source") for f in present}) > 1:
        # One side reading the metrics (or computing a metric, or syncing a key, or its own collective) that the
        # others do not make: their next collective is another purpose's, or Lightning's own.
        for f in present:
            if reads_metrics(f):
                return alone(f, [g.get("rank", i) for i, g in enumerate(sides) if _purpose(g) == _purpose(f)])
        own = [f for f in present if not _lightnings_own(f)]
        if own and len(own) < len(present) and len({_purpose(f) for f in own}) == 1:
            return alone(own[0], [f.get("rank") for f in own])
        return None
    fields = present
    if len({f.get("root") for f in fields}) > 1:
        return None
    if len({(f.get("key"), f.get("hook") if f.get("source") == "self.log" else None) for f in fields}) > 1:
        if not all(f.get("key") for f in fields) or fields[0].get("source") != "self.log":
            return _users_own(sides)
        return "keys_differ", {"keys per rank": [f.get("key") for f in fields], "op": fields[0].get("op")}
    if len({f.get("metric") for f in fields}) > 1:
        return _users_own(sides)
    dtypes = [f.get("dtype") for f in fields]
    shapes = [f.get("shape") for f in fields]
    first = fields[0]
    if len(set(map(str, dtypes))) > 1 and first.get("source") == "torchmetrics" and first.get("op") == "all_gather":
        # A Metric's state sync of one list state with another dtype on some ranks: an empty list state's
        # float32 placeholder, where the posted state sizes show an empty list on exactly the float32 ranks.
        empty = [f.get("rank", i) for i, f in enumerate(fields) if "list of 0" in (f.get("state_sizes") or {}).values()]
        return "list_state_dtypes_differ", {
            "dtypes per rank": [str(d) for d in dtypes],
            "ranks with an empty list state": empty,
            "metric": first.get("metric"),
        }
    if "gather" not in str(first.get("op")) or any(s is None for s in shapes) or len({repr(s) for s in shapes}) < 2:
        # gather_shapes_differ is of an all_gather whose shapes differ: any other difference (a reduce op, a
        # group, a bucket, a dtype alone) is no near miss of it.
        return None
    return "gather_shapes_differ", {
        "op": first.get("op"),
        "same dtype": len(set(map(str, dtypes))) == 1,
        "shapes per rank": shapes,
        "dtype": first.get("dtype"),
    }


def _users_call(fields: dict) -> bool:
    """A collective the user's own line made (the trace's call chain names the library call it made, and no loop of
    Lightning lies between: ``MulticlassAccuracy.compute()`` called in the module's hook), not one Lightning's loop
    made on its own (``loop_step`` set: the epoch sync of a logged key or Metric)."""
    return bool(fields.get("call")) and not fields.get("loop_step") and bool(fields.get("call_site"))


def _users_own(sides: list) -> Optional[tuple]:
    """``(name, evidence)`` where the ranks make the same op for different purposes and those of some ranks are one
    call of the user's own while every other rank's is Lightning's loop (a ``compute()`` on rank 0 only of a Metric
    that is also logged, met by the other ranks' epoch sync of that logged Metric, as in the default sanity check):
    the user's call is the collective the others never make (:func:`alone`). None otherwise."""
    present = [f for f in sides if f is not None]
    own = [f for f in present if _users_call(f)]
    loops = [f for f in present if not _users_call(f)]
    if not own or not loops or len({_purpose(f) for f in own}) != 1 or not all(f.get("loop_step") for f in loops):
        return None
    return alone(own[0], [f.get("rank", sides.index(f)) for f in own])


def _purpose(fields: Optional[dict]) -> Optional[tuple]:
    """What a side's collective is for (its op aside): one purpose on several ranks is one collective."""
    if fields is None:
        return None
    return tuple(fields.get(k) for k in ("source", "key", "sync", "metric", "call", "call_site", "loop_step"))


def guard_hazard(entries: list) -> Optional[tuple]:
    """``(name, evidence)`` of the registry entry the guard's ``entries`` at one check prove, or None: boundaries
    alone are uneven batches; collectives go to :func:`recognise` (a rank at a boundary makes none there)."""
    kinds = {e["kind"] for e in entries}
    if "raised" in kinds:
        return None
    boundaries = [e for e in entries if e["kind"] == "boundary"]
    collectives = [e for e in entries if e["kind"] == "collective"]
    if kinds == {"boundary"}:
        if any(e["fields"].get("batch_idx") is not None for e in boundaries):
            batches = {e["rank"]: e["fields"].get("batch_idx") for e in boundaries}
            return "uneven_batches", {"batch per rank": [batches[r] for r in sorted(batches)]}
        return None
    if boundaries and collectives[0]["fields"].get("source") == "gradient":
        if len({repr(e["id"]) for e in collectives}) != 1:
            return None
        # DDP's gradient all_reduce on some ranks while the others left the epoch: they ran out of batches.
        ended = [e for e in boundaries if str(e["fields"].get("hook")).endswith(("_epoch_end", "teardown"))]
        return ("uneven_batches", {"ranks out of batches": _ranks(ended)}) if ended else None
    return recognise([side(e) for e in sorted(entries, key=lambda e: e["rank"])])


def side(entry: dict) -> Optional[dict]:
    """A guard entry as :func:`recognise` reads a side: its posted fields with its rank and the compared dtype and
    shape (positions 3 and 4 of its ``id``: op, reduce op, dtype, shape ...); None for a boundary."""
    if entry.get("kind") != "collective":
        return None
    at = entry["id"]
    return {
        **entry["fields"],
        "rank": entry["rank"],
        "dtype": at[3] if len(at) > 3 else entry["fields"].get("dtype"),
        "shape": at[4] if len(at) > 4 else entry["fields"].get("shape"),
    }

"""What a rank posts at each check, how the ranks' posts are compared, and the error text when they differ.

An *entry* is one JSON object a rank writes to the store before a check:

``kind``
    ``"collective"`` (about to call a ``torch.distributed`` collective), ``"boundary"`` (at a Lightning
    hook boundary: setup, a batch's start or end, an epoch's end, teardown), ``"state"`` (a state check of
    the DDP contract: ddpprobe/guard/_state.py ``entry``, with its ``record``) or ``"raised"`` (this rank
    raised; posted from ``on_exception`` or on the guard's own timeout).
``n``, ``rank``
    the check's sequence number (per rank, per ``Trainer`` stage) and the rank that posted it.
``id``
    what must be equal on every rank (a list): for a collective the fields of ddpprobe/hazards/_match.py's
    ``MUST_MATCH``, the table the audit compares too: the op, reduce op, dtype, shape, group
    size, source or destination rank of a rooted collective (``root``: ``"src=0"``), source, Lightning key
    (and, for ``self.log`` syncs, the hook it was logged in, and whether it is the key's step or epoch sync),
    torchmetrics class, a gradient bucket's index, every tensor and list
    length of the call's lists (``lists``: ``all_to_all``'s lists without their split sizes, the length of a
    ``broadcast_object_list``'s list) and, for the user's own collectives (``source`` ``user``), the call
    site, so that the same collectives in another order on each rank differ (no shape for
    ``UNEVEN_SPLITS``: all_to_all); for a boundary the hook, epoch, batch and dataloader index and whether the loop has
    a batch after this one. Other call sites are not compared: two lines may log the same key, and a
    Lightning or torchmetrics sync is named by its key or metric.
``text``
    the rank's side in words: ``"is about to "`` + ``describe_collective(..., calls=True)`` (the audit's words
    for a collective, with the library call the user's line made, or Lightning's loop step:
    ``"is about to barrier at m.py:20 in validation_step, run by `DDPStrategy.barrier()`"``),
    ``"is at on_train_batch_start (batch 2, epoch 0)"``, or ``"raised Type: message"``.
"""

from __future__ import annotations

from typing import Optional

from ddpprobe.hazards import guard_cause, guard_fix_lines
from ddpprobe.hazards._match import FIELDS, compared, differing as differing_fields
from ddpprobe.trace import describe_collective

#: Fields of a collective (as the trace names them) that must be equal on every rank, in this order: the table
#: the audit compares too (ddpprobe/hazards/_match.py).
COLLECTIVE_ID = FIELDS
#: Fields of a collective kept in its entry (``entry["fields"]``) for the words of a mismatch.
POSTED_FIELDS = (
    "op",
    "key",
    "metric",
    "source",
    "hook",
    "root",
    "running",
    "call_site",
    "sync",
    "call",
    "loop_step",
    "callback",
    "bucket",
    "comm_hook",
    "state_sizes",
    "reads_rank",
)
#: Longest error text of a peer kept in an entry.
ERROR_CHARS = 500


def collective(n: int, rank: int, fields: dict) -> dict:
    """The entry of a collective described by the trace's ``collective`` fields (``op``, ``dtype`` ...)."""
    values = compared(fields)
    fields = dict(fields, log_hook=values["log_hook"], site=values["site"])
    return {
        "kind": "collective",
        "n": n,
        "rank": rank,
        "id": ["collective"] + [values[k] for k in COLLECTIVE_ID],
        "fields": {k: fields.get(k) for k in POSTED_FIELDS},
        "text": "is about to " + _words(fields),
    }


def _words(fields: dict) -> str:
    """A collective's words in a side's text: ``describe_collective`` and its source or destination rank."""
    return describe_collective(fields, calls=True) + (f" [{fields['root']}]" if fields.get("root") else "")


#: How a compared field is named where a side's words would not show it: ``"reduce op MAX"``.
_FIELD_WORDS = {
    "op": "op {}",
    "reduce_op": "reduce op {}",
    "dtype": "dtype {}",
    "shape": "shape {}",
    "group_size": "a group of {} ranks",
    "root": "{}",
    "source": "source {}",
    "key": "key {!r}",
    "log_hook": "logged in {}",
    "metric": "metric {}",
    "bucket": "bucket {}",
    "lists": "lists {}",
    "sync": "a {} sync",
    "site": "call site {}",
}


def _compared(entry: dict) -> dict:
    """A collective entry's posted fields with the compared values of its ``id`` (``COLLECTIVE_ID``)."""
    return dict(entry["fields"], **{name: entry["id"][_AT[name]] for name in COLLECTIVE_ID})


def differing(entries: list) -> dict:
    """``{field: [value per rank, by rank]}`` of the ``COLLECTIVE_ID`` fields whose compared values differ
    between the collective ``entries`` (``{}`` where fewer than two are collectives)."""
    collectives = sorted((e for e in entries if e.get("kind") == "collective"), key=lambda e: e["rank"])
    if len(collectives) < 2:
        return {}
    return differing_fields([dict(zip(COLLECTIVE_ID, e["id"][1:])) for e in collectives])


def _shown_as(name: str, value) -> dict:
    """The posted field a compared field is worded from (the hook a key was logged in, the user's call site)."""
    return {"log_hook": {"hook": value}, "site": {"call_site": value}}.get(name, {})


def side_texts(entries: list) -> list:
    """Each entry's text, in order: a collective's completed with every compared field that differs from
    another rank's collective and that its words do not show (a field is shown where the words change with
    its value), so that sides that differ never read alike: ``"is about to all_reduce float32 [2] at m.py:20
    in validation_step, with reduce op MAX"``."""
    collectives = [e for e in entries if e.get("kind") == "collective"]
    texts = []
    for entry in entries:
        text = entry.get("text", "")
        if entry.get("kind") == "collective" and len(collectives) > 1:
            mine = _compared(entry)
            unshown = []
            for name in COLLECTIVE_ID:
                others = [o["id"][_AT[name]] for o in collectives if repr(o["id"][_AT[name]]) != repr(mine[name])]
                swapped = [dict(mine, **{name: v}, **_shown_as(name, v)) for v in others]
                if others and any(_words(s) == _words(mine) for s in swapped):
                    value = mine[name]
                    unshown.append(
                        f"no {name.replace('_', ' ')}" if value in (None, "") else _FIELD_WORDS[name].format(value)
                    )
            if unshown:
                text += ", with " + " and ".join(unshown)
        texts.append(text)
    return texts


def boundary(
    n: int,
    rank: int,
    hook: str,
    epoch: int,
    batch_idx: Optional[int] = None,
    dataloader_idx: int = 0,
    last: Optional[bool] = None,
    state: Optional[dict] = None,
) -> dict:
    """The entry of a hook boundary: ``hook`` (``"setup"``, ``"on_train_batch_start"`` ...) in ``epoch``;
    ``last``: whether the loop's data fetcher has no batch after this one (None where unknown); ``state``: a step
    record of the small must-be-equal fields (ddpprobe/guard/_state.py ``step_record``), whose digest then ends the
    ``id`` and which the entry carries as ``record`` (it crosses the store only when the ids differ)."""
    where = [f"epoch {epoch}"]
    if batch_idx is not None:
        where.insert(0, f"batch {batch_idx}" + (f" of dataloader {dataloader_idx}" if dataloader_idx else ""))
    if last:
        where.append("this rank's last batch")
    entry = {
        "kind": "boundary",
        "n": n,
        "rank": rank,
        "id": ["boundary", hook, epoch, batch_idx, dataloader_idx, last],
        "fields": {"hook": hook, "batch_idx": batch_idx},
        "text": f"is at {hook} ({', '.join(where)})",
    }
    if state is not None:
        entry["id"].append(state.pop("digest"))
        entry["record"] = state
    return entry


def raised(n: int, rank: int, error: str, hook: Optional[str]) -> dict:
    """The entry a rank posts when it raised ``error`` (``"Type: message"``) in ``hook``."""
    error = error if len(error) <= ERROR_CHARS else error[: ERROR_CHARS - 3] + "..."
    return {
        "kind": "raised",
        "n": n,
        "rank": rank,
        "id": ["raised"],
        "error": error,
        "text": f"raised {error}" + (f" (in {hook})" if hook else ""),
    }


def ranks_text(ranks: list) -> str:
    """``"rank 3"``, ``"ranks 0, 2"``, ``"ranks 0-5"`` (runs of three or more as ranges)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, start = [], 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            run = ranks[start:i]
            parts.append(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run)))
            start = i
    return "ranks " + ", ".join(parts)


def sides_text(entries: list) -> str:
    """One line per distinct side, ranks with the same text grouped: ``"  rank 0 is about to ..."``."""
    groups: dict = {}
    for entry, text in zip(entries, side_texts(entries)):
        groups.setdefault(text, []).append(entry["rank"])
    return "\n".join(
        f"  {ranks_text(ranks)} {_plural(text) if len(ranks) > 1 else text}" for text, ranks in groups.items()
    )


def _plural(text: str) -> str:
    return "are " + text[3:] if text.startswith("is ") else text


def consequence(entries: list, pg_timeout_s: float) -> str:
    """What would happen if the ranks went on, for entries whose ``id`` differ, then the fix lines of the
    hazard registry (``ddpprobe.hazards.guard_fix_lines``: the proven fix with its fact test where its
    preconditions hold, else a line saying that no proven fix applies)."""
    text = _consequence(entries, f"the process-group timeout ({pg_timeout_s:g} s)")
    cause = guard_cause(entries)
    return "\n".join([text, *([cause] if cause else []), *guard_fix_lines(entries, differing(entries))])


def _consequence(entries: list, waiting: str) -> str:
    """The sentence of what would happen, from what differs between the entries: the kinds of check, then
    the op, the source or destination rank, the dtype or shape, the reduce op or group, and last what each
    side's collective carries (:func:`_carries`)."""
    # A state check (ddpprobe/guard/_state.py) is, like a hook boundary, a point where a rank makes no collective.
    kinds = {"boundary" if e["kind"] == "state" else e["kind"] for e in entries}
    if kinds == {"boundary"} and any(e["kind"] == "state" for e in entries):
        return f"The ranks are at different points of the run: their next collectives would not pair ({waiting})."
    # Only boundaries, some at a batch: the ranks are at different batches (or one has no next batch). A
    # collective on some ranks while the others are at a batch boundary is a collective they skipped, not
    # uneven batches (every rank reached that batch: its start boundary came first).
    if kinds == {"boundary"} and any(e["fields"].get("batch_idx") is not None for e in entries):
        return (
            "The ranks ran different numbers of batches: the next collective of the ranks with more batches "
            "(DistributedDataParallel's gradient all_reduce in fit, a step-level sync_dist, a Lightning broadcast) "
            f"has no partner, or pairs with another step's, and fails or blocks until {waiting}."
        )
    if kinds == {"boundary"}:
        return f"The ranks are at different points of the run: their next collectives would not pair ({waiting})."
    if "boundary" in kinds:
        alone = [e for e in entries if e["kind"] == "collective"]
        made = list(dict.fromkeys(_made(e["fields"]) for e in alone))
        return (
            f"{ranks_text([e['rank'] for e in alone])} would wait in a collective the other ranks do not call "
            f"({_and(made)}): it fails when a peer leaves (gloo), on NCCL blocks until {waiting}, or pairs with "
            "an unrelated collective."
        )
    fields = [e["fields"] for e in entries]
    if len({f["op"] for f in fields}) > 1:
        return (
            "The ranks would enter different collectives: the backend pairs them anyway (exchanging wrong data), "
            f"aborts, or blocks until {waiting}."
        )
    if len({f.get("root") for f in fields}) > 1:
        return (
            "The ranks name different source or destination ranks (src=/dst=) for the same collective: each "
            "waits for data from, or sends to, a different rank, so the collective exchanges wrong data or "
            f"blocks until {waiting}."
        )
    sides = _sides_of(entries)
    if any(len({repr(e["id"][_AT[name]]) for e in entries}) > 1 for name in ("dtype", "shape", "lists")):
        return (
            "The ranks would contribute tensors of different dtypes or shapes (or lists of different lengths)"
            + (f" ({sides})" if sides else "")
            + f": the backend aborts, cuts the data or blocks until {waiting}."
        )
    if any(len({repr(e["id"][_AT[name]]) for e in entries}) > 1 for name in ("reduce_op", "group_size")):
        return (
            "The ranks would make the same collective with different reduce ops or groups: each rank's result "
            f"is computed another way, or the collective blocks until {waiting}."
        )
    return _mix(entries, sides)


#: The position of each field of ``COLLECTIVE_ID`` in an entry's ``id`` (after its kind).
_AT = {name: 1 + i for i, name in enumerate(COLLECTIVE_ID)}
#: What a barrier made for a sync of this source comes before (its data collective), and that one's verb:
#: Lightning's ``_sync_ddp`` (lightning_fabric/utilities/distributed.py) runs a barrier then the all_reduce,
#: torchmetrics' ``gather_all_tensors`` (torchmetrics/utilities/distributed.py) a barrier then all_gathers.
_AFTER_BARRIER = {"self.log": "reduced", "torchmetrics": "gathered"}
_VERBS = {"all_reduce": "reduced", "reduce": "reduced", "reduce_scatter": "reduced", "broadcast": "broadcast"}


def _carries(fields: dict) -> str:
    """What one side's collective carries (or, at a barrier, what it is for), from its recorded fields: ``the
    value logged as 'loss' in training_step``, ``MeanMetric's states``, ``the gradients of bucket 0``, ``the
    data given to `DDPStrategy.reduce()```, ``what reading `Trainer.callback_metrics` syncs``, ``the
    module's own data``."""
    source = fields.get("source")
    if source == "self.log":
        hook = f" in {fields['hook']}" if fields.get("hook") else ""
        return f"the value logged as {fields['key']!r}{hook}" if fields.get("key") else f"a logged value{hook}"
    if source == "torchmetrics":
        return f"{fields['metric']}'s states" if fields.get("metric") else "a Metric's states"
    if source == "gradient":
        bucket = fields.get("bucket")
        return f"the gradients of bucket {bucket}" if isinstance(bucket, int) else "a bucket of gradients"
    call, barrier = fields.get("call"), fields.get("op") == "barrier"
    if call and fields.get("call_kind") == "property":
        return f"what reading `{call}` syncs"
    if call:
        return f"`{call}()`" if barrier else f"the data given to `{call}()`"
    if fields.get("loop_step"):
        return f"Lightning's `{fields['loop_step']}`"
    owner = "the module's own" if source == "user" else "Lightning's or torch's own"
    return f"{owner} {'barrier' if barrier else 'data'}"


def _made(fields: dict) -> str:
    """The collective a side makes, as the object of "wait in": ``an all_reduce of the gradients of bucket 0``,
    ``a barrier for the value logged as 'v' in validation_step``, ``a barrier of `DDPStrategy.barrier()```."""
    op = fields.get("op") or "collective"
    article = "an" if op[:1] in "aeiou" else "a"
    preposition = "for" if op == "barrier" and fields.get("source") in ("self.log", "torchmetrics") else "of"
    return f"{article} {op} {preposition} {_carries(fields)}"


def _kind_of(fields: dict) -> str:
    """The kind of thing a side's collective carries: a logged value, a metric's states, a gradient bucket,
    or another tensor."""
    return {"self.log": "key", "torchmetrics": "metric", "gradient": "bucket"}.get(fields.get("source"), "tensor")


def _sides_of(entries: list) -> str:
    """``"the value logged as 'a' on rank 0 with MeanMetric's states on rank 1"`` where the sides carry
    different things (:func:`_carries`), else ``""``."""
    groups: dict = {}
    for entry in entries:
        groups.setdefault(_carries(entry["fields"]), []).append(entry["rank"])
    if len(groups) < 2:
        return ""
    return " with ".join(f"{what} on {ranks_text(ranks)}" for what, ranks in groups.items())


def _mix(entries: list, sides: str) -> str:
    """The same collective, equal in op, dtype and shape, carrying different things on the ranks: they
    would be combined with each other. Nothing raises when the collective carries data (its dtypes and
    shapes agree); at a barrier the collective after it is the source's own (:data:`_AFTER_BARRIER`)."""
    fields = [e["fields"] for e in entries]
    op = fields[0]["op"]
    kinds = {_kind_of(f) for f in fields}
    sources = {f.get("source") for f in fields}
    if op == "barrier":
        verb = _AFTER_BARRIER.get(next(iter(sources))) if len(sources) == 1 else None
        after = " after this barrier"
        raises = ""
    else:
        verb = _VERBS.get(op, "gathered" if "gather" in op else "exchanged")
        after = ""
        raises = ", and nothing would raise"
    sites = {e["id"][_AT["site"]] for e in entries}
    if not sides and len(sites) > 1 and None not in sites:  # the user's own calls, from different lines
        return (
            f"The ranks would make the same {op} from different lines of their code "
            f"({', '.join(sorted(map(str, sites)))}): each rank's data would be combined with another line's, and "
            "nothing would raise."
        )
    if not sides:  # the ids differ in a field no side's words name
        return f"The ranks would make the same {op} for different purposes: its result mixes them{raises}."
    if kinds == {"key"} and verb:
        keys = {f.get("key") for f in fields}
        what = "The values of different keys" if len(keys) > 1 else "Values of one key logged in different hooks"
        return f"{what} would be {verb} together{after}: every key would hold a mix of the ranks' values{raises}."
    if kinds == {"metric"} and verb:
        return (
            f"The states of different metrics would be {verb} together{after} ({sides}): each metric would "
            f"compute from a mix of the ranks' states{raises}."
        )
    if kinds == {"bucket"}:
        return (
            f"Different gradient buckets would be {verb or 'reduced'} together ({sides}): each bucket's "
            f"parameters would get another bucket's gradients{raises}."
        )
    if op == "barrier":
        return (
            f"The ranks would pass this barrier for different purposes ({sides}): each then makes the next "
            f"collective of its own purpose, and those pair with each other, mixing unrelated values."
        )
    return f"The ranks would {op} unrelated values together ({sides}): each side's result would mix them{raises}."


def _and(items: list) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

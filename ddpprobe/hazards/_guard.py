"""Which registry entry a guard mismatch proves, from the entries the ranks posted at the failing check
(ddpprobe/guard/_entries.py): ``kind`` (``"collective"``, ``"boundary"``, ``"raised"``), ``rank``, ``id`` and
``fields`` (``op``, ``key``, ``metric``, ``source``, ``hook``, ``root``, and where the guard records them
``running``, ``call_site``, ``sync``, ``call``: the public library call of the trace's call chain)."""

from __future__ import annotations

from typing import Optional

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


def guard_hazard(entries: list) -> Optional[tuple]:
    """``(name, evidence)`` of the registry entry the guard's ``entries`` at one check prove, or None."""
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
    if boundaries:
        groups: dict = {}
        for e in collectives:
            groups.setdefault(repr(e["id"]), []).append(e)
        if len(groups) != 1:
            return None
        if collectives[0]["fields"].get("source") == "gradient":
            # DDP's gradient all_reduce on some ranks while the others left the epoch: they ran out of batches.
            ended = [e for e in boundaries if str(e["fields"].get("hook")).endswith(("_epoch_end", "teardown"))]
            return ("uneven_batches", {"ranks out of batches": _ranks(ended)}) if ended else None
        return alone(collectives[0]["fields"], _ranks(collectives))
    fields = [e["fields"] for e in collectives]
    if len({f.get("op") for f in fields}) > 1 or len({f.get("source") for f in fields}) > 1:
        # One side reading the metrics (or computing a metric, or syncing a key) that the other does not make.
        for e in collectives:
            same = [o for o in collectives if o["id"] == e["id"]]
            if reads_metrics(e["fields"]):
                return alone(e["fields"], _ranks(same))
        return None
    if len({f.get("root") for f in fields}) > 1:
        return None
    if len({(f.get("key"), f.get("hook") if f.get("source") == "self.log" else None) for f in fields}) > 1:
        keys = [f.get("key") for f in fields]
        return "keys_differ", {"keys per rank": keys, "op": fields[0].get("op")}
    if len({f.get("metric") for f in fields}) > 1:
        return None
    dtypes = {repr(e["id"][3]) for e in collectives}  # COLLECTIVE_ID: op, reduce_op, dtype, shape, ...
    shapes = [e["id"][4] for e in collectives]
    if len(dtypes) > 1 and fields[0].get("source") == "torchmetrics" and fields[0].get("op") == "all_gather":
        # A Metric's state sync of one list state with another dtype on some ranks: an empty list state's
        # float32 placeholder, where the posted state sizes show an empty list on exactly the float32 ranks.
        ordered = sorted(collectives, key=lambda e: e["rank"])
        empty = [e["rank"] for e in ordered if "list of 0" in ((e["fields"].get("state_sizes") or {}).values())]
        return "list_state_dtypes_differ", {
            "dtypes per rank": [str(e["id"][3]) for e in ordered],
            "ranks with an empty list state": empty,
            "metric": fields[0].get("metric"),
        }
    if "gather" not in str(fields[0].get("op")) or len({repr(s) for s in shapes}) < 2:
        # gather_shapes_differ is of an all_gather whose shapes differ: any other difference (a reduce op, a
        # group, a bucket, a dtype alone) is no near miss of it.
        return None
    return "gather_shapes_differ", {
        "op": fields[0].get("op"),
        "same dtype": len(dtypes) == 1,
        "shapes per rank": shapes,
    }

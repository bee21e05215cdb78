"""Verdict causes of keys the ranks do not hold alike (rank-divergent values, keys logged on some ranks only,
keys stored under no name) and of keys the ranks agree on without a sync of their own. Pure Python."""

from __future__ import annotations

from ddpprobe import hazards
from ddpprobe.audit.causes._kinds import NOT_STORED, RANK_DIVERGENT, RANK_DIVERGENT_MEANING, SOME_RANKS_ONLY
from ddpprobe.audit.evidence._keys import _Inputs, _Key


def _some_ranks_only(ins: _Inputs, key: _Key) -> tuple:
    others = [r for r in range(len(ins.world)) if r not in key.logged_on]
    cause = f"self.log({key.name!r}) ran on rank(s) {key.logged_on} only, never on rank(s) {others}"
    if ins.ended is not None and all(ins.ended[r] != "end" for r in others):
        missing = _monitor_errors(ins, key, others)
        if missing:
            evidence = {"ranks": key.logged_on, "key": key.name, "monitored": True, "raised": missing}
            cause = hazards.cause(
                "unsynced_key_on_some_ranks", key=key.name, ranks=f"rank(s) {key.logged_on}", others=f"rank(s) {others}"
            ) + (
                f"; rank(s) {others} raised {', '.join(sorted(set(missing.values())))}, naming the monitored key they "
                "never logged"
            )
            return SOME_RANKS_ONLY, cause, ["unsynced_key_on_some_ranks"], evidence
        cause += (
            f"; rank(s) {others} stopped before they reached it (their stage raised or never finished: see "
            "the collective trace)"
        )
        return SOME_RANKS_ONLY, cause, [], {}
    mine = {c["name"] for r in key.logged_on for c in ins.world[r]["log_calls"]}
    partners = sorted(
        {
            c["name"]
            for r in others
            for c in ins.world[r]["log_calls"]
            if c["sync_dist"] and c["hook"] in key.hooks and c["name"] not in mine
        }
    )
    ranks = f"rank(s) {key.logged_on}"
    evidence = {"ranks": key.logged_on, "key": key.name, "sync_dist": key.sync_dist and not key.metric_object}
    if key.sync_dist and not key.metric_object and partners:
        cause += (
            f"; rank(s) {others} log {partners} from the same hook with sync_dist=True instead, so their "
            "all_reduces pair with this key's: its value is averaged with another key's"
        )
        return SOME_RANKS_ONLY, cause, ["keys_differ"], {**evidence, "keys per rank": partners}
    if key.sync_dist and not key.metric_object:
        name = "rank0_only_synced_log" if key.logged_on == [0] else "key_on_some_ranks"
        return SOME_RANKS_ONLY, hazards.cause(name, key=key.name, ranks=ranks), [name], evidence
    if key.metric_object:
        cause += "; the Metric's compute() syncs its state with ranks that never join it"
        evidence["metric"] = "the logged Metric"
        return SOME_RANKS_ONLY, cause, ["metric_compute_on_some_ranks"], evidence
    monitors = {cb.get("monitor") for rec in ins.world for cb in rec.get("callbacks") or []}
    evidence["monitored"] = key.name in monitors
    cause = hazards.cause("unsynced_key_on_some_ranks", key=key.name, ranks=ranks, others=f"rank(s) {others}")
    return SOME_RANKS_ONLY, cause, ["unsynced_key_on_some_ranks"], evidence


def _monitor_errors(ins: _Inputs, key: _Key, others: list) -> dict:
    """``{rank: "Callback's error"}`` where every rank of ``others`` raised a callback's error naming the key,
    which a callback of that class monitors (``ModelCheckpoint`` or ``EarlyStopping`` looking for a key the rank
    never logged: tests/facts/test_collective_hazards_callbacks.py); empty otherwise."""
    if key.sync_dist or key.metric_object:
        return {}
    found = {}
    for r in others:
        raised = ins.world[r].get("raised") or {}
        message = str(raised.get("message") or "")
        callbacks = ins.world[r].get("callbacks") or []
        monitors = {cb.get("callback") for cb in callbacks if cb.get("monitor") == key.name}
        named = [c for c in monitors if c and c in message]
        if not named or not any(q in message for q in (f"'{key.name}'", f"`{key.name}`")):
            return {}
        found[r] = f"{raised.get('type')} ({named[0]})"
    return found


def _not_stored(ins: _Inputs, key: _Key, reference: dict) -> tuple:
    # Never "equal": two missing values compare nothing. With several dataloaders Lightning stores the key
    # as f"{name}/dataloader_idx_{i}" (pytorch_lightning/trainer/connectors/logger_connector/result.py
    # ``_ResultCollection.log``, ``add_dataloader_idx``).
    stored = sorted(
        {k for rec in [reference, *ins.world] if rec for k in rec["callback_metrics"] if k.startswith(f"{key.name}/")}
    )
    cause = f"callback_metrics has no {key.name!r} after the stage" + (
        f"; it has {stored}: the stage ran several dataloaders, audit one at a time" if stored else ""
    )
    return NOT_STORED, cause, [], {}


def _rank_divergent(ins: _Inputs, key: _Key) -> tuple:
    """Each rank keeps its own value: what a sync of the ranks' values gives, and whether that is the
    single-process value on the same weights."""
    cause, fixes, evidence = RANK_DIVERGENT_MEANING, [], {}
    known = [v for v in key.per_rank if v is not None]
    if len(known) != len(key.per_rank):
        return RANK_DIVERGENT, cause, fixes, evidence
    unweighted = sum(known) / len(known)
    evidence = {"per-rank values": known, "mean of the ranks' values": unweighted, "metric_object": key.metric_object}
    if key.single is None:
        if not key.compared:
            cause += (
                f"; a sync of the ranks' values (sync_dist=True, reduce_fx='mean') gives {unweighted:.6g} on every "
                "rank; no single-process run had these weights, so whether that is the whole set's value is "
                "not compared"
            )
        return _with_epoch_end_local(ins, key, (RANK_DIVERGENT, cause, fixes, evidence))
    evidence["single-process"] = key.single
    unsynced = _unsynced_metrics(ins, key)
    if unsynced:
        evidence.update({"metrics with sync_on_compute=False": unsynced, "torchmetrics collectives": 0})
        cause = hazards.cause("metric_sync_on_compute_false", key=key.name, metrics=", ".join(unsynced))
        return RANK_DIVERGENT, cause, ["metric_sync_on_compute_false"], evidence
    samples = key.counts.samples if key.counts is not None else None
    weighted = (
        sum(v * n for v, n in zip(known, samples)) / sum(samples)
        if samples and sum(samples) and len(samples) == len(known)
        else None
    )
    if ins.close(unweighted, key.single):
        return RANK_DIVERGENT, hazards.cause("rank_local_mean"), ["rank_local_mean"], evidence
    if weighted is not None and ins.close(weighted, key.single):
        evidence["samples per rank"] = samples
        return RANK_DIVERGENT, hazards.cause("rank_local_weighted", samples=samples), ["rank_local_weighted"], evidence
    return _with_epoch_end_local(ins, key, _rank_divergent_unexplained(key, cause, unweighted, weighted, evidence))


def _own_hook(ins: _Inputs, key: _Key):
    """``(entry, {"hook", "collectives in the hook", "reduce_fx"})`` of a key logged from one hook only, neither a
    Metric nor ``sync_dist=True``: ``epoch_end_rank_local`` for an epoch-end hook, ``step_mean_rank_local`` for a
    step hook; the collectives are those any rank's module or Metric made in that hook (the trace's ``source``
    ``"user"`` or ``"torchmetrics"``). None for any other key."""
    if key.metric_object or key.sync_dist or len(key.hooks) != 1:
        return None
    hook = key.hooks[0]
    name = (
        "epoch_end_rank_local"
        if hook.endswith("_epoch_end")
        else "step_mean_rank_local"
        if hook.endswith("_step")
        else None
    )
    if name is None:
        return None
    made = sum(
        1
        for rank in ins.collectives
        for c in rank
        if c.get("hook") == hook and c.get("source") in ("user", "torchmetrics")
    )
    reduce_fx = next((c.get("reduce_fx") for c in key.calls), None)
    return name, {"hook": hook, "collectives in the hook": made, "reduce_fx": reduce_fx}


def _with_epoch_end_local(ins: _Inputs, key: _Key, found: tuple) -> tuple:
    """``found`` with the registry entry of a value each rank computed for itself added (:func:`_own_hook`: no
    rank ran a collective in the one hook that logged it, as the recorded trace shows), whatever else holds
    (repeated samples, no single-process run on these weights); not where ``rank_local_metric``,
    ``rank_local_mean`` or ``rank_local_weighted`` already names it."""
    verdict, cause, names, evidence = found
    own = _own_hook(ins, key)
    if own is None or own[1]["collectives in the hook"]:
        return found
    if {"rank_local_metric", "rank_local_mean", "rank_local_weighted"} & set(names):
        return found
    name, local = own
    cause = f"{cause}; " + hazards.cause(name, key=key.name, hook=local["hook"])
    return verdict, cause, [*names, name], {**evidence, **local}


def _unsynced_metrics(ins: _Inputs, key: _Key) -> list:
    """``["name (Class)"]`` of the module's Metrics built with ``sync_on_compute=False`` (on every rank), where the
    key is a logged Metric object and no rank made a torchmetrics collective (so no Metric synced its state);
    empty otherwise."""
    if not key.metric_object or any(c.get("source") == "torchmetrics" for rank in ins.collectives for c in rank):
        return []
    per_rank = [rec.get("metrics") for rec in ins.world]
    if not per_rank or any(m is None for m in per_rank):
        return []
    names = [{f"{m['name']} ({m['class']})" for m in metrics if not m["sync_on_compute"]} for metrics in per_rank]
    return sorted(set.intersection(*names)) if names else []


def _rank_divergent_unexplained(key: _Key, cause: str, unweighted: float, weighted, evidence: dict) -> tuple:
    """Rank-local values whose mean (plain or sample-weighted) is not the single-process value. "Not a
    per-sample mean" is proven only when the ranks ran exactly the single process's samples; with repeated
    samples (padding) a per-sample mean synced over the ranks is the padded set's mean too, so whether
    sync_dist=True gives the single process's value is ``unknown``; the fix that holds for either (drop the
    repeats) is given, and :func:`_with_epoch_end_local` adds the rank-local value's own entry where the trace
    proves it."""
    c = key.counts
    shown = f"averaging the ranks' values gives {unweighted:.6g}" + (
        f" (weighted by their samples {weighted:.6g})" if weighted is not None else ""
    )
    shown += f", not the single-process {key.single:.6g}"
    if c is not None and c.identified and c.duplicates and not c.unsharded:
        repeats = ", ".join(f"{k} x{v}" for k, v in c.duplicated.items())
        cause += (
            f"; {shown}; unknown whether sync_dist=True would give it: the ranks ran {sum(c.samples)} samples, "
            f"{c.duplicates} of them repeats ({repeats}), and a per-sample mean synced over the ranks counts the "
            "repeats too"
        )
        evidence.update({"samples per rank": c.samples, "duplicates": c.duplicates, "sampler": c.sampler})
        return RANK_DIVERGENT, cause, ["repeated_samples"], evidence
    if c is None or not c.identified or c.duplicates or c.missing_vs_single:
        cause += f"; {shown}; unknown why: which samples the ranks ran is not known to be the single process's"
        return RANK_DIVERGENT, cause, [], evidence
    return RANK_DIVERGENT, hazards.cause("rank_local_metric", shown=shown), ["rank_local_metric"], evidence


def _synced_by(ins: _Inputs, key: _Key) -> str:
    """Why the ranks agree on a key neither logged with sync_dist=True nor a Metric object, from what the trace
    shows: equal by construction where the module's own collectives in the key's hook made them equal (naming
    them); equal by chance only where the evidence shows the value could have differed (the ranks ran different
    samples and the value changes from batch to batch); else equal, not synced, cause not shown."""
    own = [[c for c in rank if c.get("hook") in key.hooks and c.get("source") == "user"] for rank in ins.collectives]
    if own and all(own):
        ops = ", ".join(dict.fromkeys(f"{c['op']} at {c['call_site']}" for c in own[0]))
        return f"equal by construction: the module's own collectives in {key.hooks[0]} on every rank ({ops})"
    if any(own):
        made = [r for r, found in enumerate(own) if found]
        return (
            f"the ranks agree although it is neither logged with sync_dist=True nor a torchmetrics object; in "
            f"{key.hooks[0]} only rank(s) {made} ran a collective of the module's own"
        )
    nothing = "nothing synced it (no sync_dist=True, not a torchmetrics object, no collective in its hook)"
    chance = _could_have_differed(ins, key)
    if chance:
        return f"equal by chance: {nothing}, yet {chance}"
    return f"equal, not synced, cause not shown: {nothing}"


def _could_have_differed(ins: _Inputs, key: _Key) -> str:
    """The evidence that the ranks' values could have differed, in words, or "": the ranks ran different samples
    (their loop's shards, recorded) and the key's value changed from batch to batch on a rank."""
    c = key.counts
    if c is None or not c.identified or c.unsharded or len(c.samples) < 2:
        return ""
    per_rank = [[e.get("value") for e in logs if e["key"] == key.name] for logs in ins.world_logs]
    values = per_rank[0] if per_rank else []
    distinct = {round(v, 9) for v in values if v is not None}
    if len(distinct) < 2:
        return ""
    # A value every rank logged alike at every call (a learning rate, a weight norm DDP keeps equal) does not depend
    # on the rank's samples: its agreement is no chance.
    if all(len(vs) == len(values) and all(a == b for a, b in zip(vs, values)) for vs in per_rank[1:]):
        return ""
    return (
        f"the ranks ran different samples ({', '.join(str(n) for n in c.samples)}) and rank 0 logged "
        f"{len(distinct)} different values in its batches"
    )

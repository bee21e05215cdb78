"""Equality proven, padding apart: the rows of an epoch value checked against the two proving runs
(ddpprobe/audit/worlds/_partitions.py). Pure Python.

- **Another partition** (``partition``: the W=N world again, each rank a contiguous block of the same padded
  index list instead of every W-th index). A whole-set value (a per-sample mean synced with its batch sizes, a
  torchmetrics state summed at ``compute()``) is the same under both splits; a value that moves with the split is
  computed per rank and then averaged, which is not the whole set's value (a mean of per-rank F1). So "synced,
  equals single-process" and "the mean of the ranks' values equals single-process, so sync_dist=True gives it"
  stand only where the second split gives the same number; otherwise the row names the non-decomposable
  reduction, whatever the first split happened to give (tests/facts/test_f1_over_whole_set.py).
- **One process on the ranks' samples, repeats included** (``padded``: ``DistributedSampler``'s padded list run in
  one process). A synced value equal to that run's differs from single-process by DistributedSampler's repeats
  alone (documented DDP semantics, tests/facts/test_sharding.py): the row is marked ``padding_only`` and the
  audit's exit code says so (``AuditResult.exit_code`` 3). Otherwise what remains once the repeats are run in one
  process too is explained by the rules of ``differs_cause`` against that run, and the repeats are named apart.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ddpprobe import hazards
from ddpprobe.audit.causes._differs import differs_cause
from ddpprobe.audit.causes._kinds import RANK_DIVERGENT, SYNCED_DIFFERS, SYNCED_EQUAL
from ddpprobe.audit.evidence._values import applicable, as_float, loader_kind

#: How the second partition splits the samples, as the report says it.
BLOCKS = "each rank a contiguous block of the same samples"
STRIDED = "every W-th sample on each rank (DistributedSampler's split)"
#: The registry entries whose claim ("the mean of the ranks' values equals single-process") a second split checks.
#: (Only the plain mean: a sample-weighted one is weighted by the first split's shard sizes.)
MEAN_CLAIMS = ("rank_local_mean",)


@dataclasses.dataclass(frozen=True)
class Proof:
    """What the proving runs recorded, per key: the W=N partition's per-rank ``callback_metrics`` and the padded
    single process's value and log events (None where that run did not run or did not complete)."""

    partition: Optional[list] = None  # per rank: {key: value}
    padded: Optional[dict] = None  # {key: value}
    padded_logs: Optional[list] = None

    def partition_values(self, key: str) -> Optional[list]:
        if not self.partition:
            return None
        values = [as_float(metrics.get(key)) for metrics in self.partition]
        return None if any(v is None for v in values) else values

    def padded_value(self, key: str) -> Optional[float]:
        return as_float(self.padded.get(key)) if self.padded is not None else None


def proven(row, ins, key, proof: Proof):
    """``row`` (a ``KeyRow`` of an epoch value) checked against ``proof``; the row itself where no proving run
    speaks to it."""
    if row.level != "epoch" or row.single is None:
        return row
    if row.verdict == SYNCED_EQUAL:
        return _equal_under_both(row, ins, proof)
    if row.verdict == RANK_DIVERGENT and set(row.hazards) & set(MEAN_CLAIMS):
        return _mean_claim(row, ins, proof)
    if row.verdict == RANK_DIVERGENT and "repeated_samples" in row.hazards:
        return _divergent_with_repeats(row, ins, proof)
    if row.verdict == SYNCED_DIFFERS:
        return _differs_with_repeats(row, ins, key, proof)
    return row


def _equal_under_both(row, ins, proof: Proof):
    values = proof.partition_values(row.key)
    if values is None or not all(ins.close(v, values[0]) for v in values):
        return row
    moved = values[0]
    if ins.close(moved, row.single):
        note = f"equal under a second split of the same samples too ({BLOCKS})"
        evidence = {**(row.evidence or {}), "under another split": moved}
        return dataclasses.replace(row, cause="; ".join(c for c in (row.cause, note) if c), evidence=evidence)
    evidence = {
        **(row.evidence or {}),
        "measured": row.per_rank[0],
        "single-process": row.single,
        "under another split": moved,
    }
    cause = hazards.cause(
        "non_decomposable",
        shown=(
            f"the synced value moves with how the samples are split: {row.per_rank[0]:.6g} (equal to single-process) "
            f"with {STRIDED}, {moved:.6g} with {BLOCKS}"
        ),
        why="a value each rank computes on its own samples and the sync then averages is not the whole set's value",
    )
    return dataclasses.replace(
        row,
        verdict=SYNCED_DIFFERS,
        cause=cause,
        problem=True,
        hazards=["non_decomposable"],
        fixes=applicable(["non_decomposable"], evidence),
        evidence=evidence,
    )


def _mean_claim(row, ins, proof: Proof):
    values = proof.partition_values(row.key)
    if values is None:
        return row
    mean = sum(values) / len(values)
    if ins.close(mean, row.single):
        note = f"the mean of the ranks' values equals single-process under a second split too ({BLOCKS})"
        evidence = {**(row.evidence or {}), "mean of the ranks' values under another split": mean}
        return dataclasses.replace(row, cause=f"{row.cause}; {note}", evidence=evidence)
    evidence = {**(row.evidence or {}), "mean of the ranks' values under another split": mean, "metric_object": False}
    shown = (
        f"the mean of the ranks' values is {sum(row.per_rank) / len(row.per_rank):.6g} (equal to single-process "
        f"{row.single:.6g}) with {STRIDED} but {mean:.6g} with {BLOCKS}: it moves with the split, so it equals the "
        "whole set's value by chance"
    )
    return _not_a_per_sample_mean(row, shown, evidence, ins)


def _not_a_per_sample_mean(row, shown: str, evidence: dict, ins):
    c = _counts(row, ins)
    if c is not None and c.identified and not c.duplicates and not c.missing_vs_single and not c.unsharded:
        cause = hazards.cause("rank_local_metric", shown=shown)
    else:
        cause = (
            f"each rank keeps its own shard's value; the logger writes rank 0's value only; {shown}: not a per-sample "
            "mean, so sync_dist=True cannot fix it"
        )
    return dataclasses.replace(
        row,
        cause=cause,
        hazards=["rank_local_metric"],
        fixes=applicable(["rank_local_metric"], evidence),
        evidence=evidence,
    )


def _counts(row, ins):
    return ins.counts.get(loader_kind(row.hooks[0], ins.stage)) if row.hooks else None


#: The clause of a rank-divergent row with repeats that the records of one W=N run cannot settle
#: (ddpprobe/audit/causes/_rank_local.py ``_rank_divergent_unexplained``); the padded run settles it.
UNSETTLED = "unknown whether sync_dist=True would give it"


def _divergent_with_repeats(row, ins, proof: Proof):
    """A rank-divergent row whose ranks ran repeats: whether a sync of the ranks' values gives the padded set's value
    is settled by one process running the same samples, repeats included. The row's registry entries stay (the
    repeats and the value's own entry); only the unsettled clause is replaced by what that run shows."""
    padded = proof.padded_value(row.key)
    known = [v for v in row.per_rank if v is not None]
    if padded is None or len(known) != len(row.per_rank) or UNSETTLED not in row.cause:
        return row
    mean = sum(known) / len(known)
    evidence = {**(row.evidence or {}), "one process on the ranks' samples, repeats included": padded}
    if ins.close(mean, padded):
        settled = (
            f"one process running the same samples, repeats included (in other batches), gives {padded:.6g}, the "
            f"mean of the ranks' values: sync_dist=True gives that padded set's value, and dropping the repeats "
            f"gives single-process {row.single:.6g}"
        )
    else:
        settled = (
            f"one process running the same samples, repeats included (in other batches), gives {padded:.6g}, not the "
            f"mean of the ranks' values {mean:.6g}: not a per-sample mean, so sync_dist=True cannot fix it"
        )
    start = row.cause.index(UNSETTLED)
    end = row.cause.find("counts the repeats too", start)
    end = len(row.cause) if end < 0 else end + len("counts the repeats too")
    cause = row.cause[:start] + settled + row.cause[end:]
    return dataclasses.replace(row, cause=cause, evidence=evidence)


def _differs_with_repeats(row, ins, key, proof: Proof):
    padded = proof.padded_value(row.key)
    c = _counts(row, ins)
    if padded is None or c is None or not c.duplicates or row.per_rank[0] is None:
        return row
    measured = row.per_rank[0]
    evidence = {**(row.evidence or {}), "one process on the ranks' samples, repeats included": padded}
    repeated = hazards.cause(
        "repeated_samples",
        total=sum(c.samples),
        duplicates=c.duplicates,
        repeated=", ".join(f"{k} x{v}" for k, v in c.duplicated.items()),
        sampler=c.sampler or "the sampler",
    )
    split = proof.partition_values(row.key)
    if ins.close(measured, padded) and (split is None or not ins.close(split[0], measured)):
        if split is None:
            cause = (
                f"{repeated}; one process running the same samples, repeats included (in other batches), gives "
                f"{padded:.6g} too; whether the repeats are the whole difference is not proven (no second split of "
                "the same samples ran)"
            )
            return dataclasses.replace(row, cause=cause, evidence=evidence)
        evidence["under another split"] = split[0]
        names = ["repeated_samples", "non_decomposable"]
        cause = (
            f"{repeated}; one process running the same samples, repeats included, gives {padded:.6g} too, but the "
            f"value moves with how the samples are split ({split[0]:.6g} with {BLOCKS}): "
            + hazards.cause(
                "non_decomposable",
                shown=f"{measured:.6g} with {STRIDED}, {split[0]:.6g} with {BLOCKS}",
                why="a value each rank computes on its own samples and the sync then averages is not the whole "
                "set's value",
            )
        )
        return dataclasses.replace(
            row, cause=cause, hazards=names, fixes=applicable(names, evidence), evidence=evidence
        )
    if ins.close(measured, padded):
        cause = (
            f"{repeated}; one process running the same samples, repeats included (in other batches), gives "
            f"{padded:.6g} too: the repeats are the whole difference (DistributedSampler's padding, documented DDP "
            "semantics)"
        )
        return dataclasses.replace(
            row,
            cause=cause,
            hazards=["repeated_samples"],
            fixes=applicable(["repeated_samples"], evidence),
            evidence=evidence,
            padding_only=True,
        )
    same = dataclasses.replace(c, duplicates=0, duplicated={}, missing_vs_single=0, missing=[])
    rest, names, more = differs_cause(
        row.key,
        key.calls,
        measured,
        padded,
        ins.world_logs,
        proof.padded_logs or [],
        same,
        ins.world_size,
        ins.stage,
        ins.limit_batches,
        ins.rtol,
        ins.atol,
        collectives=ins.collectives,
        hooks=key.hooks,
    )
    cause = (
        f"{repeated}, but they are not the whole difference: one process running the same samples, repeats "
        f"included, gives {padded:.6g}, not {measured:.6g}; against that run: {rest}"
    )
    names = ["repeated_samples", *names]
    evidence = {**more, **evidence}
    return dataclasses.replace(row, cause=cause, hazards=names, fixes=applicable(names, evidence), evidence=evidence)

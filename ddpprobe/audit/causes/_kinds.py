"""The verdicts of the audit's per-key rows, in the words the report uses, and the row itself. Pure Python."""

from __future__ import annotations

import dataclasses
from typing import Optional

#: The verdicts, in the words the report uses.
SYNCED_EQUAL = "synced, equals single-process"
SYNCED_DIFFERS = "synced, differs from single-process"
RANK_DIVERGENT = "rank-divergent (not synced)"
SOME_RANKS_ONLY = "logged on some ranks only (collective-mismatch hazard)"
STEP_LEVEL = "step-level, not compared with single-process"
STEP_SYNCED = "step values synced (equal on every rank)"
STEP_RANK_LOCAL = "step values rank-local (the logger gets rank 0's)"
#: Step values equal on every rank that no collective in the trace synced (the cause says why they are equal).
STEP_EQUAL_UNSYNCED = "step values equal on every rank, not synced"
NOT_AT_SINGLE = "not logged in the single-process run"
NOT_IN_WORLD = "not logged in the distributed run"
NO_VALUE = "no value on any rank (the stage did not complete)"
NO_VALUE_ON_SOME = "no value on the ranks whose stage did not complete"
NOT_STORED = "no value under this key, at W=1 or on any rank (nothing to compare)"

#: The upstream issue of the floored batch-size count in the synced epoch mean (the suite's strict xfail in
#: tests/facts/test_log_reductions.py,
#: test_the_synced_epoch_mean_is_the_batch_size_weighted_mean_even_when_the_count_does_not_divide_by_world_size).
FLOORED_COUNT_ISSUE = "https://github.com/Lightning-AI/pytorch-lightning/issues/21859"

#: A key of a ``fit`` whose weights trained apart, logged from a training hook: nothing at W=1 ran on the
#: same weights, so it is judged from the ranks alone.
TRAINED_APART = "synced; not compared with single-process (the weights trained apart)"
#: The same for a key neither logged with ``sync_dist=True`` nor a Metric, with no collective of the module's own
#: in its hook on any rank: nothing synced it, so its equal values are each rank's own (the cause says whether
#: the evidence shows they could have differed: "equal by chance", else "cause not shown").
TRAINED_APART_LOCAL = "equal on every rank, not synced (the weights trained apart)"

#: A key nothing synced (no ``sync_dist=True``, not a Metric, no collective of the module's own in its hook on
#: any rank) whose ranks agree: never called "synced". The same constant in every batch, on every rank and at
#: W=1: ``RANK_LOCAL_SAME``; otherwise equal to W=1 (``RANK_LOCAL_AGREE``) or not (``RANK_LOCAL_DIFFERS``).
RANK_LOCAL_SAME = "rank-local; the same value on every rank"
RANK_LOCAL_AGREE = "equal on every rank, not synced, and equals single-process"
RANK_LOCAL_DIFFERS = "equal on every rank, not synced, and differs from single-process"

#: Verdicts that make the audit fail when the key is epoch-level.
PROBLEMS = (
    SYNCED_DIFFERS,
    RANK_LOCAL_DIFFERS,
    RANK_DIVERGENT,
    SOME_RANKS_ONLY,
    STEP_RANK_LOCAL,
    NO_VALUE,
    NO_VALUE_ON_SOME,
    NOT_IN_WORLD,
    NOT_STORED,
)

#: What a rank-divergent value means downstream. Source: lightning_fabric/loggers/logger.py
#: ``rank_zero_experiment`` and every logger's ``@rank_zero_only log_metrics``. What callbacks monitoring it
#: did is read from their recorded state (ddpprobe/audit/evidence/_callbacks.py), not assumed.
RANK_DIVERGENT_MEANING = "each rank keeps its own shard's value; the logger writes rank 0's value only"


@dataclasses.dataclass(frozen=True)
class KeyRow:
    """One logged key.

    Attributes:
        key: the name given to ``self.log``.
        hooks: the hooks it was logged from (``"validation_step"``, ``"on_validation_epoch_end"``, ...).
        on_step, on_epoch, sync_dist: the ``self.log`` options, resolved as Lightning resolves them
            for the hook (``on_step``/``on_epoch`` defaults depend on the hook).
        reduce_fx: ``"mean"`` (default), ``"sum"``, ``"max"``, ... or a callable's name.
        metric_object: a ``torchmetrics.Metric`` was logged (it syncs its own state at ``compute()``).
        single: ``callback_metrics[key]`` after the single-process run (None if absent).
        per_rank: ``callback_metrics[key]`` on each rank of the W=N run, ordered by rank.
        logged_on: ranks whose module called ``self.log(key, ...)`` at W=N.
        verdict: one of the verdict constants of this module.
        cause: why (for ``SYNCED_DIFFERS``: sampler padding and/or a non-decomposable metric;
            for ``RANK_DIVERGENT``: what that means for the logger and callbacks), or "".
        problem: the verdict counts toward a failing audit (epoch-level keys only).
        level: ``"epoch"`` (the value in ``callback_metrics`` after the stage) or ``"step"`` (the values
            logged at each step; ``single``/``per_rank`` hold the last step's).
        fixes: the registry entries (ddpprobe/hazards/) among ``hazards`` whose fix's preconditions hold in
            ``evidence``: each is printed as a fix line naming the fact test that shows the fix works.
        evidence: the numbers the cause was proven from (``{"name": value}``).
        hazards: the registry entries the evidence proves (a problem row only); one without an applicable fix
            is printed as "No proven fix applies" with the evidence.
        padding_only: the value differs from single-process by DistributedSampler's repeats alone (one process
            running the ranks' samples, repeats included, gives it: ddpprobe/audit/causes/_proven.py).
    """

    key: str
    hooks: list
    on_step: bool
    on_epoch: bool
    sync_dist: bool
    reduce_fx: str
    metric_object: bool
    single: Optional[float]
    per_rank: list
    logged_on: list
    verdict: str
    cause: str
    problem: bool
    level: str = "epoch"
    fixes: list = dataclasses.field(default_factory=list)
    evidence: dict = dataclasses.field(default_factory=dict)
    hazards: list = dataclasses.field(default_factory=list)
    padding_only: bool = False

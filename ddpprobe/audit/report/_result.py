"""The audit's result: one row per logged key, the per-rank evidence and trace, what it prints and its
JSON form."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Optional

from ddpprobe.audit.causes._kinds import KeyRow


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """What :func:`audit` found.

    Attributes:
        model, data: the factories as ``"module:qualname"``.
        stage: ``"validate"``, ``"fit"`` or ``"test"``.
        world_size, backend: the W=N world.
        rows: one :class:`KeyRow` per logged key, in first-logged order.
        stdout_lines: ``{"single": [n], "world": [n_rank0, n_rank1, ...]}``, lines each rank wrote to
            stdout (the user's ``print``\\ s; the audit itself prints nothing in the ranks).
        stdout_samples: the first stdout lines of each W=N rank (up to 5 each).
        removed_hooks: ``[{"hook", "effect"}]`` for each removed 1.x hook the module defines.
        loaders: ``{kind: {"dataset_size", "per_rank", "padding_duplicates"}}`` at W=N, for the loaders
            the stage used (``"train"``, ``"val"``, ``"test"``).
        raised: ``{"single": ..., "world": [...]}``: ``{"type", "message"}`` where the stage raised, else None.
        experiment_calls: calls made on ``self.logger.experiment`` in the W=N run; recorded on rank 0
            only, because every other rank's experiment is a no-op ``_DummyExperiment``.
        logger_metrics: what Lightning sent to the logger in the W=N run (``[{"step", "metrics"}]``,
            rank 0 only, as with any Lightning logger).
        sync_dist_warnings: Lightning's "It is recommended to use sync_dist=True" warnings (W=N, rank 0).
        counts: ``{loop: Counts.to_dict()}`` (ddpprobe/audit/evidence/_counts.py): batches and samples each W=N rank's
            loop really ran, duplicates across ranks, whether every rank ran every sample, the sampler.
        trace: the W=N collective trace (``TRACE_SCHEMA`` below): ``{"level", "ranks", "first_divergence"}``.
        world_error: ``{"type", "message"}`` when the W=N world failed (a rank died, raised outside the
            stage, or hung past the timeout), else None; the trace still holds what every rank did.
        lightning: the Lightning package the audit ran (``"pytorch_lightning"`` or ``"lightning"``),
            chosen from what the model's class derives from.
        predictions: ``predict`` only: prediction batches each W=N rank returned, else None.
        experiment_rows: one entry per value the module wrote to ``self.logger.experiment`` itself
            (``add_scalar(tag, value, ...)``): what each W=N rank's code wrote (only rank 0's reaches the
            logger; every other rank's experiment is a no-op), the single-process value, a verdict
            (``EXPERIMENT_DIVERGENT``, ``EXPERIMENT_LOCAL``, ``EXPERIMENT_DIFFERS``, ``EXPERIMENT_EQUAL``),
            cause and fixes.
        weights: ``fit`` only: ``{"trained_apart", "steps", "same_weights"}``: whether the W=1 and W=N runs
            ended with different weights, the optimizer steps each made (``[W=1, W=N]``), and whether a
            single process validated the W=N weights (then validation keys are compared with that run and
            training keys only across ranks), else None.
        callbacks: each ``ModelCheckpoint`` / ``EarlyStopping``'s state at the end of the stage, per W=N rank
            (``ddpprobe.audit.evidence._callbacks.callback_rows``: ``{"callback", "monitor", "fields", "differs"}``).
        unmoved: the ``self.all_gather`` calls that returned non-tensor leaves unchanged
            (``ddpprobe.audit.evidence._counts.unmoved_leaves``: ``{"hook", "call_site", "leaves", "ranks"}``).
        contract: the DDP contract's evidence (ddpprobe/audit/causes/_contract.py ``contract_evidence``): the
            must-be-equal state fields that differ between the W=N ranks, each where first (``breaks``:
            ``ddpprobe.contract.Break.to_dict``), and after a ``fit`` the first optimizer step against one process on
            the same samples (``first_step``: ``ddpprobe.contract.FirstStep.to_dict``) and the LR schedules whose
            length stands otherwise to the steps taken (``schedules``).
        skipped_hooks: each hook in which some W=N rank made a collective and which another rank, going past it,
            never entered (ddpprobe/audit/evidence/_hooks.py): ``{"hook", "ranks", "collectives", "runs_on", "fact"}``.
        references: what the W=N run is compared with (ddpprobe/audit/_pipeline.py): ``{"compared_with":
            "single process" | "one-rank DDP world", "single_process_raised": {"type", "message"} | None,
            "one_rank_ddp": None (not run) | {"raised": {"type", "message"} | None}, "proving": [the proving runs
            that completed: "another split", "padded samples"]}``.

    The ``trace`` schema (version 1): ``level`` is ``"flight_recorder"`` when every rank left torch's
    Flight Recorder entries (the backend's own sequence, DDP's gradient all_reduces included) or
    ``"python"`` (the ``torch.distributed`` calls made from Python); ``ranks[r]`` has ``collectives``
    (each ``{"seq", "op", "reduce_op", "dtype", "shape", "group_size", "source", "key", "metric",
    "states", "hook", "call_site", "origin", "pg_seq", "status"}``, ``status`` ``"done"``, ``"raised"`` (with
    ``error``) or ``"pending"``: entered and never left), ``stage`` (``"end"``, ``"raised"`` or None:
    the rank never finished), ``stage_error``, ``flight_recorder_entries``; ``first_divergence`` is None
    or ``{"kind": "missing" | "mismatch" | "keys" | "purpose" | "order", "index", "ranks", "entries",
    "message"}``. The event
    format each rank writes is documented in ddpprobe/trace/.
    """

    model: str
    data: str
    stage: str
    world_size: int
    backend: str
    rows: list
    stdout_lines: dict
    stdout_samples: list
    removed_hooks: list
    loaders: dict
    raised: dict
    experiment_calls: list
    logger_metrics: list
    sync_dist_warnings: list
    counts: dict = dataclasses.field(default_factory=dict)
    trace: dict = dataclasses.field(default_factory=dict)
    world_error: Optional[dict] = None
    lightning: str = "pytorch_lightning"
    predictions: Optional[list] = None
    experiment_rows: list = dataclasses.field(default_factory=list)
    weights: Optional[dict] = None
    callbacks: list = dataclasses.field(default_factory=list)
    unmoved: list = dataclasses.field(default_factory=list)
    contract: dict = dataclasses.field(default_factory=dict)
    skipped_hooks: list = dataclasses.field(default_factory=list)
    references: dict = dataclasses.field(default_factory=dict)

    @property
    def findings(self) -> list:
        """The problems grouped by root cause (ddpprobe/audit/causes/_findings.py): ``[{"problem", "consequences"}]``,
        the ranks' divergence (or the world's failure) first with the problems it caused listed under it."""
        from ddpprobe.audit.causes._findings import findings

        return findings(self)

    @property
    def consequence_keys(self) -> list:
        """The logged keys whose problem is a consequence of the ranks' divergence or the world's failure."""
        from ddpprobe.audit.causes._findings import consequence_keys

        return consequence_keys(self)

    @property
    def hazards(self) -> list:
        """The registry entries (ddpprobe/hazards/) this report names as a cause, in its order."""
        from ddpprobe.audit.causes._findings import named_hazards

        return named_hazards(self)

    @property
    def culprit_key(self) -> Optional[str]:
        """The logged key whose sync is the culprit of the ranks' divergence (its values are what the mispaired
        collectives returned), or None."""
        from ddpprobe.audit.causes._findings import culprit_key

        return culprit_key(self)

    @property
    def problems(self) -> list:
        """Sentences, one per problem that makes the audit fail: each root cause followed by its consequences
        (:attr:`findings` keeps them grouped)."""
        return [text for f in self.findings for text in (f["problem"], *f["consequences"])]

    @property
    def exit_code(self) -> int:
        """1 when any epoch-level key is rank-divergent, differs from single-process or is logged on some
        ranks only, a step value logged with sync_dist (or a Metric) is rank-local, the ranks'
        collectives diverge, the world failed, the data is not sharded, or the stage raised; 3 when every such
        problem is a value that differs from single-process by DistributedSampler's repeated samples alone
        (:attr:`padding_only`: documented DDP semantics a CI run may accept, ``ddpprobe audit ... ||
        [ $? -eq 3 ]``); else 0."""
        if not self.problems:
            return 0
        return 3 if self.padding_only else 1

    @property
    def padding_only(self) -> bool:
        """Every problem is a key whose value one process running the ranks' samples, repeats included, gives
        (``KeyRow.padding_only``), and there is at least one."""
        keys = {r.key for r in self.rows if r.problem}
        only = {r.key for r in self.rows if r.problem and r.padding_only}
        return bool(keys) and keys == only and len(self.findings) == len(only)

    def row(self, key: str, level: Optional[str] = None) -> KeyRow:
        """The row of ``key`` (its epoch row when it has both, unless ``level="step"``). Raises
        ``KeyError`` naming the logged keys."""
        for row in self.rows:
            if row.key == key and (level is None or row.level == level):
                return row
        raise KeyError(f"{key!r} was not logged; logged keys: {[r.key for r in self.rows]}")

    def to_dict(self) -> dict:
        """JSON-ready form (what ``--json`` prints), with ``problems`` and ``exit_code`` added."""
        out = dataclasses.asdict(self)
        out["problems"] = self.problems
        out["findings"] = self.findings
        out["hazards"] = self.hazards
        out["exit_code"] = self.exit_code
        return out

    def to_json(self) -> str:
        """``to_dict()`` as standard JSON (RFC 8259): a logged NaN or infinity, which JSON cannot hold,
        is written as the string ``"nan"``, ``"inf"`` or ``"-inf"``."""
        return json.dumps(_finite(self.to_dict()), indent=2, allow_nan=False)

    def format(self) -> str:
        """The plain-text report the command line prints."""
        from ddpprobe.audit.report._format import format_result

        return format_result(self)

    def __str__(self) -> str:
        return self.format()


def _finite(value):
    """``value`` with every non-finite float (in dicts, lists, tuples) replaced by ``str(float)``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value

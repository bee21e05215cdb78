"""Audit your own LightningModule: which logged values are rank-local, padded or wrong under DDP.

:func:`audit` runs one stage (``validate``, ``fit`` or ``test``) of your module on your data twice,
in fresh worlds started by :func:`ddpprobe.run_world`: once in a single process (W=1), once on
``world_size`` ranks (W=N, gloo on CPUs by default). Each rank records every ``self.log`` call with its
hook and options, the final ``trainer.callback_metrics``, what it printed, which removed Lightning
1.x hooks the module defines, and the dataset size. The result has one row per logged key, e.g. for
``examples/seed_f1_module.py`` at W=2::

    key     hook                     step  epoch  sync_dist  reduce_fx  W=1  rank 0    rank 1  verdict
    val_f1  on_validation_epoch_end  no    yes    no         mean       0.8  0.857143  0.75    ! rank-divergent (not synced)

with one of these verdicts (``ddpprobe.audit.SYNCED_EQUAL`` etc.):

- ``synced, equals single-process``;
- ``synced, differs from single-process``, with the likely cause: ``DistributedSampler`` padding
  (``ceil(N/W)*W - N`` duplicated samples) or a non-decomposable metric averaged over batches/ranks;
- ``rank-divergent (not synced)``: each rank keeps its own value, the logger writes rank 0's;
- ``logged on some ranks only (collective-mismatch hazard)``;
- ``step-level, not compared with single-process`` (informational).

Command line: ``python -m ddpprobe audit mypkg.models:make_model --data mypkg.data:make_data``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Callable, Optional, Union

from ddpprobe.audit._verdict import (
    NOT_AT_SINGLE,
    REMOVED_HOOKS,
    RANK_DIVERGENT,
    SOME_RANKS_ONLY,
    STEP_LEVEL,
    SYNCED_DIFFERS,
    SYNCED_EQUAL,
    KeyRow,
    padding_duplicates,
    rows as _rows,
)

__all__ = [
    "AuditInputError",
    "AuditResult",
    "KeyRow",
    "NOT_AT_SINGLE",
    "RANK_DIVERGENT",
    "SOME_RANKS_ONLY",
    "STEP_LEVEL",
    "SYNCED_DIFFERS",
    "SYNCED_EQUAL",
    "audit",
]


STAGES = ("validate", "fit", "test")


class AuditInputError(ValueError):
    """The audit cannot run what it was given: a factory that cannot be imported, or that returns the
    wrong type, or a bad option. The message names the bad value and the fix. (CLI exit code 2.)"""


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

    @property
    def problems(self) -> list:
        """Sentences, one per finding that makes the audit fail."""
        out = [f"{row.key}: {row.verdict}" for row in self.rows if row.problem]
        for where, info in [("W=1", self.raised["single"])] + [
            (f"rank {r}", info) for r, info in enumerate(self.raised["world"])
        ]:
            if info:
                out.append(f"the {self.stage} stage raised {info['type']} ({where})")
        return out

    @property
    def exit_code(self) -> int:
        """1 when any epoch-level key is rank-divergent, differs from single-process or is logged on some
        ranks only, or the stage raised; else 0."""
        return 1 if self.problems else 0

    def row(self, key: str) -> KeyRow:
        """The row of ``key``. Raises ``KeyError`` naming the logged keys."""
        for row in self.rows:
            if row.key == key:
                return row
        raise KeyError(f"{key!r} was not logged; logged keys: {[r.key for r in self.rows]}")

    def to_dict(self) -> dict:
        """JSON-ready form (what ``--json`` prints), with ``problems`` and ``exit_code`` added."""
        out = dataclasses.asdict(self)
        out["problems"] = self.problems
        out["exit_code"] = self.exit_code
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format(self) -> str:
        """The plain-text report the command line prints."""
        from ddpprobe.audit._format import format_result

        return format_result(self)

    def __str__(self) -> str:
        return self.format()


def _ref(factory: Union[str, Callable], what: str) -> str:
    """``"module:qualname"`` of a factory given as a string or an importable top-level callable."""
    from ddpprobe.audit._scenario import resolve_ref

    if isinstance(factory, str):
        ref = factory if ":" in factory else ":".join(factory.rsplit(".", 1))
    elif callable(factory):
        module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
        if module in (None, "__main__") or "<" in qualname:
            raise AuditInputError(
                f"the {what} factory {qualname or factory!r} (module {module!r}) cannot be imported by name in the "
                "rank processes; define it with `def` at the top level of an importable module, or pass "
                "'package.module:function'"
            )
        ref = f"{module}:{qualname}"
    else:
        raise AuditInputError(f"the {what} factory must be a callable or 'package.module:function', got "
                              f"{type(factory).__name__} {factory!r}")
    try:
        found = resolve_ref(ref)
    except (ImportError, AttributeError) as exc:
        raise AuditInputError(
            f"cannot import the {what} factory {ref!r}: {type(exc).__name__}: {exc}. Give it as "
            "'package.module:function', importable from the current directory or PYTHONPATH"
        ) from None
    if not callable(found):
        raise AuditInputError(f"the {what} factory {ref!r} is a {type(found).__name__}, not a callable; point "
                              "at a function (or class) that takes no arguments")
    return ref


def _stdout_lines(text: str) -> list:
    return [line for line in text.splitlines() if line.strip()]


def audit(
    model_factory: Union[str, Callable],
    data_factory: Union[str, Callable],
    world_size: int = 2,
    stage: str = "validate",
    *,
    backend: str = "gloo",
    limit_batches: Optional[int] = None,
    max_epochs: int = 1,
    seed: int = 0,
    timeout: Optional[float] = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> AuditResult:
    """Run ``stage`` of ``model_factory()`` on ``data_factory()`` at W=1 and at W=``world_size``; compare.

    Args:
        model_factory: a top-level callable (or ``"package.module:function"``) taking no arguments and
            returning a ``pytorch_lightning.LightningModule``. Called once in every rank of both worlds,
            after ``seed_everything(seed)``.
        data_factory: the same for the data: returns a ``LightningDataModule``, a ``DataLoader`` (the
            stage's loader), or ``{"train": DataLoader, "val": DataLoader}``.
        world_size: ranks of the distributed run (>= 2 to compare anything).
        stage: ``"validate"`` (default), ``"fit"`` or ``"test"``. In ``fit`` the weights train
            differently at W=N (gradients averaged over W batches), so values computed from them can
            differ from single-process for that reason alone; ``validate`` isolates logging.
        backend: ``"gloo"`` (CPU processes) or ``"nccl"`` (one CUDA device per rank).
        limit_batches: ``limit_*_batches`` for the Trainer (None: every batch).
        max_epochs: epochs for ``fit``.
        seed: ``seed_everything`` seed used before the factories run in every rank.
        timeout: seconds each world may run (default ``DDPPROBE_TIMEOUT`` or 120).
        rtol, atol: tolerance for two values being equal.

    Returns:
        An :class:`AuditResult`; ``result.exit_code`` is 1 when an epoch-level key is rank-divergent,
        differs from single-process, or is logged on some ranks only, or the stage raised.

    Raises:
        AuditInputError: a factory cannot be imported or returns the wrong type, or a bad option.
        ddpprobe.WorldError: a world failed outside the user's stage (e.g. a hang in a collective:
            ``WorldTimeout``, with each rank's stack).
    """
    from ddpprobe.launch import run_world

    if stage not in STAGES:
        raise AuditInputError(f"stage={stage!r} is not supported; use one of {', '.join(STAGES)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise AuditInputError(f"world_size={world_size!r} must be a positive int (2 or more to compare ranks)")
    if limit_batches is not None and (isinstance(limit_batches, bool) or not isinstance(limit_batches, int)
                                      or limit_batches < 1):
        raise AuditInputError(f"limit_batches={limit_batches!r} must be a positive int number of batches")
    model_ref, data_ref = _ref(model_factory, "model"), _ref(data_factory, "data")
    params = dict(model_ref=model_ref, data_ref=data_ref, stage=stage, limit_batches=limit_batches,
                  max_epochs=max_epochs, seed=seed,
                  sys_path=[os.path.abspath(p) if p else os.getcwd() for p in sys.path])
    from ddpprobe.audit._scenario import audit_rank

    runs = {}
    for label, size in (("single", 1), ("world", world_size)):
        result = run_world(audit_rank, size, backend=backend, timeout=timeout, **params)
        for rank in result:
            if rank.record.get("input_error"):
                raise AuditInputError(rank.record["input_error"])
        runs[label] = result
    single, world = runs["single"][0].record, runs["world"].records

    loaders = {}
    for kind, entries in world[0]["loaders"].items():
        if entries:
            size = entries[0]["dataset_size"]
            loaders[kind] = {"dataset_size": size, "per_rank": entries[0]["per_rank"],
                             "padding_duplicates": padding_duplicates(size, world_size)}
    hint = "It is recommended to use `self.log("
    return AuditResult(
        model=model_ref,
        data=data_ref,
        stage=stage,
        world_size=world_size,
        backend=backend,
        rows=_rows(single, world, world_size, stage, limit_batches, rtol=rtol, atol=atol),
        stdout_lines={"single": [len(_stdout_lines(runs["single"][0].stdout))],
                      "world": [len(_stdout_lines(r.stdout)) for r in runs["world"]]},
        stdout_samples=[_stdout_lines(r.stdout)[:5] for r in runs["world"]],
        removed_hooks=[{"hook": h, "effect": REMOVED_HOOKS[h]} for h in world[0]["removed_hooks"]],
        loaders=loaders,
        raised={"single": single["raised"], "world": [rec["raised"] for rec in world]},
        experiment_calls=world[0]["experiment_calls"],
        logger_metrics=world[0]["logger_metrics"],
        sync_dist_warnings=sorted({w["message"] for w in world[0]["warnings"] if hint in w["message"]}),
    )

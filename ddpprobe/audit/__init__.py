"""Audit your own LightningModule: which logged values are rank-local, wrong or unsafe under DDP, and why.

:func:`audit` first checks the factories in this process (import, call, types, which Lightning
package the module is written for), then runs one stage (``validate``, ``fit``, ``test`` or
``predict``) of your module on your data twice, in fresh worlds started by
:func:`ddpprobe.run_world`: once in a single process (W=1), once on ``world_size`` ranks (W=N, gloo on
CPUs by default). Each rank writes a trace as it runs (ddpprobe/probes/trace.py): every collective in
order with the hook, the logged key, op, dtype, shape and the user's line; every ``self.log`` call with
its value and batch size; every batch's sample ids (or content hashes). Each rank also records the
final ``trainer.callback_metrics``, what it printed, the removed Lightning 1.x hooks the module
defines, and what reached the logger. The result has one row per logged key, e.g. for
``examples/seed_f1_module.py`` at W=2::

    key     hook                     step  epoch  sync_dist  reduce_fx  W=1  rank 0    rank 1  verdict
    val_f1  on_validation_epoch_end  no    yes    no         mean       0.8  0.857143  0.75    ! rank-divergent ...

with one of these verdicts (``ddpprobe.audit.SYNCED_EQUAL`` etc.):

- ``synced, equals single-process``;
- ``synced, differs from single-process``, with the cause only where the records prove it: samples the
  ranks really ran twice (padding), every rank running every sample (unsharded data), the floored
  count of upstream issue #21859 (the synced mean recomputed from the logged values with a floored
  count equals the measured one), a non-decomposable metric (the same samples with the same weights
  average to another number), else ``unknown`` with the evidence;
- ``rank-divergent (not synced)``: each rank keeps its own value, the logger writes rank 0's;
- ``logged on some ranks only (collective-mismatch hazard)``;
- for values logged ``on_step``: ``step values synced`` or ``step values rank-local``;
- ``no value on any rank`` when the distributed run ended before the epoch's values existed.
- ``no value under this key`` when neither run stored one (e.g. several dataloaders: Lightning stores
  ``key/dataloader_idx_N`` instead); never counted as equal.

The ranks' collective sequences are aligned and the first divergence is reported: a collective some
ranks never enter (who waits, at which line), different op/dtype/shape, or the same op carrying
different keys on different ranks. Every fix line names the fact test that shows the fix works.

Command line: ``python -m ddpprobe audit mypkg.models:make_model --data mypkg.data:make_data``.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional, Union

from ddpprobe.audit._experiment import (
    EXPERIMENT_DIFFERS,
    EXPERIMENT_DIVERGENT,
    EXPERIMENT_EQUAL,
    EXPERIMENT_LOCAL,
    experiment_rows,
)
from ddpprobe.audit._fixes import FIXES, REMOVED_HOOKS
from ddpprobe.audit._inputs import MAX_SEED, STAGES, AuditInputError, _ref, preflight
from ddpprobe.audit._result import AuditResult
from ddpprobe.audit._verdict import (
    FLOORED_COUNT_ISSUE,
    NO_VALUE,
    NOT_AT_SINGLE,
    NOT_IN_WORLD,
    NOT_STORED,
    RANK_DIVERGENT,
    SOME_RANKS_ONLY,
    STEP_LEVEL,
    STEP_RANK_LOCAL,
    STEP_SYNCED,
    SYNCED_DIFFERS,
    SYNCED_EQUAL,
    KeyRow,
    padding_duplicates,
)
from ddpprobe.audit._verdict import (
    rows as _rows,
)

__all__ = [
    "AuditInputError",
    "AuditResult",
    "EXPERIMENT_DIFFERS",
    "EXPERIMENT_DIVERGENT",
    "EXPERIMENT_EQUAL",
    "EXPERIMENT_LOCAL",
    "FIXES",
    "FLOORED_COUNT_ISSUE",
    "KeyRow",
    "NOT_AT_SINGLE",
    "NOT_IN_WORLD",
    "NOT_STORED",
    "NO_VALUE",
    "STEP_RANK_LOCAL",
    "STEP_SYNCED",
    "RANK_DIVERGENT",
    "SOME_RANKS_ONLY",
    "STEP_LEVEL",
    "SYNCED_DIFFERS",
    "SYNCED_EQUAL",
    "audit",
]


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
    progress: Optional[Callable[[str], None]] = None,
) -> AuditResult:
    """Run ``stage`` of ``model_factory()`` on ``data_factory()`` at W=1 and at W=``world_size``; compare.

    Args:
        model_factory: a top-level callable (or ``"package.module:function"``) taking no arguments and
            returning a ``LightningModule`` of ``pytorch_lightning`` or ``lightning.pytorch`` (the audit
            runs that package's Trainer). Called once here to check it, then once in every rank of both
            worlds, after ``seed_everything(seed)``.
        data_factory: the same for the data: returns a ``LightningDataModule``, a ``DataLoader`` (the
            stage's loader), or ``{"train": DataLoader, "val": DataLoader}`` (also ``"test"``, ``"predict"``).
        world_size: ranks of the distributed run, 2 or more (1 would compare a single process with itself).
        stage: ``"validate"`` (default), ``"fit"``, ``"test"`` or ``"predict"``. In ``fit`` the weights
            train differently at W=N (gradients averaged over W batches), so values computed from them can
            differ from single-process for that reason alone; ``validate`` isolates logging.
        backend: ``"gloo"`` (CPU processes) or ``"nccl"`` (one CUDA device per rank).
        limit_batches: ``limit_*_batches`` for the Trainer (None: every batch).
        max_epochs: epochs for ``fit``.
        seed: ``seed_everything`` seed used before the factories run in every rank.
        timeout: seconds each world may run (default ``DDPPROBE_TIMEOUT`` or 120); a collective that
            never completes fails after half of it (the process-group timeout).
        rtol, atol: tolerance for two values being equal.
        progress: called with one line before each world starts (which world, its time limit), e.g.
            ``print`` to stderr, so a module that hangs is not waited for in silence (the command line
            passes one).

    Returns:
        An :class:`AuditResult`; ``result.exit_code`` is 1 when it found a problem (see
        ``AuditResult.exit_code``).

    Raises:
        AuditInputError: a factory cannot be imported, raises or returns the wrong type, a bad option,
            or ``world_size`` below 2; raised before any world starts.
        ddpprobe.WorldError: the single-process world failed (the module cannot run at all).
    """
    import shutil
    import tempfile

    from ddpprobe.audit import _evidence
    from ddpprobe.launch import (
        MAX_WORLD_SIZE,
        SettingsError,
        WorldError,
        cuda_device_count,
        resolve_settings,
        run_world,
    )

    if stage not in STAGES:
        raise AuditInputError(f"stage={stage!r} is not supported; use one of {', '.join(STAGES)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise AuditInputError(f"world_size={world_size!r} must be an int of 2 or more ranks")
    if world_size == 1:
        raise AuditInputError(
            "world_size=1 would run the single-process world twice and compare nothing; use --world-size 2 or more"
        )
    if world_size > MAX_WORLD_SIZE:
        raise AuditInputError(
            f"world_size={world_size} (--world-size) is more ranks than a world can have; "
            f"use 2 <= world_size <= {MAX_WORLD_SIZE}"
        )
    if limit_batches is not None and (
        isinstance(limit_batches, bool) or not isinstance(limit_batches, int) or limit_batches < 1
    ):
        raise AuditInputError(f"limit_batches={limit_batches!r} must be a positive int number of batches")
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
        # Lightning reads max_epochs=-1 as "train forever": the world would only end at its timeout.
        raise AuditInputError(f"max_epochs={max_epochs!r} (--max-epochs) must be an int of 1 or more epochs")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        # seed_everything raises for these in every rank (lightning_fabric/utilities/seed.py).
        raise AuditInputError(f"seed={seed!r} (--seed) must be an int from 0 to {MAX_SEED}")
    try:  # the same check run_world makes, made before the factories run instead of after the W=1 world
        settings = resolve_settings(
            backend=backend,
            timeout=timeout,
            names={"backend": "backend= / --backend", "timeout": "timeout= / --timeout"},
        )
    except SettingsError as exc:
        raise AuditInputError(str(exc)) from None
    if settings.backend == "nccl" and cuda_device_count() < world_size:
        raise AuditInputError(
            f"backend='nccl' (--backend) needs one CUDA device per rank: --world-size {world_size} but this machine "
            f"has {cuda_device_count()} CUDA device(s); use --backend gloo or a --world-size of at most "
            f"{cuda_device_count()} (2 or more)"
        )
    model_ref, data_ref = _ref(model_factory, "model"), _ref(data_factory, "data")
    sys_path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    package = preflight(model_ref, data_ref, stage)
    from ddpprobe.audit._scenario import audit_rank, trace_path
    from ddpprobe.probes.trace import FLIGHT_RECORDER_ENV, read_trace

    params = dict(
        model_ref=model_ref,
        data_ref=data_ref,
        stage=stage,
        limit_batches=limit_batches,
        max_epochs=max_epochs,
        seed=seed,
        sys_path=sys_path,
    )
    trace_root = tempfile.mkdtemp(prefix="ddpprobe-audit-")
    try:
        runs, traces, errors, outputs = {}, {}, {}, {}
        for label, size in (("single", 1), ("world", world_size)):
            if progress is not None:
                ranks = "single process" if size == 1 else f"{size} ranks"
                progress(
                    f"running {stage} of {model_ref} at W={size} ({ranks}, at most {settings.timeout:g} s; "
                    "--timeout changes it)"
                )
            folder = os.path.join(trace_root, label)
            os.makedirs(folder)
            try:
                runs[label] = run_world(
                    audit_rank,
                    size,
                    backend=backend,
                    timeout=timeout,
                    env=FLIGHT_RECORDER_ENV,
                    trace_dir=folder,
                    **params,
                )
            except WorldError as exc:
                if label == "single":
                    raise
                runs[label] = None
                errors[label] = {"type": type(exc).__name__, "message": str(exc)}
                outputs = exc.outputs
            traces[label] = [_evidence.split(read_trace(trace_path(folder, r))) for r in range(size)]
            for rank in runs[label] or []:
                if rank.record.get("input_error"):
                    raise AuditInputError(rank.record["input_error"])
    finally:
        shutil.rmtree(trace_root, ignore_errors=True)

    single = runs["single"][0].record
    world = runs["world"].records if runs["world"] is not None else [_record_from_trace(t) for t in traces["world"]]
    loop = _evidence.STAGE_LOOP[stage]
    counts = {}
    for kind in [loop, "val"] if stage == "fit" else [loop]:
        found = _evidence.counts(traces["world"], traces["single"][0], kind)
        if found is not None:
            counts[kind] = found
    loaders = {}
    for kind, entries in (world[0].get("loaders") or {}).items():
        if entries:
            size = entries[0]["dataset_size"]
            loaders[kind] = {
                "dataset_size": size,
                "per_rank": entries[0]["per_rank"],
                "padding_duplicates": padding_duplicates(size, world_size),
                "sampler": entries[0].get("sampler"),
            }
    completed = all(t["stage"] == "end" for t in traces["world"])
    hint = "It is recommended to use `self.log("
    world_stdout = (
        [r.stdout for r in runs["world"]]
        if runs["world"] is not None
        else [outputs.get(r, ("", ""))[0] for r in range(world_size)]
    )
    return AuditResult(
        model=model_ref,
        data=data_ref,
        stage=stage,
        world_size=world_size,
        backend=backend,
        rows=_rows(
            single,
            world,
            world_size,
            stage,
            limit_batches,
            rtol=rtol,
            atol=atol,
            world_logs=[t["logs"] for t in traces["world"]],
            single_logs=traces["single"][0]["logs"],
            counts=counts,
            completed=completed,
            collectives=[t["collectives"] for t in traces["world"]],
            ended=[t["stage"] for t in traces["world"]],
        ),
        stdout_lines={
            "single": [len(_stdout_lines(runs["single"][0].stdout))],
            "world": [len(_stdout_lines(text)) for text in world_stdout],
        },
        stdout_samples=[_stdout_lines(text)[:5] for text in world_stdout],
        removed_hooks=[
            {"hook": h, "effect": REMOVED_HOOKS[h]} for h in (world[0].get("removed_hooks") or single["removed_hooks"])
        ],
        loaders=loaders,
        raised={"single": single["raised"], "world": [rec.get("raised") for rec in world]},
        experiment_calls=world[0].get("experiment_calls") or [],
        logger_metrics=world[0].get("logger_metrics") or [],
        sync_dist_warnings=sorted({w["message"] for w in world[0].get("warnings") or [] if hint in w["message"]}),
        counts={kind: c.to_dict() for kind, c in counts.items()},
        trace=_evidence.trace_summary(traces["world"], stage),
        world_error=errors.get("world"),
        lightning=package,
        predictions=[rec.get("predictions") for rec in world] if stage == "predict" else None,
        experiment_rows=experiment_rows(
            single.get("experiment_attempts") or [],
            [rec.get("experiment_attempts") or [] for rec in world],
            [t["collectives"] for t in traces["world"]],
            {kind: c.to_dict() for kind, c in counts.items()},
            rtol,
            atol,
        ),
    )


def _record_from_trace(rank: dict) -> dict:
    """A stand-in for the record of a rank whose world failed: what its trace holds."""
    from ddpprobe.audit._scenario import _summarise_calls

    return {
        "log_calls": _summarise_calls(rank["logs"]),
        "callback_metrics": {},
        "loaders": {},
        "raised": (
            {"type": rank["stage_error"].partition(":")[0], "message": rank["stage_error"].partition(": ")[2]}
            if rank["stage_error"]
            else None
        ),
        "removed_hooks": [],
        "experiment_calls": [],
        "experiment_attempts": [],
        "logger_metrics": [],
        "warnings": [],
    }

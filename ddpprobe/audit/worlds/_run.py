"""Running the audit's worlds and assembling their records into an :class:`~ddpprobe.audit.AuditResult`.

Each world is a :func:`ddpprobe.run_world` of ``ddpprobe.audit.worlds._scenario.audit_rank``: the single process
(W=1), the distributed run (W=N) and, after a ``fit`` whose weights trained differently at W=1, a single
process validating the weights the distributed run trained (``same_weights``), so validation values are
compared on the same weights. Each rank writes its trace into a folder of the audit's own.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Callable, Optional

from ddpprobe.audit.causes._contract import CONTRACT_BREAK, apart_cause, contract_evidence, weights_apart
from ddpprobe.audit.causes._kinds import RANK_DIVERGENT, SYNCED_DIFFERS
from ddpprobe.audit.causes._verdict import rows
from ddpprobe.audit.evidence._callbacks import callback_rows
from ddpprobe.audit.evidence._experiment import experiment_rows
from ddpprobe.audit.evidence._hooks import collectives_in_hooks_some_ranks_skip
from ddpprobe.audit.evidence._sequences import trace_summary
from ddpprobe.audit.evidence._values import loader_kind, padding_duplicates
from ddpprobe.audit.report._result import AuditResult
from ddpprobe.audit.worlds._inputs import AuditInputError
from ddpprobe.audit.worlds._worlds import World, Worlds
from ddpprobe.hazards import REMOVED_HOOKS
from ddpprobe.trace import FLIGHT_RECORDER_ENV, read_trace, split_trace

#: Lightning's hint that a logged value should be synced (rank 0's warnings are counted in the report).
SYNC_DIST_HINT = "It is recommended to use `self.log("


def run_one(params: dict, size: int, root: str, settings, progress: Optional[Callable], what: str = "") -> World:
    """Run one world of ``size`` ranks of ``audit_rank(**params)``, its traces in a new folder under ``root``.

    Raises:
        ddpprobe.WorldError: the single-process world (``size == 1``) failed: the module cannot run at all.
        AuditInputError: a factory returned something the audit cannot run (found in the ranks).
    """
    from ddpprobe.audit.worlds._scenario import WEIGHTS_FILE, audit_rank, trace_path
    from ddpprobe.launch import WorldError, run_world

    if progress is not None:
        ranks = "single process" if size == 1 else f"{size} ranks"
        progress(
            f"running {params['stage']} of {params['model_ref']} at W={size} ({ranks}{what}, at most "
            f"{settings.timeout:g} s; --timeout changes it)"
        )
    folder = tempfile.mkdtemp(dir=root)
    try:
        run = run_world(
            audit_rank,
            size,
            backend=settings.backend,
            timeout=settings.timeout,
            env=FLIGHT_RECORDER_ENV,
            trace_dir=folder,
            **params,
        )
    except WorldError as exc:
        if size == 1:
            raise
        traces = [split_trace(read_trace(trace_path(folder, r))) for r in range(size)]
        stdout = [exc.outputs.get(r, ("", ""))[0] for r in range(size)]
        records = [rec if rec is not None else _trace_only(t) for rec, t in zip(exc.records, traces)]
        for record in records:
            if record.get("input_error"):
                raise AuditInputError(record["input_error"])
        return World(records, traces, stdout, {"type": type(exc).__name__, "message": str(exc)}, folder=folder)
    for rank in run:
        if rank.record.get("input_error"):
            raise AuditInputError(rank.record["input_error"])
    weights = os.path.join(folder, WEIGHTS_FILE)
    return World(
        [r.record for r in run],
        [split_trace(read_trace(trace_path(folder, r))) for r in range(size)],
        [r.stdout for r in run],
        weights=weights if os.path.exists(weights) else None,
        folder=folder,
    )


def run_worlds(params: dict, world_size: int, settings, progress: Optional[Callable]) -> Worlds:
    """The :class:`Worlds` of one audit: W=1, W=N, and after a ``fit`` whose trained weights differ between
    the two, W=1 validating the weights the W=N run trained."""
    root = tempfile.mkdtemp(prefix="ddpprobe-audit-")
    try:
        single = run_one(params, 1, root, settings, progress)
        world = run_one(params, world_size, root, settings, progress)
        same = None
        apart = Worlds(single, world, stage=params["stage"]).trained_apart
        if params["stage"] == "fit" and apart and world.weights and _validates(world):
            same = run_one(
                {**params, "stage": "validate", "weights": world.weights},
                1,
                root,
                settings,
                progress,
                " validating the weights the W=N fit trained",
            )
        first_step = _first_step(params, world, root, settings, progress) if params["stage"] == "fit" else None
        return Worlds(single, world, same, params["stage"], params["limit_batches"], first_step=first_step)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _first_step(params: dict, world: World, root: str, settings, progress) -> Optional[World]:
    """W=1 stepping once on the W=N ranks' first batches from their initial weights
    (ddpprobe/audit/worlds/_reference.py), or None where the W=N run saved no batches (it made no training step,
    or a batch torch cannot save)."""
    from ddpprobe.audit.worlds._reference import FIRST_BATCH, INITIAL_WEIGHTS
    from ddpprobe.launch import WorldError

    folder = world.folder
    size = len(world.records)
    saved = [os.path.join(folder, FIRST_BATCH.format(rank=r)) for r in range(size)] if folder else []
    if not saved or not all(os.path.exists(p) for p in saved + [os.path.join(folder, INITIAL_WEIGHTS)]):
        return None
    try:
        step = run_one(
            {**params, "reference": folder}, 1, root, settings, progress, " stepping once on every rank's first batch"
        )
    except WorldError:
        return None
    return step if step.records[0].get("reference") is None else None


def _validates(world: World) -> bool:
    return any("validation" in (c.get("hook") or "") for c in world.records[0]["log_calls"])


def _trace_only(rank: dict) -> dict:
    """What is known of a rank that gave no record (it died, or was still running when its world was
    ended): the ``self.log`` calls, values and stage error its trace holds; nothing else was recorded."""
    from ddpprobe.audit.worlds._scenario import _summarise_calls

    error = rank["stage_error"]
    return {
        "log_calls": _summarise_calls(rank["logs"]),
        "callback_metrics": rank.get("callback_metrics") or {},
        "loaders": {},
        "raised": {"type": error.partition(":")[0], "message": error.partition(": ")[2]} if error else None,
        "removed_hooks": [],
        "experiment_calls": [],
        "experiment_attempts": [],
        "logger_metrics": [],
        "warnings": [],
    }


def _stdout_lines(text: str) -> list:
    return [line for line in text.splitlines() if line.strip()]


def _loaders(world: World, world_size: int) -> dict:
    out = {}
    for kind, entries in (world.records[0].get("loaders") or {}).items():
        if entries:
            size = entries[0]["dataset_size"]
            out[kind] = {
                "dataset_size": size,
                "per_rank": entries[0]["per_rank"],
                "padding_duplicates": padding_duplicates(size, world_size),
                "sampler": entries[0].get("sampler"),
            }
    return out


def assemble(worlds: Worlds, inputs: dict, rtol: float, atol: float) -> AuditResult:
    """The :class:`AuditResult` of ``worlds`` (what ``run_worlds`` ran) for ``inputs`` (``model``, ``data``,
    ``stage``, ``world_size``, ``backend``, ``lightning``), with the tolerances."""
    single, world = worlds.single, worlds.world
    first = world.records[0]
    result = AuditResult(
        **inputs,
        rows=rows(worlds, rtol=rtol, atol=atol),
        stdout_lines={
            "single": [len(_stdout_lines(single.stdout[0]))],
            "world": [len(_stdout_lines(text)) for text in world.stdout],
        },
        stdout_samples=[_stdout_lines(text)[:5] for text in world.stdout],
        removed_hooks=[
            {"hook": h, "effect": REMOVED_HOOKS[h]}
            for h in (first.get("removed_hooks") or single.records[0]["removed_hooks"])
        ],
        loaders=_loaders(world, worlds.world_size),
        raised={"single": single.records[0]["raised"], "world": [rec.get("raised") for rec in world.records]},
        experiment_calls=first.get("experiment_calls") or [],
        logger_metrics=first.get("logger_metrics") or [],
        sync_dist_warnings=sorted(
            {w["message"] for w in first.get("warnings") or [] if SYNC_DIST_HINT in w["message"]}
        ),
        counts={kind: c.to_dict() for kind, c in worlds.counts.items()},
        trace=trace_summary(world.traces, worlds.stage, worlds.shards),
        world_error=world.error,
        predictions=[rec.get("predictions") for rec in world.records] if worlds.stage == "predict" else None,
        experiment_rows=experiment_rows(worlds, rtol, atol),
        weights=_weights(worlds) if worlds.stage == "fit" else None,
        callbacks=callback_rows(world.records),
        unmoved=worlds.unmoved,
        contract=contract_evidence(worlds),
        skipped_hooks=collectives_in_hooks_some_ranks_skip(world.traces),
    )
    # A key the ranks' divergence took down is its consequence: the divergence's note carries the fix.
    if weights_apart(result.contract) is not None:
        result = dataclasses.replace(result, rows=[_explained_by_contract(result, r) for r in result.rows])
    consequences = set(result.consequence_keys)
    rows_ = [dataclasses.replace(r, fixes=[], hazards=[]) if r.key in consequences else r for r in result.rows]
    return dataclasses.replace(result, rows=rows_)


def _explained_by_contract(result: AuditResult, row):
    """A synced key's row whose value differs where the ranks held different parameters, buffers or datasets for
    its loop (the contract's break): that break is its cause. A key nothing synced keeps its own cause (its ranks'
    values differ anyway), and so does a key of another loop than the dataset that differs."""
    if not (row.problem and row.verdict in (RANK_DIVERGENT, SYNCED_DIFFERS) and row.level != "step"):
        return row
    if not (row.sync_dist or row.metric_object):
        return row
    apart = weights_apart(result.contract, loader_kind(row.hooks[0], result.stage) if row.hooks else None)
    if apart is None:
        return row
    evidence = {**(row.evidence or {}), CONTRACT_BREAK: apart["field"]}
    return dataclasses.replace(row, cause=apart_cause(apart), fixes=[], hazards=[], evidence=evidence)


def _weights(worlds: Worlds) -> dict:
    return {
        "trained_apart": worlds.trained_apart,
        "steps": worlds.steps,
        "same_weights": worlds.same_weights is not None,
    }

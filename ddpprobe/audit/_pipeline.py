"""The audit's pipeline: which worlds run, in which order (:func:`run_worlds`), and the assembly of their records
into an :class:`~ddpprobe.audit.AuditResult` (:func:`assemble`).

Each world is a :func:`ddpprobe.run_world` of ``ddpprobe.audit.worlds._scenario.audit_rank``: the user's single
process (W=1, ``Trainer(devices=1)``), the distributed run (W=N) and, where they are needed, the one-rank DDP
world, a single process validating the weights a distributed ``fit`` trained (``same_weights``), one process
stepping on the ranks' first batches, and the proving runs (another split of the samples; the ranks' samples with
their repeats in one process). Each rank writes its trace into a folder of the audit's own.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Callable, Optional

from ddpprobe.audit.causes._contract import (
    CONTRACT_BREAK,
    apart_cause,
    contract_evidence,
    fed_by_monitored_keys,
    weights_apart,
)
from ddpprobe.audit.causes._kinds import RANK_DIVERGENT, SYNCED_DIFFERS, SYNCED_EQUAL
from ddpprobe.audit.causes._verdict import rows
from ddpprobe.audit.evidence._callbacks import callback_rows
from ddpprobe.audit.evidence._experiment import experiment_rows
from ddpprobe.audit.evidence._hooks import collectives_in_hooks_some_ranks_skip
from ddpprobe.audit.evidence._sequences import trace_summary
from ddpprobe.audit.evidence._stages import STAGE_LOOP
from ddpprobe.audit.evidence._values import loader_kind, padding_duplicates
from ddpprobe.audit.report._result import AuditResult
from ddpprobe.audit.worlds._inputs import AuditInputError
from ddpprobe.audit.worlds._worlds import World, Worlds
from ddpprobe.hazards import REMOVED_HOOKS
from ddpprobe.trace import FLIGHT_RECORDER_ENV, read_trace, split_trace

#: Lightning's hint that a logged value should be synced (rank 0's warnings are counted in the report).
SYNC_DIST_HINT = "It is recommended to use `self.log("


def hash_seeds(size: int) -> Optional[list]:
    """Each rank's string-hash secret (``PYTHONHASHSEED``): one of its own per rank, as processes a launcher starts
    each have (torchrun's, unless the environment sets the variable), fixed per rank so an audit is reproducible
    (rank r: ``1 + r``; the single process shares rank 0's). None where this environment sets ``PYTHONHASHSEED``:
    then a launch's processes all inherit it, and the ranks share this process's."""
    if os.environ.get("PYTHONHASHSEED"):
        return None
    return [str(1 + r) for r in range(size)]


def run_one(params: dict, size: int, root: str, settings, progress: Optional[Callable], what: str = "") -> World:
    """Run one world of ``size`` ranks of ``audit_rank(**params)``, its traces in a new folder under ``root``.

    Raises:
        ddpprobe.WorldError: the single-process world (``size == 1``) failed: the module cannot run at all.
        AuditInputError: a factory returned something the audit cannot run (found in the ranks).
    """
    from ddpprobe.audit.worlds._scenario import WEIGHTS_FILE, audit_rank, trace_path
    from ddpprobe.launch import WorldError, run_world

    if progress is not None:
        ranks = (
            "a one-rank DDP world" if params.get("one_rank_ddp") else "single process" if size == 1 else f"{size} ranks"
        )
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
            hash_seeds=hash_seeds(size),
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
    """The :class:`Worlds` of one audit, in this order:

    1. the user's single process (``Trainer(devices=1)``, Lightning's default strategy, no process group) and the
       W=N world;
    2. where either stage raised, the one-rank DDP world (``Trainer(strategy="ddp")`` at W=1): it tells DDP's wrap
       from more than one rank, and where the single process raised and it did not (code that needs a process
       group) it is the reference the values are compared with;
    3. after a ``fit`` whose trained weights differ between the two, W=1 validating the weights the W=N run trained;
       and one process stepping once on the W=N ranks' first batches;
    4. the proving runs (:func:`_proving`), where a row's verdict rests on them.
    """
    root = tempfile.mkdtemp(prefix="ddpprobe-audit-")
    try:
        process = run_one(params, 1, root, settings, progress)
        world = run_one(params, world_size, root, settings, progress)
        one_rank = None
        if _raised(process) or _raised(world) or world.error:
            one_rank = _optional(
                {**params, "one_rank_ddp": True}, 1, root, settings, progress, " of DDP: DDP's wrap, one rank"
            )
        single, reference = process, params
        if _raised(process) and one_rank is not None and not _raised(one_rank):
            single, reference = one_rank, {**params, "one_rank_ddp": True}
        same = None
        apart = Worlds(single, world, stage=params["stage"]).trained_apart
        if params["stage"] == "fit" and apart and world.weights and _validates(world):
            same = run_one(
                {**reference, "stage": "validate", "weights": world.weights},
                1,
                root,
                settings,
                progress,
                " validating the weights the W=N fit trained",
            )
        first_step = _first_step(reference, world, root, settings, progress) if params["stage"] == "fit" else None
        worlds = Worlds(
            single,
            world,
            same,
            params["stage"],
            params["limit_batches"],
            first_step=first_step,
            process=process if single is not process else None,
            one_rank_ddp=one_rank,
        )
        return _proving(worlds, params, reference, root, settings, progress)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _raised(world: World) -> bool:
    return any(record.get("raised") for record in world.records)


def _optional(params: dict, size: int, root: str, settings, progress, what: str) -> Optional[World]:
    """:func:`run_one`, or None where that world failed (a proving or second reference run is evidence, not the
    user's run: its failure takes no verdict down)."""
    from ddpprobe.launch import WorldError

    try:
        found = run_one(params, size, root, settings, progress, what)
    except WorldError:
        return None
    return None if found.error else found


def _proving(worlds: Worlds, params: dict, reference: dict, root: str, settings, progress) -> Worlds:
    """``worlds`` with the proving runs (ddpprobe/audit/worlds/_partitions.py, ddpprobe/audit/causes/_proven.py)
    added where a verdict of a ``validate`` or ``test`` whose W=N world completed rests on them: the second split
    where an epoch value is "synced, equals single-process" or the mean of rank-local values equals it; one
    process on the ranks' padded samples, and the second split too, where the ranks ran repeats and a value differs
    (the repeats are the whole difference only where the value does not move with the split either)."""
    if params["stage"] not in ("validate", "test") or not worlds.completed or worlds.world.error:
        return worlds
    found = rows(worlds)
    epoch = [r for r in found if r.level == "epoch"]
    claims = [
        r
        for r in epoch
        if r.verdict == SYNCED_EQUAL or (r.verdict == RANK_DIVERGENT and "rank_local_mean" in r.hazards)
    ]
    counts = worlds.counts.get(STAGE_LOOP[params["stage"]])
    repeats = counts is not None and counts.identified and counts.duplicates and not counts.unsharded
    differ = [r for r in epoch if r.problem and r.verdict in (SYNCED_DIFFERS, RANK_DIVERGENT)]
    partition = padded = None
    if claims or (repeats and differ):
        partition = _optional(
            {**params, "sampler_order": "blocks"},
            worlds.world_size,
            root,
            settings,
            progress,
            ", each rank a contiguous block of the same samples: equal under a second split?",
        )
    if repeats and differ:
        padded = _optional(
            {**reference, "sampler_order": f"padded:{worlds.world_size}"},
            1,
            root,
            settings,
            progress,
            " on the ranks' samples, repeats included: what do the repeats explain?",
        )
    return dataclasses.replace(worlds, partition=partition, padded=padded)


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
        references=_references(worlds),
    )
    # A key the ranks' divergence took down is its consequence: the divergence's note carries the fix.
    if weights_apart(result.contract) is not None:
        result = dataclasses.replace(result, rows=[_explained_by_contract(result, r) for r in result.rows])
    states = (world.traces[0].get("states") or []) if world.traces else []
    result = dataclasses.replace(result, contract=fed_by_monitored_keys(result.contract, states, result.rows))
    consequences = set(result.consequence_keys)
    rows_ = [dataclasses.replace(r, fixes=[], hazards=[]) if r.key in consequences else r for r in result.rows]
    return dataclasses.replace(result, rows=rows_)


def _explained_by_contract(result: AuditResult, row):
    """A synced key's row whose value differs where the ranks held different parameters, buffers or datasets for
    its loop (the contract's break): that break is its cause. A key nothing synced keeps its own cause (its ranks'
    values differ anyway), but for the conclusion "not a per-sample mean", which assumes the ranks' weights are one
    process's; a key of another loop than the dataset that differs keeps its own cause."""
    if not (row.problem and row.verdict in (RANK_DIVERGENT, SYNCED_DIFFERS) and row.level != "step"):
        return row
    # An unsynced key keeps its own cause, but for "not a per-sample mean": that conclusion compares the ranks' values
    # with one process on the same weights, which ranks holding other parameters do not have.
    unsynced_claim = not (row.sync_dist or row.metric_object) and "rank_local_metric" in row.hazards
    if not (row.sync_dist or row.metric_object) and not unsynced_claim:
        return row
    apart = weights_apart(result.contract, loader_kind(row.hooks[0], result.stage) if row.hooks else None)
    if apart is None:
        return row
    evidence = {**(row.evidence or {}), CONTRACT_BREAK: apart["field"]}
    cause = apart_cause(apart)
    if unsynced_claim:
        cause = f"each rank keeps its own value; the logger writes rank 0's value only; {cause}"
    return dataclasses.replace(row, cause=cause, fixes=[], hazards=[], evidence=evidence)


def _short(raised: Optional[dict]) -> Optional[dict]:
    return {"type": raised["type"], "message": raised["message"]} if raised else None


def _references(worlds: Worlds) -> dict:
    """What the W=N run was compared with (``AuditResult.references``)."""
    process = worlds.process or worlds.single
    one = worlds.one_rank_ddp
    proof = worlds.proof
    return {
        "compared_with": "one-rank DDP world" if worlds.process is not None else "single process",
        "single_process_raised": _short(process.records[0].get("raised")),
        "one_rank_ddp": None if one is None else {"raised": _short(one.records[0].get("raised"))},
        "proving": [
            name for name, ran in (("another split", proof.partition), ("padded samples", proof.padded)) if ran
        ],
        "raised_batches": _raised_batches(worlds, process),
    }


def _raised_batches(worlds: Worlds, process) -> list:
    """``[{"rank", "stage", "size", "single_sizes"}]``: for each W=N rank whose stage raised, the last batch it
    started (its loop and sample count) and the sizes of the single process's batches of that loop (the sanity
    check's left out): what the rank's batch had that no batch of one process had is read from them."""
    out = []
    single = [b for b in process.traces[0].get("batches") or [] if not b.get("sanity")] if process.traces else []
    for rank, (record, trace) in enumerate(zip(worlds.world.records, worlds.world.traces)):
        if not record.get("raised"):
            continue
        batches = [b for b in trace.get("batches") or [] if b.get("size") is not None]
        if not batches:
            continue
        last = batches[-1]
        sizes = sorted({b["size"] for b in single if b.get("stage") == last.get("stage") and b.get("size") is not None})
        out.append({"rank": rank, "stage": last.get("stage"), "size": last["size"], "single_sizes": sizes})
    return out


def _weights(worlds: Worlds) -> dict:
    return {
        "trained_apart": worlds.trained_apart,
        "steps": worlds.steps,
        "same_weights": worlds.same_weights is not None,
    }

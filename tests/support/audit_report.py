"""Checks that one audit report does not contradict itself, and a guarded run of any module (for the tests of
the audit's and the guard's explanations, tests/tooling/audit/test_audit_forms.py and test_audit_registry.py).

:func:`contradictions` reads an :class:`~ddpprobe.audit.AuditResult` and its text and returns every pair of
statements that cannot both hold, each checked against the recorded quantity it is about (the counts, the
trace, the rows, the registry); :func:`guarded_stage` runs a module's stage under ``CollectiveGuard`` in a
rank, so the same module the audit ran can be checked under the guard.
"""

from __future__ import annotations

from typing import Optional

from ddpprobe import hazards


def _texts(result) -> list:
    """Every cause the report prints: the rows', the logger rows', the divergence's explanation."""
    out = [row.cause for row in result.rows if row.cause]
    out += [r["cause"] for r in result.experiment_rows if r.get("cause")]
    diagnosis = ((result.trace or {}).get("first_divergence") or {}).get("diagnosis") or {}
    if diagnosis.get("explanation"):
        out.append(diagnosis["explanation"])
    return out


def _user_collective_hooks(result) -> set:
    """Hooks in which some W=N rank ran a collective of the module's own (the trace's ``source == "user"``)."""
    return {
        c.get("hook")
        for rank in (result.trace or {}).get("ranks", [])
        for c in rank["collectives"]
        if c.get("source") == "user"
    }


def contradictions(result) -> list:
    """The statements of ``result``'s report that contradict a recorded quantity or another statement."""
    found = []
    text = " ".join(result.format().split())
    causes = _texts(result)
    for kind, info in result.counts.items():
        if info.get("missing_vs_single") and any("no repeated or unsharded samples" in c for c in causes):
            found.append(f"{kind}: {info['missing_vs_single']} samples ran on no rank, yet a cause finds none")
        if (
            info.get("identified")
            and not info.get("duplicates")
            and any(c.startswith("repeated samples") for c in causes)
        ):
            found.append(f"{kind}: no sample ran twice, yet a cause names repeated samples")
        if info.get("duplicates") and "no sample ran twice" in text:
            found.append(f"{kind}: {info['duplicates']} repeats, yet the report says no sample ran twice")
    hooks = _user_collective_hooks(result)
    for row in result.rows:
        if "no rank ran a collective in its hook" in row.cause and set(row.hooks) & hooks:
            found.append(f"{row.key}: 'no rank ran a collective' in {row.hooks}, but the trace holds one there")
        if not row.problem and (row.fixes or row.hazards):
            found.append(f"{row.key}: a fix or hazard on a row that is not a problem")
        if row.cause.startswith("unknown") and row.hazards:
            found.append(f"{row.key}: the cause is unknown, yet the row names {row.hazards}")
        for name in row.fixes:
            if not hazards.HAZARDS[name].applies(row.evidence):
                found.append(f"{row.key}: the fix of {name!r} is printed although its preconditions do not hold")
    diagnosis = ((result.trace or {}).get("first_divergence") or {}).get("diagnosis") or {}
    if "the count follows the data" in (diagnosis.get("explanation") or ""):
        lengths = (diagnosis.get("evidence") or {}).get("batches per shard")
        if not lengths or len(set(lengths)) < 2:
            found.append(f"'the count follows the data' with shards of {lengths} batches")
    for name in diagnosis.get("fixes") or []:
        if not hazards.HAZARDS[name].applies(diagnosis.get("evidence") or {}):
            found.append(f"the divergence's fix {name!r} is printed although its preconditions do not hold")
    findings = result.findings
    if text.count(" problem(s), exit code 1") and f"{len(findings)} problem(s), exit code 1" not in text:
        found.append(f"the outcome does not count the {len(findings)} root causes")
    consequences = set(result.consequence_keys)
    for row in result.rows:
        if row.key in consequences and set(row.fixes) - set(diagnosis.get("fixes") or []):
            found.append(f"{row.key}: a consequence of the divergence carries a fix the divergence does not")
    return found


def guarded_stage(
    info, model_ref: str, data_ref: Optional[str], stage: str = "validate", guard_timeout: float = 5.0
) -> dict:
    """Scenario: ``model_ref()`` run for ``stage`` on ``data_ref()`` (None: the module's own dataloaders) with
    ``CollectiveGuard(timeout=guard_timeout)`` (the factories as the audit takes them, ``"module:function"``).
    Record: ``callback_metrics``, ``checks``."""
    from ddpprobe.audit.worlds._inputs import resolve_ref
    from ddpprobe.audit.worlds._loaders import as_loaders
    from ddpprobe.guard import CollectiveGuard
    from ddpprobe.probes.common import ddp_trainer, floats, seed_everything

    seed_everything(0)
    model = resolve_ref(model_ref)()
    loaders = as_loaders(resolve_ref(data_ref)() if data_ref else None, stage)
    guard = CollectiveGuard(timeout=guard_timeout)
    trainer = ddp_trainer(info, callbacks=[guard], max_epochs=1)
    if stage == "fit":
        trainer.fit(model, **loaders)
    else:
        getattr(trainer, stage)(model, verbose=False, **loaders)
    return {"callback_metrics": floats(trainer.callback_metrics), "checks": guard.checks}

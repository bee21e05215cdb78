"""The audit's reading of the DDP contract (ddpprobe/contract/): the state fields that must be equal on every rank
and are not (the first is a problem of its own, later ones follow it), and the first optimizer step against one
process on the same samples. Pure Python on the worlds' ``state`` records; the report's section is
:func:`contract_section`."""

from __future__ import annotations

from typing import Optional

from ddpprobe import hazards
from ddpprobe.audit.causes._files import file_findings, file_lines
from ddpprobe.audit.causes._kinds import RANK_DIVERGENT
from ddpprobe.audit.evidence._files import written_files
from ddpprobe.contract import (
    MISSING,
    SINGLE_PROCESS_SCHEDULE,
    SINGLE_PROCESS_STEP,
    aligned,
    breaks,
    compare_first_step,
    show,
)


def hooks_before(traces: list, states0: list, position: int) -> list:
    """``[{"hook", "ranks", "runs_on", "fact"}]``: the hooks some W=N ranks entered and the others never did, first
    entered before rank 0's record at ``position`` was taken (what ran on some ranks only just before a field first
    differed; ``runs_on`` and ``fact`` from the registry of who runs a hook, else None)."""
    from ddpprobe.audit.evidence._hooks import entered_by_some, who_runs

    when = states0[position].get("t") if 0 <= position < len(states0) else None
    if when is None:
        return []
    out = []
    for hook, ranks in entered_by_some(traces):
        times = [(traces[r].get("hook_times") or {}).get(hook) for r in ranks]
        if any(t is None or t > when for t in times):
            continue
        runs_on, fact = who_runs(hook)
        out.append({"hook": hook, "ranks": ranks, "runs_on": runs_on, "fact": fact})
    return out


def _unset_elsewhere(item: dict, hook: dict) -> bool:
    """The ranks that did not run ``hook`` hold no value of the field (None, or no such field): what they lack may
    be what the hook set on the others."""
    return all(v in (None, MISSING) for r, v in enumerate(item["per_rank"]) if r not in hook["ranks"])


def _after_hooks_text(item: dict) -> str:
    parts = []
    for h in item.get("after_hooks") or []:
        who = f": {h['runs_on']} (shown by {h['fact']})" if h["runs_on"] else ""
        parts.append(f"before this record only rank(s) {h['ranks']} ran {h['hook']}{who}")
    return "; ".join(parts)


def _accumulates(world0: list) -> str:
    """Why the first step is not comparable where each rank accumulates gradients over several batches before it
    (the reference steps on one batch a rank), or ""."""
    start = next((r for r in world0 if r.get("boundary") == "train_start"), None)
    k = (start or {}).get("fields", {}).get("trainer.accumulate_grad_batches")
    if isinstance(k, int) and k > 1:
        return f"each rank accumulates {k} batches before its first optimizer step; the reference steps on one a rank"
    return ""


#: The fields the first step's gradient depends on beside the weights and the samples: the module's attributes.
_STEP_INPUTS = ("module.attr.",)


def _state_before_step(reference: list, world0: list) -> str:
    """Why the one-process reference's first step is not the ranks' own step on other samples: a module attribute
    that differs between the reference and rank 0 just before the step (the ``train_start`` records: an attribute
    the module computed from the loader it was given, say), as a sentence; "" where none differs."""
    ref = next((r for r in reference if r.get("boundary") == "train_start"), None)
    own = next((r for r in world0 if r.get("boundary") == "train_start"), None)
    if ref is None or own is None:
        return ""
    for path in sorted(set(ref["fields"]) & set(own["fields"])):
        if path.startswith(_STEP_INPUTS) and ref["fields"][path] != own["fields"][path]:
            return (
                f"the one-process reference held another {path} before its step ({show(ref['fields'][path])}, rank 0 "
                f"{show(own['fields'][path])}): the module computed it from what the run gave it, so the two steps "
                "are not the same step on other samples"
            )
    return ""


def _first_step_record(states: list) -> Optional[dict]:
    return next((s for s in states if s.get("boundary") == "first_step"), None)


def contract_evidence(worlds) -> dict:
    """``{"world_size", "schedules", "recorded", "records", "hooks", "breaks", "first_step", "files"}`` of an audit's
    worlds (``files``: ddpprobe/audit/evidence/_files.py ``written_files``):
    the LR schedules whose length stands otherwise to the steps taken than in one process (:func:`schedule_lengths`,
    a ``fit`` only), whether every W=N rank
    recorded its state, how many records rank 0 took and after which hooks the first and the last,
    the :func:`~ddpprobe.contract.breaks` of the W=N ranks (as dicts), and for a ``fit`` the first step's
    comparison with the one-process reference (:class:`~ddpprobe.contract.FirstStep` as a dict; None when no
    reference ran)."""
    states = [
        [s for s in trace.get("states") or [] if s.get("boundary") != "first_step"] for trace in worlds.world.traces
    ]
    recorded = bool(states) and all(states)
    first_step = None
    if worlds.first_step is not None:
        world_first = _first_step_record(worlds.world.traces[0].get("states") or [])
        single_first = _first_step_record(worlds.first_step.traces[0].get("states") or [])
        first_step = compare_first_step(world_first, single_first, worlds.world_size).to_dict()
        if first_step["status"] in ("differs", "scaled"):
            other = _accumulates(states[0]) or _state_before_step(
                worlds.first_step.traces[0].get("states") or [], states[0]
            )
            if other:
                first_step.update(status="not comparable", reason=other)
        raised = (worlds.first_step.records[0] or {}).get("raised")
        if first_step["status"] == "not recorded" and single_first is None and raised:
            message = " ".join(str(raised.get("message", "")).split())[:160]
            first_step["reason"] = (
                f"the one-process reference run (one step on the ranks' first batches, without the data factory's "
                f"datamodule) raised {raised.get('type')}: {message}"
            )
        first_step["reference_samples"] = worlds.first_step_samples
    schedules = []
    if worlds.stage == "fit" and recorded:
        single_states = worlds.single.traces[0].get("states") or []
        schedules = schedule_lengths(single_states, states[0]) + schedules_by_step_count(single_states, states[0])
    found = [b.to_dict() for b in breaks(states)] if recorded else []
    at = dict(aligned(states)) if found else {}
    for item in found:
        records = at.get(item["position"]) or []
        sites = [(r.get("writers") or {}).get(item["field"]) for r in records]
        item["written_at"] = sites if any(sites) else None
        if not item["root"]:
            before = hooks_before(worlds.world.traces, states[0], item["position"])
            item["after_hooks"] = [h for h in before if _unset_elsewhere(item, h)]
    return {
        "world_size": worlds.world_size,
        "schedules": schedules,
        "recorded": recorded,
        "records": len(states[0]) if states else 0,
        "hooks": [states[0][0].get("hook"), states[0][-1].get("hook")] if recorded else [],
        "breaks": found,
        "first_step": first_step,
        "files": written_files(worlds.single.traces, worlds.world.traces),
    }


#: A scheduler's planned length, by the name its ``state_dict`` gives it (OneCycleLR, CosineAnnealingLR, LinearLR and
#: PolynomialLR, ConstantLR).
PLANNED_LENGTH = ("total_steps", "T_max", "total_iters")


def _planned_and_taken(states: list) -> dict:
    """``{scheduler field: (planned length, optimizer steps taken)}`` from a run's last record."""
    last = next((r for r in reversed(states) if r.get("boundary") != "first_step"), None)
    if last is None:
        return {}
    fields = last.get("fields") or {}
    steps, epochs = fields.get("trainer.global_step"), fields.get("trainer.current_epoch")
    out = {}
    for path, value in fields.items():
        if not (path.startswith("scheduler[") and path.rsplit(".", 1)[-1] in PLANNED_LENGTH):
            continue
        per_epoch = fields.get(path.split(".", 1)[0] + ".interval") == "epoch"
        taken = (epochs + 1 if isinstance(epochs, int) else None) if per_epoch else steps
        if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(taken, int) and taken > 0:
            out[path] = (value, taken)
    return out


def schedule_lengths(single_states: list, world_states: list) -> list:
    """``[{"field", "single", "world"}]``: each LR scheduler whose planned length (``PLANNED_LENGTH``) stands to the
    optimizer steps taken otherwise at W=N (rank 0) than in one process, with ``[planned, taken]`` of each run: a
    schedule one process runs to its end that the ranks stop part way through (or run past)."""
    one, world = _planned_and_taken(single_states), _planned_and_taken(world_states)
    out = []
    for field in sorted(set(one) & set(world)):
        (p1, t1), (pn, tn) = one[field], world[field]
        # A schedule both runs finish (a warm-up) or both stop part way through at one fraction is no difference.
        if (t1 >= p1) != (tn >= pn) or (t1 < p1 and abs(t1 / p1 - tn / pn) > 1e-6):
            out.append({"field": field, "single": [p1, t1], "world": [pn, tn]})
    return out


def _step_schedules(states: list) -> dict:
    """``{scheduler index: [(scheduler steps, last lr list)]}`` at each ``train_batch_end`` record of a run, for the
    schedulers stepped per optimizer step that name no planned length (a ``LambdaLR``, a ``StepLR``)."""
    out: dict = {}
    for record in states:
        if record.get("boundary") != "train_batch_end":
            continue
        fields = record.get("fields") or {}
        for path, value in fields.items():
            if not (path.startswith("scheduler[") and path.endswith("._last_lr")):
                continue
            index = path.split(".", 1)[0]
            if fields.get(f"{index}.interval") != "step" or any(f"{index}.{k}" in fields for k in PLANNED_LENGTH):
                continue
            steps = fields.get(f"{index}.last_epoch")
            if isinstance(steps, int) and isinstance(value, list):
                out.setdefault(index, []).append((steps, value))
    return out


def schedules_by_step_count(single_states: list, world_states: list) -> list:
    """``[{"field", "kind": "steps", "single", "world", "single_at"}]``: each scheduler stepped per optimizer step
    whose learning rate, at the end of the ranks' run, is the one one process had after the same number of steps,
    while one process, taking more steps, ends at another: the schedule follows the step count alone (it was sized
    by something other than the steps the ranks take, as the module's own loader's length), so the ranks stop part
    way along it. ``single``/``world``: ``[last lr, steps]``; ``single_at``: one process's lr at the ranks' count."""
    one, world = _step_schedules(single_states), _step_schedules(world_states)
    out = []
    for index in sorted(set(one) & set(world)):
        steps_n, lr_n = world[index][-1]
        steps_1, lr_1 = one[index][-1]
        at = next((lr for steps, lr in one[index] if steps == steps_n), None)
        if at is None or steps_n >= steps_1 or lr_n != at or lr_1 == lr_n:
            continue
        out.append(
            {
                "field": f"{index}._last_lr",
                "kind": "steps",
                "single": [lr_1, steps_1],
                "world": [lr_n, steps_n],
                "single_at": at,
            }
        )
    return out


def schedule_text(item: dict, world_size: int) -> str:
    """``"scheduler[0].total_steps plans 4 steps where each rank takes 2; one process plans 4 and takes 4"``."""
    if item.get("kind") == "steps":
        (l1, s1), (ln, sn) = item["single"], item["world"]
        return (
            f"note: {item['field']} ends each of the {world_size} ranks' runs at {show(ln)} after {sn} scheduler "
            f"steps, where one process takes {s1} and ends at {show(l1)}; after {sn} steps one process's was "
            f"{show(item['single_at'])} too: the schedule follows the step count alone, so each rank, taking 1/W of "
            "one process's steps, ends where one process stands after that many; a schedule meant to end with the "
            "run is sized by the steps each rank takes (trainer.estimated_stepping_batches)"
        )
    (p1, t1), (pn, tn) = item["single"], item["world"]
    return (
        f"{item['field']} plans {pn:g} steps where each of the {world_size} ranks takes {tn}; one process plans {p1:g} "
        f"and takes {t1}: the ranks' schedule ends at {tn / pn:.0%} of its length, one process's at {t1 / p1:.0%}"
    )


def _per_rank(values: list) -> str:
    shown = [show(v) for v in values]
    if len(set(shown)) == 1 and any(v != values[0] for v in values):
        shown = [repr(v) for v in values]  # values that differ beyond the digits show() prints
    return ", ".join(f"rank {r} {s}" for r, s in enumerate(shown))


def _where(item: dict) -> str:
    step = f", step {item['step']}" if item.get("step") is not None else ""
    return f"{item['hook']} (epoch {item.get('epoch')}{step})"


def break_text(item: dict) -> str:
    """``"<field> differs between the ranks from <hook> (epoch e, step s): rank 0 .., rank 1 ..; last set at <line>"``
    (the last clause where the trace saw the user's code set the field: :func:`written_text`)."""
    hooks = "".join(f" (only rank(s) {h['ranks']} ran {h['hook']} before it)" for h in item.get("after_hooks") or [])
    text = f"{item['field']} differs between the ranks from {_where(item)}{hooks}: {_per_rank(item['per_rank'])}"
    written = written_text(item.get("written_at"))
    text = f"{text}; {written}" if written else text
    fed = item.get("fed_by")
    if fed:
        text += (
            f"; {fed['scheduler']} monitors {fed['key']!r}, which each rank holds for itself ({RANK_DIVERGENT}: see "
            "its row), so each rank steps its schedule on its own value; the key's fix mends this field too"
        )
    return text + _set_in_a_hook_some_ranks_run(item.get("written_at"))


def _set_in_a_hook_some_ranks_run(sites: Optional[list]) -> str:
    """Where the ranks that set the field set it in one hook Lightning runs on some ranks only (:data:`WHO_RUNS`,
    each with its fact) and the other ranks did not set it: that hook's participation, as the cause."""
    from ddpprobe.audit.evidence._hooks import WHO_RUNS

    if not sites or all(sites) or not any(sites):
        return ""
    hooks = {str(site).rpartition(" in ")[2] for site in sites if site}
    if len(hooks) != 1 or next(iter(hooks)) not in WHO_RUNS:
        return ""
    hook = next(iter(hooks))
    runs_on, fact = WHO_RUNS[hook]
    ranks = [r for r, site in enumerate(sites) if site]
    return (
        f"; it is set in {hook}, and {runs_on} (shown by {fact}): what {hook} sets exists on rank(s) {ranks} alone, "
        "every other rank keeps what it had"
    )


def written_text(sites: Optional[list]) -> str:
    """``"last set at m.py:12 in setup on every rank"``, or per rank where they differ (``"rank 1: not by code the
    trace saw"``), or "" where the trace saw no set (ddpprobe/trace/_writers.py)."""
    if not sites or not any(sites):
        return ""
    if len(set(sites)) == 1:
        return f"last set at {sites[0]} on every rank"
    parts = [f"rank {r} at {s}" if s else f"rank {r} not by code the trace saw" for r, s in enumerate(sites)]
    return "last set: " + ", ".join(parts)


def first_step_text(first: dict) -> Optional[str]:
    """The problem sentence of a first step that is not one process's, else None."""
    w = first["world_size"]
    if first["status"] == "scaled":
        relation = (
            f" (1/W = {1 / w:.6g}: what a loss summed over the batch instead of averaged gives)"
            if abs(first["ratio"] * w - 1) < 1e-3
            else ""
        )
        return (
            f"the first optimizer step's gradient is {first['ratio']:.6g} times that of one process on the same "
            f"{first.get('reference_samples') or 'W*b'} samples, on every parameter{relation}"
        )
    if first["status"] == "differs":
        names = ", ".join(first["parameters"][:6]) + (" ..." if len(first["parameters"]) > 6 else "")
        return (
            f"the first optimizer step's gradient differs from one process's on the same "
            f"{first.get('reference_samples') or 'W*b'} samples for {names}"
        )
    return None


def contract_findings(contract: dict) -> list:
    """``[{"problem", "consequences"}]``: the first break(s) with the later breaks under them, then the first
    step when it is not one process's, then the files that do not hold what one process writes."""
    items = contract.get("breaks") or []
    roots = [b for b in items if not b.get("root")]
    later = [b for b in items if b.get("root")]
    out = []
    for i, root in enumerate(roots):
        under = [f"then {break_text(b)}" for b in later] if i == 0 else []
        out.append({"problem": break_text(root), "consequences": under})
    size = (contract.get("first_step") or {}).get("world_size") or contract.get("world_size") or 0
    if not roots:
        out += [
            {"problem": schedule_text(t, size), "consequences": []}
            for t in contract.get("schedules") or []
            if t.get("kind") != "steps"  # a note: nothing shows the schedule was meant to end with the run
        ]
    text = first_step_text(contract.get("first_step") or {}) if contract.get("first_step") else None
    if text and out and roots and _before_first_step(roots[0]):
        out[0]["consequences"].append(f"then {text}")
    elif text:
        out.append({"problem": text, "consequences": []})
    return out + file_findings(contract.get("files") or [])


def _before_first_step(item: dict) -> bool:
    """The break was recorded before the first optimizer step (its step is 0), so the first step ran on state the
    contract already did not hold: its difference from one process may follow from it."""
    return item.get("step") in (0, None)


def _row_lines(item: dict) -> list:
    facts = "; ".join(item["facts"])
    hooks = _after_hooks_text(item)
    fed = item.get("fed_by") or {}
    fixes = [line for name in fed.get("fixes") or [] for line in hazards.advice(name, fed.get("evidence") or {})]
    return [
        *([hooks[0].upper() + hooks[1:]] if hooks else []),
        f"The contract ({item['row']}): {item['rule']} at this boundary; {item['keeps_it']} (shown by {facts})",
        *(fixes or [f"{hazards.NO_FIX}: no registry entry's evidence holds for this field"]),
    ]


def fed_by_monitored_keys(contract: dict, states: list, rows: list) -> dict:
    """``contract`` with each break of an optimizer or scheduler field given ``fed_by``
    ``{"scheduler", "key", "fixes", "evidence"}`` where a scheduler of the ranks' last record monitors a key whose
    row is a rank-local problem (each rank holds its own value): Lightning steps each rank's scheduler on that rank's
    value of the key (pytorch_lightning/core/module.py ``lr_scheduler_step``, with ``monitor``), so the key's own fix
    is the field's."""
    last = next((r for r in reversed(states or []) if r.get("fields")), None)
    fields = (last or {}).get("fields") or {}
    monitors = {path.split(".", 1)[0]: value for path, value in fields.items() if path.endswith(".monitor") and value}
    problems = {r.key: r for r in rows if r.problem and r.level == "epoch" and r.verdict == RANK_DIVERGENT}
    for item in contract.get("breaks") or []:
        if not str(item.get("field", "")).startswith(("optimizer[", "scheduler[")):
            continue
        for scheduler, key in monitors.items():
            row = problems.get(key)
            if row is not None:
                item["fed_by"] = {"scheduler": scheduler, "key": key, "fixes": row.fixes, "evidence": row.evidence}
                break
    return contract


def contract_lines(contract: dict) -> list:
    """The report's lines on the contract (each a sentence; the caller wraps and indents them)."""
    lines = []
    items = contract.get("breaks") or []
    for item in items:
        if item.get("root"):
            lines.append(("", f"then {break_text(item)}; it came after {item['root']} differed"))
        else:
            lines.append(("", break_text(item)))
            lines += [("  ", text) for text in _row_lines(item)]
    if contract.get("recorded") and not items:
        lines.append(("", f"every field the contract says must be equal was equal on every rank ({_span(contract)})"))
    size = contract.get("world_size") or 0
    for item in contract.get("schedules") or []:
        lines.append(("", schedule_text(item, size)))
        lines.append(("  ", SINGLE_PROCESS_SCHEDULE.shown()))
        if item.get("kind") != "steps":
            lines.append(("  ", f"{hazards.NO_FIX}: no registry entry's evidence holds for this field"))
    first = contract.get("first_step")
    roots = [b for b in items if not b.get("root")]
    if first:
        text = first_step_text(first)
        if text and roots and _before_first_step(roots[0]):
            lines.append(("", f"then {text}; it came after {roots[0]['field']} differed"))
        elif text:
            lines.append(("", text))
            lines.append(("  ", SINGLE_PROCESS_STEP.shown()))
        elif first["status"] == "equal":
            lines.append(("", "the first optimizer step's gradient equals one process's on the same samples"))
        else:
            lines.append(("", f"the first optimizer step was not compared with one process: {first['reason']}"))
    return lines + file_lines(contract.get("files") or [])


def _span(contract: dict) -> str:
    hooks = contract.get("hooks") or []
    if not hooks:
        return "no record"
    return f"{contract.get('records')} records, from {hooks[0]} to {hooks[-1]}"


#: The evidence name under which a key's row holds the contract field whose break explains it (:func:`apart_cause`).
CONTRACT_BREAK = "contract break"

#: The contract rows whose fields feed every value a rank computes: when they differ, so may any logged value.
FEEDS_VALUES = ("parameters", "buffers", "datasets")
#: The boundaries before any batch ran (ddpprobe/contract/ ``BOUNDARIES``): a module attribute apart there was set
#: apart by the ranks' own construction, not by outputs a batch left.
BEFORE_BATCHES = ("setup", "start")


def weights_apart(contract: dict, loop: Optional[str] = None) -> Optional[dict]:
    """The first break of a field that feeds the values a rank computes (:data:`FEEDS_VALUES`), or None: its
    parameters or buffers, the dataset of ``loop`` (``"val"``, ``"train"`` ...; any loop's where None), or a module
    attribute that already differed before any batch ran (:data:`BEFORE_BATCHES`: a feature map drawn per rank)."""

    def feeds(b: dict) -> bool:
        if b["row"] == "module attributes":
            # Set apart before any batch ran (at setup or the stage's start): what the module computes from it differs.
            return b.get("boundary") in BEFORE_BATCHES
        if b["row"] != "datasets":
            return b["row"] in FEEDS_VALUES
        return loop is None or b["field"].startswith(f"loader.{loop}[")

    return next((b for b in contract.get("breaks") or [] if feeds(b)), None)


def apart_cause(item: dict) -> str:
    """A key row's cause where the ranks held different parameters, buffers or datasets (:func:`weights_apart`)."""
    return (
        f"the ranks held different {item['row']} from {_where(item)} on ({item['field']}; see the DDP "
        "contract), so their values also differ for that reason and no sync of them would be the single process's; "
        "mend the contract's first break first"
    )

# ruff: noqa: E501 - a fact test's name states the fact, and the table cites them whole
"""Collectives made in a hook some ranks never entered (the trace's ``hook`` events, ddpprobe/trace/_hooks.py): the
ranks that did not enter it never make that collective, so the ranks that did wait for partners that never come.
Which ranks Lightning runs a hook on is stated only where a fact shows it (:data:`WHO_RUNS`). Pure Python on the
W=N ranks' split traces."""

from __future__ import annotations

F = "tests/facts/"

#: ``{hook: (which ranks Lightning runs it on, the fact that shows it)}``.
WHO_RUNS = {
    "prepare_data": (
        "Lightning runs prepare_data on local rank 0 of each node (prepare_data_per_node=True, the default), or on "
        "global rank 0 only",
        F + "test_multinode.py::test_prepare_data_runs_on_local_rank_zero_of_every_node_or_on_global_rank_zero_only",
    ),
}


def _went_past(trace: dict, after) -> bool:
    """The rank entered some hook after time ``after``, or finished its stage: its not entering a hook then is not
    for having stopped before it."""
    if trace.get("stage") == "end":
        return True
    return after is not None and any(t is not None and t > after for t in (trace.get("hook_times") or {}).values())


def entered_by_some(traces: list) -> list:
    """``[(hook, ranks)]``: each hook some W=N ranks entered and the others never did, with the ranks that entered it,
    in the hooks' alphabetical order."""
    hooks = sorted(set().union(*((t.get("hooks") or {}) for t in traces))) if traces else []
    out = []
    for hook in hooks:
        ranks = [r for r, t in enumerate(traces) if hook in (t.get("hooks") or {})]
        if len(ranks) < len(traces):
            out.append((hook, ranks))
    return out


def who_runs(hook: str) -> tuple:
    """``(which ranks Lightning runs hook on, the fact that shows it)``, or ``(None, None)``: :data:`WHO_RUNS`."""
    return WHO_RUNS.get(hook, (None, None))


def collectives_in_hooks_some_ranks_skip(traces: list) -> list:
    """``[{"hook", "ranks", "collectives", "runs_on", "fact"}]``: each hook in which some rank made a collective and
    which some other rank, going past it, never entered; ``ranks`` the ranks that entered it, ``collectives``
    ``"op at call site"`` of the collectives made there, ``runs_on`` / ``fact`` from :data:`WHO_RUNS` (None when no
    fact shows who runs that hook)."""
    out = []
    for hook, ranks in entered_by_some(traces):
        first = min((traces[r].get("hook_times") or {}).get(hook) or 0 for r in ranks)
        skipped = [r for r in range(len(traces)) if r not in ranks]
        if not all(_went_past(traces[r], first) for r in skipped):
            continue
        made = [
            f"{c['op']} at {c.get('call_site') or c.get('origin') or 'an unknown line'}"
            for r in ranks
            for c in traces[r].get("collectives") or []
            if c.get("running") == hook
        ]
        if not made:
            continue
        runs_on, fact = who_runs(hook)
        out.append(
            {"hook": hook, "ranks": ranks, "collectives": list(dict.fromkeys(made)), "runs_on": runs_on, "fact": fact}
        )
    return out


def hook_text(item: dict) -> str:
    """The finding's sentence."""
    made = ", ".join(item["collectives"])
    who = (
        f"{item['runs_on']} (shown by {item['fact']})"
        if item["runs_on"]
        else "which ranks Lightning runs it on is shown by no fact here"
    )
    return (
        f"a collective ({made}) made in {item['hook']}, which only rank(s) {item['ranks']} entered: the other ranks "
        f"never make it; {who}"
    )

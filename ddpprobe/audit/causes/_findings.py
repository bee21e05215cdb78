"""The audit's problems grouped by root cause: where the ranks' collectives diverged (or the world failed), that
is one finding, and what it took down (the world's failure, errors raised in the collectives, keys left without
a value on some ranks, the key whose sync was the culprit) are listed under it as its consequences; every other
problem is a finding of its own. Pure Python, on an :class:`~ddpprobe.audit.AuditResult`."""

from __future__ import annotations

from ddpprobe.audit.causes._contract import CONTRACT_BREAK, contract_findings, weights_apart
from ddpprobe.audit.causes._files import file_hazards
from ddpprobe.audit.causes._kinds import NO_VALUE, NO_VALUE_ON_SOME, NOT_IN_WORLD, SOME_RANKS_ONLY
from ddpprobe.audit.evidence._hooks import hook_text

#: Verdicts a key gets because the stage did not complete on some ranks, not because of how it was logged.
CONSEQUENCE_VERDICTS = (NO_VALUE, NO_VALUE_ON_SOME, NOT_IN_WORLD)


def _row_text(row) -> str:
    return f"{row.key}{' (step values)' if row.level == 'step' else ''}: {row.verdict}"


def _diagnosis(result) -> dict:
    return ((result.trace or {}).get("first_divergence") or {}).get("diagnosis") or {}


def culprit_key(result):
    found = _diagnosis(result).get("culprit") or {}
    return (found.get("entry") or {}).get("key")


def consequence_keys(result) -> list:
    """The keys whose problem follows from the ranks' divergence or the world's failure: no value on the ranks
    that never finished, or logged on some ranks only because the others stopped first (no registry entry), or
    the key whose sync the divergence's culprit is."""
    if not ((result.trace or {}).get("first_divergence") or result.world_error or raised_groups(result)):
        return []
    culprit = culprit_key(result)
    out = []
    for row in result.rows:
        if not row.problem:
            continue
        if (
            row.verdict in CONSEQUENCE_VERDICTS
            or (row.verdict == SOME_RANKS_ONLY and not row.hazards)
            or (culprit and row.key == culprit)
        ):
            out.append(row.key)
    return list(dict.fromkeys(out))


def _raised(result) -> list:
    return [("W=1", result.raised["single"])] + [(f"rank {r}", i) for r, i in enumerate(result.raised["world"])]


def raised_groups(result) -> list:
    """``[(places, info)]``: the errors the stage raised, one entry per distinct error (type and message) with
    the places (``"W=1"``, ``"rank 0"`` ...) that raised it, in the order they first appear."""
    groups: dict = {}
    for where, info in _raised(result):
        if info:
            groups.setdefault((info["type"], info["message"]), ([], info))[0].append(where)
    return list(groups.values())


def findings(result) -> list:
    """``[{"problem": str, "consequences": [str]}]``: the root causes, the ranks' divergence (or the world's
    failure) first with what it took down, then every other problem. A collective made in a hook some ranks never
    entered (ddpprobe/audit/evidence/_hooks.py) comes before all: the divergence, the world's failure and the ranks'
    errors it explains are listed under it."""
    found = _findings(result)
    skipped = getattr(result, "skipped_hooks", None) or []
    if not skipped:
        return found
    heads = [{"problem": hook_text(item), "consequences": []} for item in skipped]
    rest = []
    for finding in found:
        text = finding["problem"]
        follows = text.startswith("the ranks' collectives diverge") or "world failed" in text
        follows = follows or (" stage raised " in text and "W=1" not in text)
        if follows:
            heads[0]["consequences"] += [text, *finding["consequences"]]
        else:
            rest.append(finding)
    return heads + rest


def _findings(result) -> list:
    divergence = (result.trace or {}).get("first_divergence")
    consequences_of = set(consequence_keys(result))
    root, under = None, []
    raised_root = None
    explanation = _diagnosis(result).get("explanation") or ""
    if divergence and "outside any collective" in explanation:
        raised_root = next((w for w, info in _raised(result) if info and w != "W=1"), None)
    first_error = (result.trace or {}).get("first_error")
    if first_error is not None:
        raised_root = f"rank {first_error['rank']}"
    groups = raised_groups(result)
    if not (divergence or result.world_error) and groups:
        raised_root = raised_root or groups[0][0][0]  # the stage's own error took the keys down: it is the root
        root = "(the stage's error)"
    if divergence or result.world_error:
        if divergence:
            root = f"the ranks' collectives diverge: {divergence['message']}"
        if result.world_error:
            failed = f"the {result.world_size}-rank world failed: {result.world_error['type']}"
            root, under = (root, [failed]) if root else (failed, [])
    out = []
    for row in result.rows:
        if not row.problem:
            continue
        if root and row.key in consequences_of:
            under.append(_row_text(row))
        else:
            out.append({"problem": _row_text(row), "consequences": []})
    tags = list(dict.fromkeys(f"{r['tag']}: {r['verdict']}" for r in result.experiment_rows if r["problem"]))
    out += [{"problem": f"logger.experiment {t}", "consequences": []} for t in tags]
    out += [
        {
            "problem": f"{c['callback']}(monitor={c['monitor']!r}) ended with different {', '.join(c['differs'])} "
            "on the ranks",
            "consequences": [],
        }
        for c in result.callbacks
        if c["differs"]
    ]
    for kind, info in result.counts.items():
        if result.stage == "predict" and kind == "predict" and info.get("identified") and not info.get("unsharded"):
            if info.get("duplicates") or info.get("missing_vs_single"):
                text = (
                    f"predict ran {info['duplicates']} repeated and {info['missing_vs_single'] or 0} missing "
                    "sample(s) compared with the single process"
                )
                out.append({"problem": text, "consequences": []})
        if info.get("unsharded"):
            text = (
                f"every rank ran all {info['samples'][0]} samples of the {kind} set (the data is not sharded: "
                "each rank repeats the others' work)"
            )
            out.append({"problem": text, "consequences": []})
    diagnosis_hazard = _diagnosis(result).get("hazard")
    for read in (result.trace or {}).get("lone_reads") or []:
        if diagnosis_hazard != "metrics_read_on_some_ranks":
            where = f" at {read['call_site']}" if read.get("call_site") else ""
            synced = f"the epoch sync of {read['key']!r}" if read.get("key") else "their epoch sync"
            out.append(
                {
                    "problem": f"rank(s) {read['ranks']} alone read the logged metrics{where}, running {synced} on "
                    "those ranks only",
                    "consequences": [],
                }
            )
    raised_findings, own = [], None
    for places, info in raised_groups(result):
        text = f"the {result.stage} stage raised {info['type']} ({', '.join(places)})"
        if raised_root in places:
            own = text
        elif root and "W=1" not in places:
            under.append(text)
        else:
            raised_findings.append(text)
    contract = contract_findings(getattr(result, "contract", None) or {})
    if contract and weights_apart(getattr(result, "contract", None) or {}):
        apart = _apart_keys(result)
        moved = [f for f in out if f["problem"].split(":")[0] in apart]
        for f in moved:
            field = apart[f["problem"].split(":")[0]]
            under = next((c for c in contract if c["problem"].startswith(f"{field} ")), contract[0])
            under["consequences"].append(f["problem"])
        out = [f for f in out if f not in moved]
    out = contract + out
    if root and own is not None:
        above = [root] if root != "(the stage's error)" else []
        return [{"problem": own, "consequences": [*above, *under]}, *out, *_plain(raised_findings)]
    head = [{"problem": root, "consequences": under}] if root else []
    return head + out + _plain(raised_findings)


def _apart_keys(result) -> set:
    """``{key: field}``: the keys whose cause is the ranks' different parameters, buffers or datasets, each with the
    contract field that broke (held in the row's evidence under ``CONTRACT_BREAK``)."""
    return {r.key: r.evidence[CONTRACT_BREAK] for r in result.rows if CONTRACT_BREAK in (r.evidence or {})}


def _plain(texts: list) -> list:
    return [{"problem": t, "consequences": []} for t in texts]


def named_hazards(result) -> list:
    """The registry entries (ddpprobe/hazards/) the report names as a cause, in the report's order: the
    divergence's, the problem rows' (a consequence of the divergence names none of its own), the logger rows',
    an unsharded set's, the callbacks' that ended apart, every rank printing, and ranks that wrote their own
    shares to one file path."""
    out = []
    diagnosis = _diagnosis(result)
    if diagnosis.get("hazard"):
        out.append(diagnosis["hazard"])
    for row in result.rows:
        out += row.hazards
    for row in result.experiment_rows:
        out += row.get("hazards") or [] if row["problem"] else []
    if (result.trace or {}).get("lone_reads"):
        out.append("metrics_read_on_some_ranks")
    if any(info.get("unsharded") for info in result.counts.values()):
        out.append("unsharded_data")
    if any(c["differs"] for c in result.callbacks):
        out.append("callbacks_rank_local")
    out += file_hazards((getattr(result, "contract", None) or {}).get("files") or [])
    world = result.stdout_lines.get("world") or []
    if world and all(world) and sum(world) > (result.stdout_lines.get("single") or [0])[0]:
        out.append("print_every_rank")
    return list(dict.fromkeys(out))

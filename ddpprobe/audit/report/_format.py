"""The plain-text report of an :class:`~ddpprobe.audit.AuditResult` (no dependency beyond Python)."""

from __future__ import annotations

import os
import textwrap

from ddpprobe import hazards

#: Past this many ranks the table shows min / max / distinct instead of one column per rank.
MAX_RANK_COLUMNS = 4


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _table(header: list, body: list) -> list:
    widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in body]
    return lines


def _wrap(text: str, indent: str) -> list:
    return textwrap.wrap(
        text,
        width=100,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def _counts_line(info: dict, loader, w: int) -> str:
    size = f"N={loader['dataset_size']}; " if loader and loader.get("dataset_size") is not None else ""
    samples = info["samples"]
    epochs = info.get("epochs") or []
    run = f" in the last of {max(epochs)} epochs" if epochs and max(epochs) > 1 else ""
    text = f"{size}the ranks ran {samples} samples in {info['batches']} batches{run}" + (
        f" (sampler {info['sampler']})" if info.get("sampler") else ""
    )
    if info.get("sanity_batches"):
        text += f"; the sanity check's {info['sanity_batches']} batches are counted apart"
    if not info["identified"]:
        return text + "; samples could not be identified, so repeats were not counted"
    if info["unsharded"]:
        return text + f"; every rank ran every sample: the data is not sharded across the {w} ranks"
    if info["duplicates"]:
        repeated = ", ".join(f"{k} x{v}" for k, v in info["duplicated"].items())
        return text + f"; {info['duplicates']} repeated sample(s) across ranks ({repeated})"
    return (
        text
        + "; no sample ran twice"
        + (
            f", {info['missing_vs_single']} sample(s) of W=1 ran on no rank ({', '.join(info.get('missing') or [])})"
            if info.get("missing_vs_single")
            else ""
        )
    )


def _rank_cells(per_rank: list, per_rank_columns: bool) -> list:
    """One cell per rank, or min / max / distinct past ``MAX_RANK_COLUMNS`` ranks."""
    if per_rank_columns:
        return [_num(v) for v in per_rank]
    known = [v for v in per_rank if v is not None]
    return [
        _num(min(known)) if known else "-",
        _num(max(known)) if known else "-",
        str(len({round(v, 6) for v in known})),
    ]


def _rank_headers(w: int) -> list:
    return [f"rank {r}" for r in range(w)] if w <= MAX_RANK_COLUMNS else ["min", "max", "distinct"]


def _header(result) -> list:
    """Model, data, stage, worlds, what each loop ran, and how a fit's weights compare."""
    w = result.world_size
    lines = [
        f"ddpprobe audit: model {result.model}, data {result.data}",
        f"stage {result.stage}: single process (W=1) vs {w} ranks (W={w}, backend {result.backend})",
    ]
    if result.lightning != "pytorch_lightning":
        lines.append(f"Lightning package: {result.lightning} (from the model's base class)")
    lines += _references_lines(result)
    for kind, info in result.counts.items():
        lines += _wrap(f"{kind} set: " + _counts_line(info, result.loaders.get(kind), w), "")
    weights = result.weights or {}
    if weights.get("trained_apart"):
        steps = weights["steps"]
        compared = (
            f"validation keys are compared with a single process validating the W={w} weights; "
            if weights.get("same_weights")
            else ""
        )
        lines += _wrap(
            f"fit: the weights trained apart (W=1 made {steps[0]} optimizer steps, W={w} {steps[1]} on each rank): "
            + compared
            + "training keys only across the ranks",
            "",
        )
    if result.stage == "predict" and "predict" in result.counts:
        lines += _wrap(
            f"predict: the ranks returned {result.predictions} prediction batch(es); predict does not pad "
            "(Lightning's UnrepeatedDistributedSamplerWrapper), so each sample is predicted once and the ranks "
            f"can run different numbers of batches ({result.counts['predict']['batches']}): a collective in "
            "predict_step or its hooks then waits on the ranks that ran fewer",
            "",
        )
    return lines


def _key_table(result) -> list:
    """The table of logged keys, one row per key (and per key's step values)."""
    w = result.world_size
    per_rank_columns = w <= MAX_RANK_COLUMNS
    header = ["key", "hook", "step", "epoch", "sync_dist", "reduce_fx", "W=1"] + _rank_headers(w) + ["verdict"]
    body = [
        [
            row.key + (" [steps]" if row.level == "step" else ""),
            ",".join(row.hooks),
            _yes(row.on_step),
            _yes(row.on_epoch),
            _yes(row.sync_dist),
            "(Metric)" if row.metric_object else row.reduce_fx,
            _num(row.single),
            *_rank_cells(row.per_rank, per_rank_columns),
            ("! " if row.problem else "") + row.verdict,
        ]
        for row in result.rows
    ]
    lines = [""] + (_table(header, body) if body else ["(no self.log calls recorded)"])
    if any(row.level == "step" for row in result.rows):
        lines.append("  [steps]: the values logged at each step; the columns show the last step's")
    if not per_rank_columns:
        lines.append(f"  {w} ranks: min, max and number of distinct values over the ranks")
    return lines


def advice_lines(names: list, fixes: list, evidence: dict) -> list:
    """The fix line of each registry entry of ``names`` whose fix applies (``fixes``), and for each other one a
    line saying that no proven fix applies, with the evidence (ddpprobe/hazards/ ``advice``)."""
    lines = []
    for name in dict.fromkeys(names):
        lines += hazards.advice(name, evidence) if name not in fixes else [hazards.fix_line(name)]
    return lines


def _notes(result) -> list:
    """One note per cause, naming the keys that share it; on a problem row, the fix of each registry entry the
    evidence proves where its preconditions hold, else that no proven fix applies (a row that is a
    consequence of the ranks' divergence gets neither: the divergence's own note has them)."""
    notes: dict = {}
    consequences = set(result.consequence_keys)
    culprit = result.culprit_key
    for row in result.rows:
        if row.key == culprit and row.problem:
            key = row.key + (" [steps]" if row.level == "step" else "")
            text = (
                "its sync is the collective the ranks made differently: each rank's value "
                "is what the mispaired collectives returned"
            )
            notes.setdefault((text, ()), []).append(key)
        elif row.cause or row.hazards:
            key = row.key + (" [steps]" if row.level == "step" else "")
            advice = (
                [] if not row.problem or row.key in consequences else advice_lines(row.hazards, row.fixes, row.evidence)
            )
            if row.problem and row.key not in consequences and not row.hazards:
                advice = [f"{hazards.NO_FIX}: no registry entry's evidence holds for this key"]
            notes.setdefault((row.cause, tuple(advice)), []).append(key)
    lines = [""] if notes else []
    for (cause, advice), keys in notes.items():
        cause_of = "the divergence below" if (result.trace or {}).get("first_divergence") else "the error below"
        mark = f" (a consequence of {cause_of})" if all(k.split(" [")[0] in consequences for k in keys) else ""
        lines += _wrap(f"{', '.join(keys)}{mark}: {cause}", "  ")
        for line in advice:
            lines += _wrap(line, "    ")
    return lines


def _trace_section(result) -> list:
    """The collective trace: how each rank ended, the first divergence, its culprit and fixes."""
    trace = result.trace or {}
    divergence = trace.get("first_divergence")
    reads = _lone_reads(result)
    if not (divergence or result.world_error):
        return _reads_lines(reads, [""]) if reads else []
    lines = ["", f"collective trace ({trace.get('level', 'python')} level, {result.world_size} ranks):"]
    ended_as = {"end": "finished its stage", "raised": "stage raised", None: "never finished its stage"}
    for r, rank in enumerate(trace.get("ranks", [])):
        error = f" ({rank['stage_error'].splitlines()[0][:120]})" if rank.get("stage_error") else ""
        lines.append(
            f"  rank {r}: {len(rank['collectives'])} collective(s) from Python, {ended_as[rank['stage']]}{error}"
        )
    if divergence:
        lines += _wrap("first divergence: " + divergence["message"], "  ")
        diagnosis = divergence.get("diagnosis") or {}
        if diagnosis.get("explanation"):
            lines += _wrap(diagnosis["explanation"], "  ")
        if diagnosis.get("hazard"):
            advice = advice_lines([diagnosis["hazard"]], diagnosis.get("fixes") or [], diagnosis.get("evidence") or {})
        else:
            advice = [f"{hazards.NO_FIX}: no registry entry's evidence holds for this divergence"]
        for line in advice:
            lines += _wrap(line, "    ")
    if result.world_error:
        first = result.world_error["message"].splitlines()
        lines += _wrap(f"the world failed ({result.world_error['type']}): " + " / ".join(first[:2]), "  ")
    return _reads_lines(reads, lines)


def _lone_reads(result) -> list:
    """The trace's reads of the logged metrics on some ranks only that the divergence does not already name."""
    diagnosis = ((result.trace or {}).get("first_divergence") or {}).get("diagnosis") or {}
    if diagnosis.get("hazard") == "metrics_read_on_some_ranks":
        return []
    return (result.trace or {}).get("lone_reads") or []


def read_cause(read: dict) -> str:
    """The registry's cause of one lone read (``trace["lone_reads"]``), worded as the culprit's read is
    (``read_numbers`` in ddpprobe/audit/evidence/_culprit.py: a read without a key runs the logged metrics' sync)."""
    from ddpprobe.audit.evidence._culprit import read_numbers

    return hazards.cause("metrics_read_on_some_ranks", **read_numbers(read, read["ranks"]))


def _reads_lines(reads: list, lines: list) -> list:
    for read in reads:
        lines += _wrap(
            read_cause(read) + "; here it paired with the other ranks' own epoch-end sync of the key, and the "
            "next collective of the module's own would pair with it instead",
            "  ",
        )
        for line in hazards.advice("metrics_read_on_some_ranks", {"ranks": read["ranks"]}):
            lines += _wrap(line, "    ")
    return lines


def _callbacks_section(result) -> list:
    if not result.callbacks:
        return []
    from ddpprobe.audit.evidence._callbacks import describe

    lines = ["", "callbacks at the end of the stage (each rank's own state):"]
    for row in result.callbacks:
        lines += _wrap(describe(row), "  ")
        if row["differs"]:
            fields = ", ".join(row["differs"])
            cause = hazards.cause(
                "callbacks_rank_local", callback=row["callback"], monitor=row["monitor"], fields=fields
            )
            lines += _wrap(cause, "    ")
            for line in hazards.advice("callbacks_rank_local", {"fields that differ": fields}):
                lines += _wrap(line, "    ")
    return lines


def _contract_section(result) -> list:
    from ddpprobe.audit.causes._contract import contract_lines

    lines = contract_lines(result.contract or {})
    if not lines:
        return []
    out = ["", "DDP contract (state that must be equal on every rank, and the first step against one process):"]
    for indent, text in lines:
        out += _wrap(text, "  " + indent)
    return out


def _stdout_section(result) -> list:
    single = result.stdout_lines["single"][0]
    per_rank = ", ".join(f"rank {r}: {n}" for r, n in enumerate(result.stdout_lines["world"]))
    lines = ["", f"stdout lines (print): W=1: {single}; W={result.world_size}: {per_rank}"]
    if sum(result.stdout_lines["world"]) > single and all(result.stdout_lines["world"]):
        lines += ["  every rank prints"] + _wrap(hazards.fix_line("print_every_rank"), "    ")
    if result.removed_hooks:
        lines.append("removed Lightning 1.x hooks defined by the module:")
        lines += [f"  {h['hook']}: {h['effect']}" for h in result.removed_hooks]
    return lines


def _experiment_section(result) -> list:
    """What the module wrote to ``self.logger.experiment`` itself, per rank, with verdicts."""
    if not result.experiment_rows:
        if not result.experiment_calls:
            return []
        lines = [
            "direct self.logger.experiment calls (recorded on rank 0; a no-op on every other rank, "
            "so only rank 0's values reach the logger):"
        ]
        for call in result.experiment_calls[:10]:
            args = ", ".join([repr(a) for a in call["args"]] + [f"{k}={v!r}" for k, v in call["kwargs"].items()])
            lines.append(f"  {call['method']}({args})")
        return lines
    w = result.world_size
    header = ["call", "hook", "W=1"] + _rank_headers(w) + ["verdict"]
    body = [
        [
            f"{row['method']}({row['tag']!r})",
            row["hook"] or "-",
            _num(row["single"]),
            *_rank_cells(row["per_rank"], w <= MAX_RANK_COLUMNS),
            ("! " if row["problem"] else "") + row["verdict"],
        ]
        for row in result.experiment_rows
    ]
    lines = [
        "",
        "values written to self.logger.experiment (what each rank's code wrote; the logger gets rank 0's only):",
    ]
    lines += ["  " + line for line in _table(header, body)]
    shown = set()
    for row in result.experiment_rows:
        if row["cause"] and (row["verdict"], row["hook"]) not in shown:
            shown.add((row["verdict"], row["hook"]))
            lines += _wrap(f"{row['tag']} (and the others like it): {row['cause']}", "  ")
            for line in advice_lines(row.get("hazards") or [], row["fixes"], row.get("evidence") or {}):
                lines += _wrap(line, "    ")
    return lines


def _findings(result) -> list:
    """What the stage raised, unsharded sets, Lightning's sync_dist warnings."""
    from ddpprobe.audit.causes._findings import raised_groups

    lines = []
    for places, info in raised_groups(result):
        message = info["message"].split("\n")[0].split("  At:")[0]  # the whole text is in --json
        lines += _wrap(f"the stage raised on {', '.join(places)}: {info['type']}: {message}", "")
        lines += ["  " + line for line in user_frames(info.get("traceback") or [])]
    for kind, info in result.counts.items():
        if info.get("unsharded"):
            lines += _wrap(f"{kind} set not sharded: every rank ran all {info['samples'][0]} samples", "")
            for line in hazards.advice("unsharded_data", {"sampler": info.get("sampler"), **info}):
                lines += _wrap(line, "  ")
    if result.sync_dist_warnings:
        lines.append(f"Lightning warned (rank 0): {len(result.sync_dist_warnings)} 'use sync_dist=True' warning(s)")
        grouped: dict = {}
        for key, why in warning_needs(result):
            grouped.setdefault(why, []).append(repr(key))
        for why, keys in grouped.items():
            lines += _wrap(f"for {', '.join(keys)}: {why}", "  ")
    return lines


def warning_needs(result) -> list:
    """``[(key, sentence)]``: for each key a 'use sync_dist=True' warning names, whether it calls for action, from
    the key's row: not where the ranks hold the key equal by construction (a collective of the module's own made
    them equal) or synced; yes where its ranks differ or it differs from single-process."""
    import re

    out = []
    for message in result.sync_dist_warnings:
        found = re.search(r"self\.log\(['\"]([^'\"]+)['\"]", message)
        if not found:
            continue
        rows = [r for r in result.rows if r.key == found.group(1) and r.level != "step"]
        if not rows:
            continue
        row = rows[0]
        if "equal by construction" in (row.cause or ""):
            out.append((row.key, "calls for no action: " + row.cause.split(";")[0]))
        elif row.problem:
            out.append((row.key, f"calls for action: {row.verdict}"))
        else:
            out.append((row.key, f"calls for no action here: {row.verdict}"))
    return list(dict.fromkeys(out))


def _references_lines(result) -> list:
    """What the W=N run is compared with, said only from what the references recorded: the single process that
    raised where a one-rank DDP world did not (then the values are compared with that world), and whether a
    one-rank DDP world raised the W=N run's error too."""
    refs = result.references or {}
    single, one = refs.get("single_process_raised"), refs.get("one_rank_ddp")
    lines = []
    if refs.get("compared_with") == "one-rank DDP world" and single:
        lines += _wrap(
            f"note: the single process (Trainer(devices=1), Lightning's default strategy, no process group) raised "
            f'{single["type"]}: {_clip(single["message"])}; a one-rank DDP world (strategy="ddp", W=1) ran the '
            "stage, so the values are compared with that world: what differs between the two (DDP's strategy, its "
            "process group, DistributedSampler's order) lets the stage run",
            "",
        )
    world = [r for r in (result.raised or {}).get("world") or [] if r]
    if one is not None and world and refs.get("compared_with") == "single process" and not single:
        if one.get("raised"):
            lines += _wrap(
                f'note: a one-rank DDP world (strategy="ddp", W=1) raised {one["raised"]["type"]} too, where the '
                "single process ran: DDP's strategy (the wrap, the process group, the sampler), not a second rank, "
                "makes the stage raise",
                "",
            )
        else:
            lines += _wrap(
                'note: a one-rank DDP world (strategy="ddp", W=1) ran the stage without raising: the W='
                f"{result.world_size} error needs more than one rank" + _batch_text(refs.get("raised_batches") or []),
                "",
            )
    return lines


def _batch_text(raised: list) -> str:
    """Where a raising rank's last batch held a sample count no batch of the single process's loop held (the
    sharding left it: DistributedSampler splits the set into W shards, and the shard's last batch keeps the rest)."""
    parts = [
        f"rank {b['rank']} raised in a {b['stage']} batch of {b['size']} sample(s), a size no {b['stage']} batch of "
        f"the single process had (its: {', '.join(str(n) for n in b['single_sizes'])})"
        for b in raised
        if b.get("single_sizes") and b["size"] not in b["single_sizes"]
    ]
    if not parts:
        return ""
    return "; " + "; ".join(parts) + ": each rank's shard is 1/W of the set, so its last batch keeps another remainder"


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _outcome(result) -> list:
    """The problems grouped by root cause: the ranks' divergence first with what it took down under it, each
    marked as a consequence, then the others."""
    findings = result.findings
    if not findings:
        return ["", "no problems found, exit code 0"]
    if result.exit_code == 3:
        lines = [
            "",
            f"{len(findings)} problem(s), exit code 3: each value differs from single-process by "
            "DistributedSampler's repeated samples alone (documented DDP semantics):",
        ]
        for finding in findings:
            lines.append(f"  - {finding['problem']}")
        return lines
    lines = ["", f"{len(findings)} problem(s), exit code 1:"]
    for finding in findings:
        lines.append(f"  - {finding['problem']}")
        lines += [f"      consequence: {c}" for c in finding["consequences"]]
    return lines


def _library_roots() -> tuple:
    """Folders whose frames are not the user's: the standard library, installed packages, ddpprobe itself."""
    import os
    import sysconfig

    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    import ddpprobe

    roots.add(os.path.dirname(os.path.abspath(ddpprobe.__file__)))
    return tuple(sorted(roots)) + ("<frozen", "<string")


def user_frames(traceback_lines: list) -> list:
    """The frames of a formatted traceback (``traceback.format_exception`` lines) in the user's own files, with
    their source lines: the frames of Lightning, torch, the standard library and ddpprobe are left out."""
    out, keep = [], False
    for chunk in traceback_lines:
        for line in chunk.rstrip("\n").split("\n"):
            stripped = line.strip()
            if stripped.startswith("File "):
                path = stripped[len("File ") :].split('"')[1] if '"' in stripped else stripped
                keep = not path.startswith(_library_roots()) and "site-packages" not in path
                if keep:
                    here = os.getcwd() + os.sep
                    out.append(stripped.replace(f'"{here}', '"', 1) if path.startswith(here) else stripped)
            elif keep and stripped and not stripped.startswith(("Traceback", "^", "~")):
                out.append("  " + stripped)
                keep = False
    return out


#: The report's sections, in order; each takes the result and returns its lines.
SECTIONS = (
    _header,
    _key_table,
    _notes,
    _trace_section,
    _contract_section,
    _callbacks_section,
    _stdout_section,
    _experiment_section,
    _findings,
    _outcome,
)


def format_result(result) -> str:
    """The report: header, the per-key table, a note per cause, the collective trace, the callbacks' state,
    prints and removed hooks, what the module wrote to the logger, other findings, and the outcome with
    its exit code (one function per section, :data:`SECTIONS`)."""
    return "\n".join(line for section in SECTIONS for line in section(result))

"""The plain-text report of an :class:`~ddpprobe.audit.AuditResult` (no dependency beyond Python)."""

from __future__ import annotations

import textwrap

from ddpprobe.audit._fixes import fix_line

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


def _notes(result) -> list:
    """One note per (cause, fixes), naming the keys that share it, each fix with its proving fact."""
    notes: dict = {}
    for row in result.rows:
        if row.cause or row.fixes:
            key = row.key + (" [steps]" if row.level == "step" else "")
            notes.setdefault((row.cause, tuple(row.fixes)), []).append(key)
    lines = [""] if notes else []
    for (cause, fixes), keys in notes.items():
        lines += _wrap(f"{', '.join(keys)}: {cause}", "  ")
        for fix in fixes:
            lines += _wrap(fix_line(fix), "    ")
    return lines


def _trace_section(result) -> list:
    """The collective trace: how each rank ended, the first divergence, its culprit and fixes."""
    trace = result.trace or {}
    divergence = trace.get("first_divergence")
    if not (divergence or result.world_error):
        return []
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
        for fix in diagnosis.get("fixes") or []:
            lines += _wrap(fix_line(fix), "    ")
    if result.world_error:
        first = result.world_error["message"].splitlines()
        lines += _wrap(f"the world failed ({result.world_error['type']}): " + " / ".join(first[:2]), "  ")
    return lines


def _callbacks_section(result) -> list:
    if not result.callbacks:
        return []
    from ddpprobe.audit._callbacks import describe

    lines = ["", "callbacks at the end of the stage (each rank's own state):"]
    for row in result.callbacks:
        lines += _wrap(describe(row), "  ")
    return lines


def _stdout_section(result) -> list:
    single = result.stdout_lines["single"][0]
    per_rank = ", ".join(f"rank {r}: {n}" for r, n in enumerate(result.stdout_lines["world"]))
    lines = ["", f"stdout lines (print): W=1: {single}; W={result.world_size}: {per_rank}"]
    if sum(result.stdout_lines["world"]) > single and all(result.stdout_lines["world"]):
        lines += _wrap("every rank prints: use self.print(...) or @rank_zero_only to print once", "  ")
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
            for fix in row["fixes"]:
                lines += _wrap(fix_line(fix), "    ")
    return lines


def _findings(result) -> list:
    """What the stage raised, unsharded sets, Lightning's sync_dist warnings."""
    lines = []
    raised = [("W=1", result.raised["single"])] + [(f"rank {r}", i) for r, i in enumerate(result.raised["world"])]
    for where, info in raised:
        if info:
            lines += _wrap(f"the stage raised on {where}: {info['type']}: {info['message']}", "")
    for kind, info in result.counts.items():
        if info.get("unsharded"):
            lines += _wrap(f"{kind} set not sharded: every rank ran all {info['samples'][0]} samples", "")
            lines += _wrap(fix_line("shard_iterable"), "  ")
    if result.sync_dist_warnings:
        lines.append(f"Lightning warned (rank 0): {len(result.sync_dist_warnings)} 'use sync_dist=True' warning(s)")
    return lines


def _outcome(result) -> list:
    problems = result.problems
    if not problems:
        return ["", "no problems found, exit code 0"]
    return ["", f"{len(problems)} problem(s), exit code 1:"] + [f"  - {p}" for p in problems]


#: The report's sections, in order; each takes the result and returns its lines.
SECTIONS = (
    _header,
    _key_table,
    _notes,
    _trace_section,
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

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


def format_result(result) -> str:
    """Header, the per-key table, a note per key with a cause, then prints, removed hooks, what reached
    the logger, and the outcome with its exit code."""
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
        lines += _wrap(
            f"fit: the weights trained apart (W=1 made {steps[0]} optimizer steps, W={w} {steps[1]} on each rank): "
            + (
                f"validation keys are compared with a single process validating the W={w} weights; "
                if weights.get("same_weights")
                else ""
            )
            + "training keys only across the ranks",
            "",
        )
    if result.stage == "predict" and "predict" in result.counts:
        info = result.counts["predict"]
        lines += _wrap(
            f"predict: the ranks returned {result.predictions} prediction batch(es); predict does not pad "
            "(Lightning's UnrepeatedDistributedSamplerWrapper), so each sample is predicted once and the ranks "
            f"can run different numbers of batches ({info['batches']}): a collective in predict_step or its "
            "hooks then waits on the ranks that ran fewer",
            "",
        )
    lines.append("")

    per_rank_columns = w <= MAX_RANK_COLUMNS
    ranks = [f"rank {r}" for r in range(w)] if per_rank_columns else ["min", "max", "distinct"]
    header = ["key", "hook", "step", "epoch", "sync_dist", "reduce_fx", "W=1"] + ranks + ["verdict"]
    body = []
    for row in result.rows:
        reduce_fx = "(Metric)" if row.metric_object else row.reduce_fx
        key = row.key + (" [steps]" if row.level == "step" else "")
        if per_rank_columns:
            values = [_num(v) for v in row.per_rank]
        else:
            known = [v for v in row.per_rank if v is not None]
            values = [
                _num(min(known)) if known else "-",
                _num(max(known)) if known else "-",
                str(len({round(v, 6) for v in known})),
            ]
        body.append(
            [
                key,
                ",".join(row.hooks),
                _yes(row.on_step),
                _yes(row.on_epoch),
                _yes(row.sync_dist),
                reduce_fx,
                _num(row.single),
                *values,
                ("! " if row.problem else "") + row.verdict,
            ]
        )
    lines += _table(header, body) if body else ["(no self.log calls recorded)"]
    if any(row.level == "step" for row in result.rows):
        lines.append("  [steps]: the values logged at each step; the columns show the last step's")
    if not per_rank_columns:
        lines.append(f"  {w} ranks: min, max and number of distinct values over the ranks")

    notes: dict = {}  # (cause, fixes) -> keys: one note for the keys that share it
    for row in result.rows:
        if row.cause or row.fixes:
            key = row.key + (" [steps]" if row.level == "step" else "")
            notes.setdefault((row.cause, tuple(row.fixes)), []).append(key)
    if notes:
        lines.append("")
        for (cause, fixes), keys in notes.items():
            lines += _wrap(f"{', '.join(keys)}: {cause}", "  ")
            for fix in fixes:
                lines += _wrap(fix_line(fix), "    ")

    trace = result.trace or {}
    divergence = trace.get("first_divergence")
    if divergence or result.world_error:
        lines.append("")
        lines.append(f"collective trace ({trace.get('level', 'python')} level, {w} ranks):")
        for r, rank in enumerate(trace.get("ranks", [])):
            ended = {"end": "finished its stage", "raised": "stage raised", None: "never finished its stage"}[
                rank["stage"]
            ]
            lines.append(
                f"  rank {r}: {len(rank['collectives'])} collective(s) from Python, {ended}"
                + (f" ({rank['stage_error'].splitlines()[0][:120]})" if rank.get("stage_error") else "")
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

    if result.callbacks:
        from ddpprobe.audit._callbacks import describe

        lines.append("")
        lines.append("callbacks at the end of the stage (each rank's own state):")
        for row in result.callbacks:
            lines += _wrap(describe(row), "  ")
    lines.append("")
    single = result.stdout_lines["single"][0]
    per_rank = ", ".join(f"rank {r}: {n}" for r, n in enumerate(result.stdout_lines["world"]))
    lines.append(f"stdout lines (print): W=1: {single}; W={w}: {per_rank}")
    if sum(result.stdout_lines["world"]) > single and all(result.stdout_lines["world"]):
        lines += _wrap("every rank prints: use self.print(...) or @rank_zero_only to print once", "  ")
    if result.removed_hooks:
        lines.append("removed Lightning 1.x hooks defined by the module:")
        lines += [f"  {h['hook']}: {h['effect']}" for h in result.removed_hooks]
    if result.experiment_rows:
        lines.append("")
        lines.append(
            "values written to self.logger.experiment (what each rank's code wrote; the logger gets rank 0's only):"
        )
        header = ["call", "hook", "W=1"] + ranks + ["verdict"]
        body = []
        for row in result.experiment_rows:
            if per_rank_columns:
                values = [_num(v) for v in row["per_rank"]]
            else:
                known = [v for v in row["per_rank"] if v is not None]
                values = [
                    _num(min(known)) if known else "-",
                    _num(max(known)) if known else "-",
                    str(len({round(v, 6) for v in known})),
                ]
            body.append(
                [
                    f"{row['method']}({row['tag']!r})",
                    row["hook"] or "-",
                    _num(row["single"]),
                    *values,
                    ("! " if row["problem"] else "") + row["verdict"],
                ]
            )
        lines += ["  " + line for line in _table(header, body)]
        shown = set()
        for row in result.experiment_rows:
            if row["cause"] and (row["verdict"], row["hook"]) not in shown:
                shown.add((row["verdict"], row["hook"]))
                lines += _wrap(f"{row['tag']} (and the others like it): {row['cause']}", "  ")
                for fix in row["fixes"]:
                    lines += _wrap(fix_line(fix), "    ")
    elif result.experiment_calls:
        lines.append(
            "direct self.logger.experiment calls (recorded on rank 0; a no-op on every other rank, "
            "so only rank 0's values reach the logger):"
        )
        for call in result.experiment_calls[:10]:
            args = ", ".join([repr(a) for a in call["args"]] + [f"{k}={v!r}" for k, v in call["kwargs"].items()])
            lines.append(f"  {call['method']}({args})")
    for where, info in [("W=1", result.raised["single"])] + [
        (f"rank {r}", i) for r, i in enumerate(result.raised["world"])
    ]:
        if info:
            lines += _wrap(f"the stage raised on {where}: {info['type']}: {info['message']}", "")
    for kind, info in result.counts.items():
        if info.get("unsharded"):
            lines += _wrap(f"{kind} set not sharded: every rank ran all {info['samples'][0]} samples", "")
            lines += _wrap(fix_line("shard_iterable"), "  ")
    if result.sync_dist_warnings:
        lines.append(f"Lightning warned (rank 0): {len(result.sync_dist_warnings)} 'use sync_dist=True' warning(s)")

    lines.append("")
    problems = result.problems
    if problems:
        lines.append(f"{len(problems)} problem(s), exit code 1:")
        lines += [f"  - {p}" for p in problems]
    else:
        lines.append("no problems found, exit code 0")
    return "\n".join(lines)

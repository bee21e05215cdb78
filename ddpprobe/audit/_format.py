"""The plain-text report of an :class:`~ddpprobe.audit.AuditResult` (no dependency beyond Python)."""

from __future__ import annotations

import textwrap


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
    return textwrap.wrap(text, width=100, initial_indent=indent, subsequent_indent=indent + "  ")


def format_result(result) -> str:
    """Header, the per-key table, a note per key with a cause, then prints, removed hooks, what reached
    the logger, and the outcome with its exit code."""
    w = result.world_size
    lines = [
        f"ddpprobe audit: model {result.model}, data {result.data}",
        f"stage {result.stage}: single process (W=1) vs {w} ranks (W={w}, backend {result.backend})",
    ]
    for kind, info in result.loaders.items():
        if info["dataset_size"] is None:
            lines.append(f"{kind} set: size unknown (no len()); padding not computed")
            continue
        dup = info["padding_duplicates"]
        lines.append(
            f"{kind} set: N={info['dataset_size']} samples, {info['per_rank']} per rank at W={w}; "
            + (f"DistributedSampler pads with {dup} duplicated sample(s)" if dup else "no padding")
        )
    lines.append("")

    header = ["key", "hook", "step", "epoch", "sync_dist", "reduce_fx", "W=1"] + [f"rank {r}" for r in range(w)] + ["verdict"]
    body = []
    for row in result.rows:
        reduce_fx = "(Metric)" if row.metric_object else row.reduce_fx
        body.append([row.key, ",".join(row.hooks), _yes(row.on_step), _yes(row.on_epoch), _yes(row.sync_dist),
                     reduce_fx, _num(row.single), *[_num(v) for v in row.per_rank],
                     ("! " if row.problem else "") + row.verdict])
    lines += _table(header, body) if body else ["(no self.log calls recorded)"]

    notes = [row for row in result.rows if row.cause]
    if notes:
        lines.append("")
        for row in notes:
            lines += _wrap(f"{row.key}: {row.cause}", "  ")

    lines.append("")
    single = result.stdout_lines["single"][0]
    per_rank = ", ".join(f"rank {r}: {n}" for r, n in enumerate(result.stdout_lines["world"]))
    lines.append(f"stdout lines (print): W=1: {single}; W={w}: {per_rank}")
    if sum(result.stdout_lines["world"]) > single and all(result.stdout_lines["world"]):
        lines += _wrap("every rank prints: use self.print(...) or @rank_zero_only to print once", "  ")
    if result.removed_hooks:
        lines.append("removed Lightning 1.x hooks defined by the module:")
        lines += [f"  {h['hook']}: {h['effect']}" for h in result.removed_hooks]
    if result.experiment_calls:
        lines.append("direct self.logger.experiment calls (recorded on rank 0; a no-op on every other rank, "
                     "so only rank 0's values reach the logger):")
        for call in result.experiment_calls[:10]:
            args = ", ".join([repr(a) for a in call["args"]] + [f"{k}={v!r}" for k, v in call["kwargs"].items()])
            lines.append(f"  {call['method']}({args})")
    for where, info in [("W=1", result.raised["single"])] + [(f"rank {r}", i) for r, i in enumerate(result.raised["world"])]:
        if info:
            lines += _wrap(f"the stage raised on {where}: {info['type']}: {info['message']}", "")
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

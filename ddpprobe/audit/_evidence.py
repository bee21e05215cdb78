"""What the ranks' traces prove: per-rank counts of batches and samples, duplicates across ranks, the first
point where the ranks' collective sequences diverge, and the call site that made them diverge. Rules on
recorded events only (written and read by ddpprobe/trace/, ``split_trace``), so they can be read
and tested on hand-written events without launching a world."""

from __future__ import annotations

from ddpprobe.audit._counts import (
    Counts,
    counts,
    last_run,
    loop_runs,
    sanity_run,
    shards_of,
    unmoved_leaves,
    unmoved_text,
)
from ddpprobe.audit._culprit import culprit, diagnose, purpose, site
from ddpprobe.audit._divergence import first_divergence, sequence, trace_summary
from ddpprobe.audit._stages import STAGE_LOOP
from ddpprobe.trace import split_trace

__all__ = [
    "STAGE_LOOP",
    "Counts",
    "counts",
    "culprit",
    "diagnose",
    "first_divergence",
    "last_run",
    "loop_runs",
    "purpose",
    "sanity_run",
    "sequence",
    "shards_of",
    "site",
    "split",
    "trace_summary",
    "unmoved_leaves",
    "unmoved_text",
]

#: One rank's trace events grouped (the reader lives with the writer, ddpprobe/trace/).
split = split_trace

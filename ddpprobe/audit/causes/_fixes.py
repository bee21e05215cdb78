"""The audit's fixes, read from the hazard registry (ddpprobe/hazards/), which holds every cause and fix the
audit and the guard print. ``FIXES`` maps each entry that has a proven fix to ``(fix, fact test)``;
``fix_line`` also takes the names the fixes had before the registry (``"same_keys"``, ``"even_batches"`` ...),
so code written against them keeps working."""

from __future__ import annotations

from ddpprobe import hazards
from ddpprobe.hazards import REMOVED_HOOKS

__all__ = ["FIXES", "REMOVED_HOOKS", "fix_line"]

#: ``{entry name: (fix, the fact test that shows it)}`` of the registry's entries with a proven fix.
FIXES = {name: (h.fix, h.fix_fact) for name, h in hazards.HAZARDS.items() if h.fix is not None}

#: The fixes' names before the registry, and the entry whose fix (the same text and fact) each is now.
ALIASES = {
    "metric_object": "non_decomposable",
    "sync_dist": "rank_local_mean",
    "mean_metric": "floored_count",
    "dedupe": "repeated_samples",
    "gather_dedupe": "experiment_rank_local",
    "rank_zero_only": "rank0_only_synced_log",
    "metric_step_sync": "metric_step_local",
    "shard_iterable": "unsharded_data",
    "even_batches_step": "uneven_batches_step_sync",
    "even_batches_fit": "uneven_batches_fit",
    "even_batches": "uneven_batches",
    "pad_gather": "gather_shapes_differ",
    "compute_everywhere": "metric_compute_on_some_ranks",
    "collective_everywhere": "collective_on_some_ranks",
    "same_keys": "keys_differ",
    "predict_writer": "predict_collective",
}


def fix_line(name: str) -> str:
    """``"Fix: <what> (shown by <test>)"`` of the registry entry ``name`` (or of its former fix name)."""
    return hazards.fix_line(ALIASES.get(name, name))

"""Room 2 — probes: LightningModules and scenarios that record what each rank saw, logged and printed.

A scenario is a top-level function ``scenario(info: RankInfo, **params) -> dict`` that the launcher
runs in every rank; its dict is that rank's record.
"""

from ddpprobe.probes import f1, hooks, validation
from ddpprobe.probes.data import IdDataset, sample_pred, sample_target, sample_value
from ddpprobe.probes.validation import log_spec

__all__ = ["IdDataset", "f1", "hooks", "log_spec", "sample_pred", "sample_target", "sample_value", "validation"]

"""Room 2 — probes: LightningModules and scenarios that record what each rank saw, logged and printed.

A scenario is a top-level function ``scenario(info: RankInfo, **params) -> dict`` that the launcher
runs in every rank; its dict is that rank's record. Importing this package imports every probe module
named in ``PROBE_MODULES``, so the launcher's forkserver (which preloads ``ddpprobe.probes``) loads them
all once and a forked rank starts with them imported. Add a new probe module here.
"""

import importlib

from ddpprobe.probes.data import IdDataset, sample_pred, sample_target, sample_value
from ddpprobe.probes.log_plan import log_spec

#: The probe modules of this package, imported with it (add a new probe module here).
PROBE_MODULES = (
    "accumulation",
    "callbacks",
    "collectives",
    "common",
    "contract",
    "data",
    "dataloaders",
    "ddp_spawn",
    "f1",
    "gradients_and_weights",
    "hazards",
    "hidden_collectives",
    "hooks",
    "iterable",
    "legacy_hooks",
    "log_plan",
    "logged_metrics",
    "loggers_per_rank",
    "manual_ddp_options",
    "metric_checkpoints",
    "metric_memory",
    "metric_wrappers",
    "multilabel",
    "multinode",
    "nccl",
    "outside_log_reductions",
    "precision",
    "predict",
    "preemption",
    "process_group_timeout",
    "rank_state",
    "reductions",
    "samplers",
    "samplers_per_loader",
    "samplers_rewrapped",
    "stopping_checkpoints_and_schedules",
    "strategy_and_fabric_collectives",
    "training",
    "validation",
)

for _name in PROBE_MODULES:
    importlib.import_module(f"{__name__}.{_name}")
del _name

__all__ = ["IdDataset", "PROBE_MODULES", "log_spec", "sample_pred", "sample_target", "sample_value"]

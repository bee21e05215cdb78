"""Hooks removed in Lightning 2.0 that users still write: ``validation_epoch_end(outputs)`` and
``validation_step_end(step_output)``. Each probe defines one and records what happened to it."""

from __future__ import annotations

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import validate_catching


class _StepCounter(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.calls = {"validation_step": 0, "validation_step_end": 0, "validation_epoch_end": 0}

    def validation_step(self, batch, batch_idx):
        self.calls["validation_step"] += 1
        return {"ids": batch["id"]}


class WithValidationEpochEnd(_StepCounter):
    """Defines the 1.x hook ``validation_epoch_end(outputs)``."""

    def validation_epoch_end(self, outputs):
        self.calls["validation_epoch_end"] += 1


class WithValidationStepEnd(_StepCounter):
    """Defines the 1.x hook ``validation_step_end(step_output)``."""

    def validation_step_end(self, step_output):
        self.calls["validation_step_end"] += 1
        return step_output


MODULES = {"validation_epoch_end": WithValidationEpochEnd, "validation_step_end": WithValidationStepEnd}


def removed_hook(info: RankInfo, hook: str, n: int = 6, batch_size: int = 2) -> dict:
    """Scenario: ``trainer.validate`` a module that defines the removed ``hook``.

    Record keys: ``raised`` (exception class name or None), ``message`` (its text or None),
    ``calls`` (how often ``validation_step`` and the removed hooks ran on this rank).

    Raises:
        ValueError: ``hook`` is not one of ``MODULES``.
    """
    if hook not in MODULES:
        raise ValueError(f"hook={hook!r}: choose one of {sorted(MODULES)}")
    model = MODULES[hook]()
    outcome = validate_catching(info, model, n, batch_size)
    return {**outcome, "calls": model.calls}

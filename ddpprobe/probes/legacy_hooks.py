"""Lightning 1.x's batch-output hooks, run for real: what ``validation_step_end(step_output)`` and
``validation_epoch_end(outputs)`` receive on each rank under ddp.

These hooks exist up to pytorch-lightning 1.9 (removed in 2.0: Lightning-AI/pytorch-lightning PR
#16520 and #16791); on 2.x, ``ddpprobe.probes.hooks`` records what happens to them instead. The
module below returns ``{"ids": tensor}`` from ``validation_step`` and records, per rank, what each
hook was handed, so a test can compare it with the rank's own shard.
"""

from __future__ import annotations

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, validate_catching

#: The 1.x hooks a ``LegacyHooksProbe`` can define.
HOOKS = ("validation_step_end", "validation_epoch_end")


class LegacyHooksProbe(pl.LightningModule):
    """Records what ``validation_step`` returned and what the 1.x hooks were handed, on this rank.

    ``validation_step`` returns ``{"ids": batch["id"]}``. Subclasses define one 1.x hook each.

    Attributes:
        seen_ids: per ``validation_step`` call, the batch's sample ids.
        step_end_inputs: per ``validation_step_end`` call, the sample ids in its ``step_output``.
        step_end_same_object: per call, whether ``step_output`` is the very object ``validation_step``
            returned (no gathering or copying in between).
        epoch_end_outputs: per ``validation_epoch_end`` call, the sample ids of each element of ``outputs``.
    """

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen_ids: list = []
        self.step_end_inputs: list = []
        self.step_end_same_object: list = []
        self.epoch_end_outputs: list = []
        self._last_returned = None

    def validation_step(self, batch, batch_idx):
        self.seen_ids.append(batch_ids(batch))
        self._last_returned = {"ids": batch["id"]}
        return self._last_returned


class WithStepEnd(LegacyHooksProbe):
    """Defines ``validation_step_end(step_output)`` (1.x) and records its argument."""

    def validation_step_end(self, step_output):
        self.step_end_inputs.append([int(i) for i in step_output["ids"]])
        self.step_end_same_object.append(step_output is self._last_returned)
        return step_output


class WithEpochEnd(LegacyHooksProbe):
    """Defines ``validation_epoch_end(outputs)`` (1.x) and records its argument."""

    def validation_epoch_end(self, outputs):
        self.epoch_end_outputs.append([[int(i) for i in out["ids"]] for out in outputs])


MODULES = {"validation_step_end": WithStepEnd, "validation_epoch_end": WithEpochEnd}


def legacy_hook(info: RankInfo, hook: str, n: int = 5, batch_size: int = 2) -> dict:
    """Scenario: ``trainer.validate`` over ``IdDataset(n)`` a module that defines the 1.x ``hook``.

    Record keys: ``raised`` (exception class name or None) and ``message``; ``seen_ids`` (per batch, the
    ids ``validation_step`` saw); ``step_end_inputs`` (per ``validation_step_end`` call, the ids in
    its argument); ``step_end_same_object`` (per call, whether the argument is the object
    ``validation_step`` returned); ``epoch_end_outputs`` (per ``validation_epoch_end`` call, the ids of
    each element of ``outputs``).

    Raises:
        ValueError: ``hook`` is not one of ``HOOKS``.
    """
    if hook not in MODULES:
        raise ValueError(f"hook={hook!r}: choose one of {sorted(MODULES)}")
    model = MODULES[hook]()
    outcome = validate_catching(info, model, n, batch_size)  # 2.x raises for validation_epoch_end
    return {
        **outcome,
        "seen_ids": model.seen_ids,
        "step_end_inputs": model.step_end_inputs,
        "step_end_same_object": model.step_end_same_object,
        "epoch_end_outputs": model.epoch_end_outputs,
    }

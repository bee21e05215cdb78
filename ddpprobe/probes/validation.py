"""The validation probe: a LightningModule that records what each rank's validation loop saw and logged.

``ValidationProbe`` logs, for each batch, the batch mean of ``IdDataset``'s ``value`` (``id ** 2``)
under every name in its log plan (``log_spec(name, **options)`` entries, ddpprobe/probes/log_plan.py),
with the ``self.log`` options the plan gives, and records:

- ``seen_ids``: the sample ids of each ``validation_step`` batch on this rank;
- ``epoch_end_ids``: the ids held in ``on_validation_epoch_end`` by a list filled in ``validation_step``
  (the Lightning 2.x replacement for ``validation_epoch_end(outputs)``);
- what the logger's ``experiment`` is on this rank, and (optionally) the seed's print calls.
"""

from __future__ import annotations

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import (
    batch_ids,
    ddp_trainer,
    floats,
    id_loader,
    only_loader,
    recorded_warnings,
    trainer_metrics,
)
from ddpprobe.probes.log_plan import check_plan, log_entry, logs_here


@pl.utilities.rank_zero_only
def rank_zero_print(text: str) -> None:
    """``print`` wrapped in Lightning's ``rank_zero_only``: runs on global rank 0 only."""
    print(text)


class ValidationProbe(pl.LightningModule):
    """Logs the batch mean of ``value`` per its log plan and records what this rank saw.

    ``trainer.test`` runs it the same way (``test_step`` and ``on_test_epoch_end`` do what the
    validation hooks do).

    Args:
        logs: log plan, a list of ``log_spec(...)`` dicts logging ``what="batch_mean"`` from the step
            (``ranks`` and ``via`` are honoured).
        prints: in ``on_validation_epoch_end``, call ``print``, ``self.print`` and a ``rank_zero_only``
            function once each.
        experiment_log: in ``on_validation_epoch_end``, write this rank's local mean straight to
            ``self.logger.experiment`` (what the seed's code does with ``add_scalar``).
    """

    def __init__(self, logs=(), prints=False, experiment_log=False):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.logs = check_plan(logs, type(self).__name__, values=("batch_mean",), hooks=("step",), subgroup=False)
        self.prints = prints
        self.experiment_log = experiment_log
        self.seen_ids: list = []
        self.step_outputs: list = []
        self.epoch_end_ids: list = []
        self.experiment_type = None

    def validation_step(self, batch, batch_idx):
        ids = batch_ids(batch)
        self.seen_ids.append(ids)
        self.step_outputs.append({"ids": batch["id"], "value": batch["value"]})
        batch_mean = batch["value"].mean()
        for entry in self.logs:
            if logs_here(entry, "step", self.global_rank):
                log_entry(self, entry, batch_mean, batch_size=len(ids))

    def test_step(self, batch, batch_idx):
        # trainer.test runs the same step and epoch-end recording as trainer.validate.
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self):
        self.on_validation_epoch_end()

    def on_validation_epoch_end(self):
        self.epoch_end_ids = [int(i) for out in self.step_outputs for i in out["ids"]]
        local_mean = torch.cat([out["value"] for out in self.step_outputs]).mean()
        if self.prints:
            print(f"plain print on rank {self.global_rank}")
            self.print(f"self.print on rank {self.global_rank}")
            rank_zero_print(f"rank_zero_only print on rank {self.global_rank}")
        if self.logger is not None:
            self.experiment_type = type(self.logger.experiment).__name__
            if self.experiment_log:
                self.logger.experiment.log_metrics({"local_mean_direct": float(local_mean)}, self.global_step)
        self.step_outputs.clear()


def validate(
    info: RankInfo,
    n: int,
    batch_size: int = 2,
    logs: list = (),
    prints: bool = False,
    csv_logger: bool = False,
    experiment_log: bool = False,
) -> dict:
    """Scenario: ``trainer.validate`` a ``ValidationProbe`` over ``IdDataset(n)``; return what this rank saw.

    Record keys: ``global_rank``, ``world_size`` (as the Trainer sees them), ``seen_ids`` (list of
    per-batch id lists), ``epoch_end_ids``, ``callback_metrics``, ``logged_metrics``,
    ``progress_bar_metrics`` (name -> float), ``returned`` (what ``trainer.validate`` returned),
    ``warnings`` (list of ``{"category", "message"}``), ``sampler`` (class name of the sampler
    Lightning put in the dataloader), ``experiment_type`` (class of ``self.logger.experiment``).
    With ``csv_logger`` a ``CSVLogger(save_dir=".")`` writes to the rank's working directory.
    """
    model = ValidationProbe(logs=logs, prints=prints, experiment_log=experiment_log)
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info, logger=pl.loggers.CSVLogger(save_dir=".") if csv_logger else False)
        returned = trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=prints)
    return {
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "seen_ids": model.seen_ids,
        "epoch_end_ids": model.epoch_end_ids,
        **trainer_metrics(trainer),
        "returned": [floats(d) for d in returned],
        "warnings": warnings,
        "sampler": type(only_loader(trainer.val_dataloaders).sampler).__name__,
        "experiment_type": model.experiment_type,
    }

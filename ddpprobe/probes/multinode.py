"""The node-layout probe: who is who when a world spans several nodes.

Run under an external launcher with several nodes (two torchrun agents on one host make two
"nodes"). ``NodeLayoutProbe`` records the ranks Lightning assigns, which samples the rank's
validation loop sees, whether ``prepare_data`` ran here (once per node by default), and what
``self.print`` and the logger did on this rank.
"""

from __future__ import annotations

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, floats, id_loader


class NodeLayoutProbe(pl.LightningModule):
    """Records ``prepare_data`` calls, the validation ids seen and prints with ``self.print``."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.prepare_data_calls = 0
        self.seen_ids: list = []

    def prepare_data(self):
        # Lightning calls this on local rank 0 of every node (prepare_data_per_node=True, the default).
        self.prepare_data_calls += 1

    def validation_step(self, batch, batch_idx):
        self.seen_ids.append(batch_ids(batch))
        self.log("v", batch["value"].mean(), sync_dist=True, batch_size=len(batch["id"]))

    def on_validation_epoch_end(self):
        self.print(f"self.print from global rank {self.global_rank}")


def node_layout(info: RankInfo, n: int = 10, batch_size: int = 2) -> dict:
    """Scenario: validate ``NodeLayoutProbe`` over ``IdDataset(n)`` with a CSV logger.

    Record keys: ``global_rank``, ``local_rank``, ``node_rank``, ``world_size``, ``num_nodes``
    (as the Trainer sees them), ``is_global_zero``, ``prepare_data_calls``, ``seen_ids`` (flat list),
    ``callback_metrics``, ``experiment_type`` (class of ``trainer.logger.experiment`` on this rank).
    """
    model = NodeLayoutProbe()
    trainer = ddp_trainer(info, logger=pl.loggers.CSVLogger(save_dir="."))
    trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "num_nodes": trainer.num_nodes,
        "is_global_zero": trainer.is_global_zero,
        "prepare_data_calls": model.prepare_data_calls,
        "seen_ids": sum(model.seen_ids, []),
        "callback_metrics": floats(trainer.callback_metrics),
        "experiment_type": type(trainer.logger.experiment).__name__,
    }

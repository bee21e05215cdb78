"""The node-layout probe: who is who when a world spans several nodes.

Run it in a launched world of several "nodes" on one host (``run_world(node_layout, 4, num_nodes=2)``:
forked ranks with ``NODE_RANK``/``LOCAL_RANK`` set as a launcher sets them on each node) or under an
external launcher with several nodes (two torchrun agents). ``NodeLayoutProbe`` records the ranks
Lightning assigns, which samples the rank's validation loop sees, whether ``prepare_data`` ran here
(once per node by default, once per world with ``prepare_data_per_node=False``), and what
``self.print`` and the logger did on this rank.
"""

from __future__ import annotations

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, floats, id_loader


class NodeLayoutProbe(pl.LightningModule):
    """Records ``prepare_data`` calls, the validation ids seen and prints with ``self.print``."""

    def __init__(self, prepare_data_per_node: bool = True):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        # Read by Lightning before it calls prepare_data (pytorch_lightning/trainer/connectors/
        # data_connector.py ``_DataConnector.prepare_data``): per node on each local rank 0, or once
        # in the world on global rank 0 (node_rank 0, local_rank 0).
        self.prepare_data_per_node = prepare_data_per_node
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


def node_layout(info: RankInfo, n: int = 10, batch_size: int = 2, prepare_data_per_node: bool = True) -> dict:
    """Scenario: validate ``NodeLayoutProbe`` over ``IdDataset(n)`` with a CSV logger.

    Args:
        n: dataset size; sample ``i`` has value ``i * i`` (ddpprobe/probes/data.py).
        batch_size: validation batch size.
        prepare_data_per_node: the module's ``prepare_data_per_node`` (Lightning's default True).

    Record keys: ``global_rank``, ``local_rank``, ``node_rank``, ``world_size``, ``num_nodes``
    (as the Trainer sees them), ``is_global_zero``, ``cluster_environment`` (class name of the
    strategy's cluster environment: ``LightningEnvironment`` in a launched world,
    ``TorchElasticEnvironment`` under torchrun), ``prepare_data_calls``, ``seen_ids`` (flat list),
    ``callback_metrics``, ``experiment_type`` (class of ``trainer.logger.experiment`` on this rank).
    """
    model = NodeLayoutProbe(prepare_data_per_node=prepare_data_per_node)
    trainer = ddp_trainer(info, logger=pl.loggers.CSVLogger(save_dir="."))
    trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "num_nodes": trainer.num_nodes,
        "is_global_zero": trainer.is_global_zero,
        "cluster_environment": type(trainer.strategy.cluster_environment).__name__,
        "prepare_data_calls": model.prepare_data_calls,
        "seen_ids": sum(model.seen_ids, []),
        "callback_metrics": floats(trainer.callback_metrics),
        "experiment_type": type(trainer.logger.experiment).__name__,
    }

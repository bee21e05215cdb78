"""Exact evaluation, correct: ``Trainer(use_distributed_sampler=False)`` and each rank's own shard of the set
(rank 0 the first 20 samples, rank 1 the last 12: 5 and 3 batches of 4, no sample repeated), the loss summed
with ``reduce_fx="sum"`` and ``sync_dist=True`` at the epoch's end only: no collective per batch, so shards of
different lengths are safe, and the epoch value is the sum over all 32 samples."""

import torch
from torch.utils.data import DataLoader, Subset

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms._data import loader

#: Each rank's samples: 5 batches of 4 on rank 0, 3 on rank 1.
SHARDS = (range(0, 20), range(20, 32))


class LitClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y, reduction="sum")
        self.log("val_loss_sum", loss, on_step=False, on_epoch=True, reduce_fx="sum", sync_dist=True)


def train(info, guard: bool = True, guard_timeout: float = 5.0) -> dict:
    torch.manual_seed(0)
    model = LitClassifier()
    shard = Subset(loader().dataset, SHARDS[info.rank])
    callbacks = [CollectiveGuard(timeout=guard_timeout)] if guard else []
    trainer = ddp_trainer(info, use_distributed_sampler=False, callbacks=callbacks)
    trainer.validate(model, dataloaders=DataLoader(shard, batch_size=4), verbose=False)
    expected = sum(
        torch.nn.functional.cross_entropy(model.net(x), y, reduction="sum").item() for x, y in loader(batch_size=32)
    )
    return {
        "val_loss_sum": float(trainer.callback_metrics["val_loss_sum"]),
        "expected": expected,
        "checks": callbacks[0].checks if guard else None,
    }

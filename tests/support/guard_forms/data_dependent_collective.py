"""A collective under a condition of the rank's own data, not of the rank: ``if x.abs().max() > 10:`` then
``dist.all_reduce(outliers)`` in ``training_step`` ("count the outliers over the ranks when a batch has one"). The
data hold one outlier, sample 0, in the shard of one rank (:func:`outlier_rank`: Lightning shuffles a training
loader's DistributedSampler, seed 0): that rank alone makes the all_reduce. No line reads the rank, so no branch on
the rank is there to move the collective out of. ``fixed=True`` trains the fix: the ranks combine their decisions
first (``self.trainer.strategy.reduce_boolean_decision(found, all=False)``: the same answer on every rank), then
every rank makes the all_reduce where it holds."""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms import _plain

#: The value of the one outlier, at sample 0 (rank 0's first batch at W = 2).
OUTLIER = 100.0


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=generator).clamp(-3, 3)
    x[0, 0] = OUTLIER
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4)


def outlier_rank(world_size: int) -> int:
    """The rank whose shard holds sample 0 in epoch 0: Lightning gives a training loader
    ``DistributedSampler(shuffle=True, seed=0)`` (pytorch_lightning/trainer/connectors/data_connector.py
    ``_process_dataloader``, ``_get_distributed_sampler``)."""
    dataset = loader().dataset
    for rank in range(world_size):
        if 0 in DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0):
            return rank
    raise AssertionError("sample 0 is in no shard")


class LitClassifier(_plain.LitClassifier):
    def training_step(self, batch, batch_idx):
        x, y = batch
        if x.abs().max() > 10:
            outliers = (x.abs() > 10).sum().reshape(1)
            dist.all_reduce(outliers)
        return super().training_step(batch, batch_idx)


class FixedLitClassifier(_plain.LitClassifier):
    def training_step(self, batch, batch_idx):
        x, y = batch
        found = self.trainer.strategy.reduce_boolean_decision(bool(x.abs().max() > 10), all=False)
        if found:
            outliers = (x.abs() > 10).sum().reshape(1)
            dist.all_reduce(outliers)
            self.outliers_seen = int(outliers)
        return super().training_step(batch, batch_idx)


def train(info, fixed: bool = False, guard_timeout: float = 5.0) -> dict:
    torch.manual_seed(0)
    guard = CollectiveGuard(timeout=guard_timeout)
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[guard])
    model = FixedLitClassifier() if fixed else LitClassifier()
    trainer.fit(model, train_dataloaders=loader())
    return {"global_step": trainer.global_step, "outliers_seen": getattr(model, "outliers_seen", None)}

"""Modules written for the audit's reading of the DDP contract (tests/tooling/audit/test_audit_contract.py): each
breaks one part of the contract in its own way, and ``make_correct`` breaks none. Factories take no arguments
(``python -m ddpprobe audit tests.support.contract_modules:make_x --data tests.support.contract_modules:make_data``).

Data: ``make_data`` gives 16 samples ``x`` (4 features), ``y = x.sum()``; batches of 4, so 2 batches a rank at W=2.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from ddpprobe._lightning import pl


def _data(n: int = 16) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


def make_data() -> DataLoader:
    return DataLoader(_data(), batch_size=4)


class _Regression(pl.LightningModule):
    """A linear regression by SGD; subclasses change one thing."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def loss(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Correct(_Regression):
    """Breaks nothing: the audit finds every must-be-equal field equal and the first step equal to one process's."""


class RandomLr(_Regression):
    """Draws its learning rate at random when built (a hyperparameter search's sample), with no seed of its own:
    each rank draws from its own random state, as processes of a real launch do."""

    def __init__(self):
        super().__init__()
        self.lr = float(10 ** torch.empty(1).uniform_(-3, -1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class SummedLoss(_Regression):
    """Sums the squared errors over the batch instead of averaging them."""

    def loss(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y, reduction="sum")


class RankAttribute(_Regression):
    """Stores a loss weight from ``self.global_rank`` in ``setup`` and uses it in every step."""

    def setup(self, stage):
        self.loss_weight = 1.0 + self.global_rank

    def loss(self, batch):
        return self.loss_weight * super().loss(batch)


class WithDropout(_Regression):
    """Correct, but with a dropout before the layer: the first step cannot be compared with one process's."""

    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.25)

    def loss(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(self.drop(x)), y)


def make_correct():
    return Correct()


def make_random_lr():
    return RandomLr()


def make_summed_loss():
    return SummedLoss()


def make_rank_attribute():
    return RankAttribute()


def make_with_dropout():
    return WithDropout()


class GatherInPrepareData(_Regression):
    """Counts its samples in ``prepare_data`` and sums the count over the ranks there with an all_reduce: Lightning
    runs ``prepare_data`` on local rank 0 only, so that all_reduce has no partner."""

    def prepare_data(self):
        count = torch.tensor([16.0])
        torch.distributed.all_reduce(count)


def make_gather_in_prepare_data():
    return GatherInPrepareData()


class RaisesOnRankOne(_Regression):
    """Rank 1's own code raises at its second training batch (a value check that fails on its shard only); rank 0
    then waits in DDP's gradient all-reduce of that batch, which rank 1 never joins."""

    def training_step(self, batch, batch_idx):
        if batch_idx == 1 and self.global_rank == 1:
            raise ValueError("target out of range in this shard")
        return super().training_step(batch, batch_idx)


def make_raises_on_rank_one():
    return RaisesOnRankOne()


class GatherInSetup(_Regression):
    """Sums a count over the ranks in ``setup``, which Lightning runs on every rank: a collective every rank makes."""

    def setup(self, stage):
        count = torch.tensor([16.0])
        torch.distributed.all_reduce(count)
        self.total = float(count)


def make_gather_in_setup():
    return GatherInSetup()


class MaxReducedError(_Regression):
    """Validates with the mean absolute error of each rank's batches, then makes the ranks agree with an all_reduce
    whose op is MAX (where a mean was meant), and logs the result."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.errors = getattr(self, "errors", []) + [(self.layer(x) - y).abs().mean()]

    def on_validation_epoch_start(self):
        self.errors = []

    def on_validation_epoch_end(self):
        error = torch.stack(self.errors).mean().reshape(1)
        torch.distributed.all_reduce(error, op=torch.distributed.ReduceOp.MAX)
        self.log("val_mae", error[0])


class UnsyncedCount(_Regression):
    """Counts the validation samples it ran and logs the count with ``reduce_fx="sum"`` but no ``sync_dist``."""

    def validation_step(self, batch, batch_idx):
        self.log("val_samples", float(len(batch[0])), reduce_fx="sum")


def make_max_reduced_error():
    return MaxReducedError()


def make_unsynced_count():
    return UnsyncedCount()


class SyncedCount(_Regression):
    """``UnsyncedCount`` fixed: the count logged with ``sync_dist=True`` and ``reduce_fx="sum"`` (16 at W=1 and W=2)."""

    def validation_step(self, batch, batch_idx):
        self.log("val_samples", float(len(batch[0])), reduce_fx="sum", sync_dist=True)


def make_synced_count():
    return SyncedCount()


class OwnLoaderCycle(_Regression):
    """Sizes a ``OneCycleLR`` by ``len(self.train_dataloader())``, a loader the module builds itself (all 4 batches):
    under DDP each rank takes 2 steps, so the cycle stops half way where one process ends it."""

    def train_dataloader(self):
        return DataLoader(_data(), batch_size=4)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        total = len(self.train_dataloader())
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class StepsCycle(OwnLoaderCycle):
    """``OwnLoaderCycle`` sized by ``trainer.estimated_stepping_batches`` (the rank's own count): one process's cycle
    over the fraction of training done."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        total = int(self.trainer.estimated_stepping_batches)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def make_own_loader_cycle():
    return OwnLoaderCycle()


def make_steps_cycle():
    return StepsCycle()


class RankScaleOnValidationStart(_Regression):
    """Sets ``scale = 1 + global_rank`` in its own ``on_validation_start`` and logs the validation loss times it:
    an attribute a ``validate`` run sets from the rank before its first batch."""

    def on_validation_start(self):
        self.scale = 1.0 + self.global_rank

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.scale * self.loss(batch), sync_dist=True)


def make_rank_scale_on_validation_start():
    return RankScaleOnValidationStart()

"""The training probes: what DDP synchronizes while ``trainer.fit`` runs.

``RegressionProbe`` is a ``Linear(2, 1)`` with fixed initial weights, trained with plain SGD on the
mean squared error over ``RegressionDataset``. It records, per rank:

- ``train_ids``: ``{epoch: [ids of each training_step batch]}``, ``val_ids`` likewise for
  ``validation_step`` (the sanity check is off, so only real epochs appear);
- ``losses``: the loss of every training step (computed with the parameters before the step);
- ``params``: ``[weight_0, weight_1, bias]`` after every optimizer step (from ``on_train_batch_end``);
- ``epoch_end_metrics``: what ``self.trainer.callback_metrics`` holds in ``on_train_epoch_end``.

``BatchNormProbe`` puts a ``BatchNorm1d(2)`` in front of the linear layer and records its running
statistics (``running_mean``, ``running_var``) after every training step and at the end of ``fit``.

Scenarios: ``fit_regression`` (gradients, sampler order, epoch-end metrics), ``fit_batchnorm``
(module buffers, ``sync_batchnorm``) and ``fit_then_evaluate`` (which loop warns about
``DistributedSampler``).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from torch.utils.data import DataLoader

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import (
    batch_ids,
    ddp_trainer,
    floats,
    id_loader,
    only_loader,
    recorded_warnings,
    seed_everything,
)
from ddpprobe.probes.data import IdDataset, sample_value

#: Initial parameters of every probe's ``Linear(2, 1)``: ``weight`` (1, 2) and ``bias`` (1,).
INIT_WEIGHT = [[0.5, -0.25]]
INIT_BIAS = [0.125]


def regression_x(sample_id: int) -> list:
    """Input features of sample ``sample_id``: ``[id / 4, +1 for even ids else -1]`` (2 floats)."""
    return [sample_id / 4.0, 1.0 if sample_id % 2 == 0 else -1.0]


def regression_y(sample_id: int) -> float:
    """Regression target of sample ``sample_id``: ``(id % 3) - 1``, one of -1.0, 0.0, 1.0."""
    return float(sample_id % 3 - 1)


class RegressionDataset(IdDataset):
    """An ``IdDataset`` whose item ``i`` is ``{"id": i, "x": regression_x(i), "y": regression_y(i),
    "value": i ** 2}`` as tensors of shapes (), (2,), (), () (x, y, value float32).

    Raises:
        ValueError: ``n`` is not a positive int.
    """

    def item(self, i: int) -> dict:
        return {
            "id": torch.tensor(i),
            "x": torch.tensor(regression_x(i)),
            "y": torch.tensor(regression_y(i)),
            "value": torch.tensor(sample_value(i)),
        }


def regression_loader(n: int, batch_size: int, shuffle: bool = False) -> DataLoader:
    """A ``DataLoader`` over ``RegressionDataset(n)`` (no workers). Lightning swaps in a ``DistributedSampler``."""
    return id_loader(n, batch_size, shuffle=shuffle, dataset=RegressionDataset)


class RegressionProbe(pl.LightningModule):
    """``Linear(2, 1)`` (initialised to ``INIT_WEIGHT``/``INIT_BIAS``) trained with ``SGD(lr)`` on the MSE.

    In ``training_step`` it logs the batch mean of ``value`` as ``"value_mean"`` with
    ``on_step=False, on_epoch=True, sync_dist=True`` (and the same without ``sync_dist`` as
    ``"value_mean_local"``), then records what the module saw (see the module docstring).
    """

    def __init__(self, lr: float):
        super().__init__()
        self.lr = lr
        self.layer = torch.nn.Linear(2, 1)
        with torch.no_grad():
            self.layer.weight.copy_(torch.tensor(INIT_WEIGHT))
            self.layer.bias.copy_(torch.tensor(INIT_BIAS))
        self.train_ids: dict = {}
        self.val_ids: dict = {}
        self.losses: list = []
        self.params: list = []
        self.epoch_end_metrics: dict = {}

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def training_step(self, batch, batch_idx):
        self.train_ids.setdefault(self.current_epoch, []).append(batch_ids(batch))
        pred = self.layer(self.features(batch["x"])).squeeze(-1)
        loss = torch.nn.functional.mse_loss(pred, batch["y"])
        self.losses.append(float(loss.detach()))
        n = len(batch["id"])
        mean_value = batch["value"].mean()
        self.log("value_mean", mean_value, on_step=False, on_epoch=True, sync_dist=True, batch_size=n)
        self.log("value_mean_local", mean_value, on_step=False, on_epoch=True, batch_size=n)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        weight, bias = self.layer.weight.detach().reshape(-1), self.layer.bias.detach().reshape(-1)
        self.params.append([float(v) for v in torch.cat([weight, bias])])

    def on_train_epoch_end(self):
        self.epoch_end_metrics[self.current_epoch] = floats(
            {k: v for k, v in self.trainer.callback_metrics.items() if k.startswith("value_mean")}
        )

    def validation_step(self, batch, batch_idx):
        self.val_ids.setdefault(self.current_epoch, []).append(batch_ids(batch))

    def test_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class BatchNormProbe(RegressionProbe):
    """``BatchNorm1d(2, momentum)`` in front of ``RegressionProbe``'s linear layer.

    Records ``running`` (a list, one entry per training step, of ``{"mean": [2 floats],
    "var": [2 floats]}``, read in ``on_train_batch_end``, i.e. after this rank's own forward) and
    ``bn_class`` (the class the layer has during ``fit``: ``BatchNorm1d`` or ``SyncBatchNorm``).
    """

    def __init__(self, lr: float, momentum: float):
        super().__init__(lr)
        self.bn = torch.nn.BatchNorm1d(2, momentum=momentum)
        self.running: list = []
        self.bn_class = None

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        super().on_train_batch_end(outputs, batch, batch_idx)
        self.bn_class = type(self.bn).__name__
        self.running.append(running_stats(self.bn))


def running_stats(bn) -> dict:
    """A batch-norm layer's running statistics as ``{"mean": [C floats], "var": [C floats]}``."""
    return {"mean": [float(v) for v in bn.running_mean], "var": [float(v) for v in bn.running_var]}


def _seed(seed: Optional[int]) -> None:
    """``seed_everything(seed)``, or with ``None`` make sure no earlier global seed is in the environment
    (Lightning's ``DistributedSampler`` seed is ``PL_GLOBAL_SEED``, default 0)."""
    if seed is None:
        os.environ.pop("PL_GLOBAL_SEED", None)
    else:
        seed_everything(seed)


def fit_regression(
    info: RankInfo,
    n: int,
    batch_size: int = 2,
    max_epochs: int = 1,
    lr: float = 0.05,
    user_shuffle: bool = False,
    seed: Optional[int] = None,
    val_n: int = 0,
) -> dict:
    """Scenario: ``trainer.fit`` a ``RegressionProbe`` on ``RegressionDataset(n)``.

    Args:
        n, batch_size: the training set size and the user's ``DataLoader`` batch size.
        max_epochs: epochs to run (<= 3 keeps a world well under a second).
        lr: SGD learning rate.
        user_shuffle: the ``shuffle=`` of the user's training ``DataLoader``.
        seed: ``seed_everything(seed)`` before building the model, or ``None`` for no global seed.
        val_n: size of a validation set (``RegressionDataset(val_n)``, ``shuffle=False``); 0 for none.

    Record keys: ``train_ids``/``val_ids`` (``{epoch as str: [[ids] per batch]}``), ``losses``,
    ``params``, ``epoch_end_metrics`` (``{epoch as str: {name: float}}``), ``callback_metrics`` (after
    fit), ``train_sampler`` (class, ``shuffle``, ``seed`` of the sampler Lightning put in the training
    dataloader), ``val_sampler`` (class and ``shuffle``, or ``None``).
    """
    _seed(seed)
    torch.manual_seed(0)
    model = RegressionProbe(lr)
    trainer = ddp_trainer(info, max_epochs=max_epochs, num_sanity_val_steps=0)
    val = regression_loader(val_n, batch_size) if val_n else None
    trainer.fit(model, train_dataloaders=regression_loader(n, batch_size, shuffle=user_shuffle), val_dataloaders=val)
    train_sampler = trainer.train_dataloader.sampler
    val_sampler = only_loader(trainer.val_dataloaders).sampler if val_n else None
    return {
        "train_ids": model.train_ids,
        "val_ids": model.val_ids,
        "losses": model.losses,
        "params": model.params,
        "epoch_end_metrics": model.epoch_end_metrics,
        "callback_metrics": floats(trainer.callback_metrics),
        "train_sampler": {
            "class": type(train_sampler).__name__,
            "shuffle": getattr(train_sampler, "shuffle", None),
            "seed": getattr(train_sampler, "seed", None),
        },
        "val_sampler": None
        if val_sampler is None
        else {
            "class": type(val_sampler).__name__,
            "shuffle": getattr(val_sampler, "shuffle", None),
        },
    }


def fit_batchnorm(
    info: RankInfo,
    n: int,
    batch_size: int = 2,
    max_epochs: int = 1,
    momentum: float = 0.5,
    lr: float = 0.05,
    sync_batchnorm: bool = False,
    val_n: int = 0,
) -> dict:
    """Scenario: ``trainer.fit`` a ``BatchNormProbe`` on ``RegressionDataset(n)`` with
    ``Trainer(sync_batchnorm=sync_batchnorm)``; no global seed, so the training ``DistributedSampler``
    shuffles with seed 0.

    Every rank's shard must split into batches of at least 2 samples (batch norm refuses a batch of 1
    in training). With ``val_n`` > 0 a validation set of that size runs at the end of each epoch.

    Record keys: ``train_ids``, ``running`` (per training step, after this rank's forward), ``final``
    (``{"mean", "var"}`` held when ``fit`` returned), ``bn_class``.
    """
    _seed(None)
    torch.manual_seed(0)
    model = BatchNormProbe(lr, momentum)
    trainer = ddp_trainer(info, max_epochs=max_epochs, num_sanity_val_steps=0, sync_batchnorm=sync_batchnorm)
    val = regression_loader(val_n, batch_size) if val_n else None
    trainer.fit(model, train_dataloaders=regression_loader(n, batch_size), val_dataloaders=val)
    return {
        "train_ids": model.train_ids,
        "running": model.running,
        "final": running_stats(model.bn),
        "bn_class": model.bn_class,
    }


def fit_then_evaluate(info: RankInfo, n: int, batch_size: int = 2) -> dict:
    """Scenario: one ``Trainer`` runs ``fit`` (one epoch, with a validation set and the default sanity
    check), then ``validate`` and ``test``, each on ``RegressionDataset(n)`` with ``shuffle=False``.

    Record key: ``warnings``, ``{"fit" | "validate" | "test": [{"category", "message"}]}``, what was
    raised during each call.
    """
    _seed(None)
    torch.manual_seed(0)
    model = RegressionProbe(lr=0.05)
    trainer = ddp_trainer(info, max_epochs=1)
    phases = {}
    with recorded_warnings() as phases["fit"]:
        trainer.fit(model, regression_loader(n, batch_size), regression_loader(n, batch_size))
    with recorded_warnings() as phases["validate"]:
        trainer.validate(model, regression_loader(n, batch_size), verbose=False)
    with recorded_warnings() as phases["test"]:
        trainer.test(model, regression_loader(n, batch_size), verbose=False)
    return {"warnings": phases}

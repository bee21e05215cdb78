"""Scenarios for tests/tooling/guard/test_guard_breaking.py: modules written the way users write them
(Lightning's ``BoringModel`` from tests/support/boring.py, torchmetrics objects, several stages and
dataloaders, manual optimization, their own barriers), run with ``CollectiveGuard`` (``guard=True``) or
without it, and a few hazards the facts do not cover.

Every record holds ``pg_seq`` (how far the default process group's sequence number moved in the run:
how many collectives the backend ran) and ``checks`` (the checks the guard passed in its last stage;
None without the guard), like tests/support/guarded.py. The modules live in the test tree, outside the
``ddpprobe`` package, so their calls read as a user's code would.
"""

import os

import torch
import torchmetrics
from torch.utils.data import DataLoader, Subset

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer, floats, id_loader, seed_everything
from ddpprobe.probes.data import IdDataset
from ddpprobe.trace import pg_seq
from tests.support.boring import BoringModel


def _callbacks(guard: bool) -> list:
    return [CollectiveGuard()] if guard else []


def _checks(callbacks: list):
    guard = next((c for c in callbacks if isinstance(c, CollectiveGuard)), None)
    return None if guard is None else guard.checks


def _weights(model) -> list:
    return [p.detach().flatten().tolist() for p in model.parameters()]


def _ckpt_files(info) -> list:
    return sorted(
        os.path.relpath(os.path.join(root, name), info.world_dir)
        for root, _, names in os.walk(info.world_dir)
        for name in names
        if name.endswith(".ckpt")
    )


# ---------------------------------------------------------------------------------------------
# 1. Lightning's BoringModel with the progress bar, ModelCheckpoint and EarlyStopping
# ---------------------------------------------------------------------------------------------


class MonitoredBoringModel(BoringModel):
    """``BoringModel`` logging its training loss on step and epoch to the progress bar (no sync) and its
    validation loss ``val_loss`` with ``sync_dist=True`` (the key the callbacks monitor)."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("train_loss", out["loss"], prog_bar=True, on_step=True, on_epoch=True)
        return out

    def validation_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.log("val_loss", loss, prog_bar=True, sync_dist=True)
        return {"x": loss}


def boring_fit(info, guard: bool = True) -> dict:
    """Scenario: 2 epochs of ``trainer.fit(MonitoredBoringModel())`` (its own random data, seeded with 0,
    sharded by Lightning's DistributedSampler) with the progress bar on, ``log_every_n_steps=1``, a
    ``CSVLogger``, ``ModelCheckpoint(monitor="val_loss")`` and ``EarlyStopping(monitor="val_loss")``.

    Record keys: ``callback_metrics``, ``weights``, ``best_model_score``, ``best_model_path`` (its file
    name), ``stopped_epoch``, ``global_step``, ``pg_seq``, ``checks``."""
    seed_everything(0)
    model = MonitoredBoringModel()
    checkpoint = pl.callbacks.ModelCheckpoint(
        dirpath=os.path.join(info.world_dir, "checkpoints"), monitor="val_loss", mode="min", save_top_k=1
    )
    stopping = pl.callbacks.EarlyStopping(monitor="val_loss", mode="min", patience=1)
    callbacks = [checkpoint, stopping] + _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(
        info,
        max_epochs=2,
        limit_train_batches=4,
        limit_val_batches=3,
        log_every_n_steps=1,
        enable_progress_bar=True,
        enable_checkpointing=True,
        logger=pl.loggers.CSVLogger(info.rank_dir),
        callbacks=callbacks,
    )
    trainer.fit(model)
    return {
        "callback_metrics": floats(trainer.callback_metrics),
        "weights": _weights(model),
        "best_model_score": float(checkpoint.best_model_score),
        "best_model_path": os.path.basename(checkpoint.best_model_path),
        "stopped_epoch": stopping.stopped_epoch,
        "global_step": trainer.global_step,
        "pg_seq": pg_seq() - (before or 0),
        "checks": _checks(callbacks),
    }


# ---------------------------------------------------------------------------------------------
# 2. torchmetrics objects logged with self.log / self.log_dict, sync_dist scalars, self.all_gather
# ---------------------------------------------------------------------------------------------


class MetricsModule(pl.LightningModule):
    """Classifies ``IdDataset`` samples by their ``pred`` field and scores it against ``target``:
    ``BinaryAccuracy`` logged with ``self.log("acc", metric)``, a ``MetricCollection`` of precision and
    recall with ``self.log_dict``, a ``MeanMetric`` of ``value`` with ``self.log``, the batch's mean
    ``value`` with ``sync_dist=True``, and in ``on_validation_epoch_end`` the ids each rank saw gathered
    with ``self.all_gather`` (kept in ``gathered``). Training fits a ``Linear(2, 1)`` on ``x``."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.acc = torchmetrics.classification.BinaryAccuracy()
        self.scores = torchmetrics.MetricCollection(
            {
                "precision": torchmetrics.classification.BinaryPrecision(),
                "recall": torchmetrics.classification.BinaryRecall(),
            },
            prefix="val_",
        )
        self.mean_value = torchmetrics.MeanMetric()
        self.train_acc = torchmetrics.classification.BinaryAccuracy()
        self.ids = []
        self.gathered = []

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch["x"] / 100.0).pow(2).mean()
        self.train_acc(batch["pred"], batch["target"])
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=True, prog_bar=True)
        self.log("train_loss", loss, sync_dist=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.ids.extend(batch["id"].tolist())
        self.acc(batch["pred"], batch["target"])
        self.log("acc", self.acc, prog_bar=True)
        self.scores.update(batch["pred"], batch["target"])
        self.log_dict(self.scores)
        self.mean_value.update(batch["value"])
        self.log("mean_value", self.mean_value)
        self.log("value_sync", batch["value"].mean(), sync_dist=True, prog_bar=True)

    def on_validation_epoch_end(self):
        self.gathered.append(self.all_gather(torch.tensor(self.ids)).tolist())
        self.ids = []

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def metrics_fit(info, n: int, batch_size: int, guard: bool = True) -> dict:
    """Scenario: 2 epochs of ``trainer.fit(MetricsModule())`` over ``IdDataset(n)`` for training and
    validation (default sanity check, progress bar on, ``log_every_n_steps=1``), then ``trainer.validate``.

    Record keys: ``fit_metrics``, ``logged_metrics``, ``validate_metrics``, ``gathered``, ``weights``,
    ``pg_seq``, ``checks``."""
    seed_everything(0)
    model = MetricsModule()
    callbacks = _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(info, max_epochs=2, log_every_n_steps=1, enable_progress_bar=True, callbacks=callbacks)
    loader = id_loader(n, batch_size)
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=loader)
    fit_metrics, logged = floats(trainer.callback_metrics), floats(trainer.logged_metrics)
    trainer.validate(model, dataloaders=loader, verbose=False)
    return {
        "fit_metrics": fit_metrics,
        "logged_metrics": logged,
        "validate_metrics": floats(trainer.callback_metrics),
        "gathered": model.gathered,
        "weights": _weights(model),
        "pg_seq": pg_seq() - (before or 0),
        "checks": _checks(callbacks),
    }


# ---------------------------------------------------------------------------------------------
# 3. Stages: fit with two val dataloaders, then test, validate, predict with the same guard
# ---------------------------------------------------------------------------------------------


class StagesModule(pl.LightningModule):
    """Fits a ``Linear(2, 1)`` on ``IdDataset`` samples (loss: the output's square) and logs with
    ``sync_dist=True``: ``loss`` in training, ``v`` per validation dataloader (Lightning suffixes
    ``/dataloader_idx_<i>``), ``t`` in test; ``predict_step`` returns the ids and outputs."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def _out(self, batch):
        return self.layer(batch["x"] / 100.0).squeeze(-1)

    def training_step(self, batch, batch_idx):
        loss = self._out(batch).pow(2).mean()
        self.log("loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("v", self._out(batch).mean() + batch["value"].mean(), sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.log("t", self._out(batch).mean(), sync_dist=True, on_step=True)

    def predict_step(self, batch, batch_idx):
        return {"id": batch["id"].tolist(), "out": self._out(batch).tolist()}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def stages(info, num_sanity_val_steps: int = 2, guard: bool = True) -> dict:
    """Scenario: ``trainer.fit(StagesModule())`` for 4 epochs over ``IdDataset(12)`` in batches of 2 with
    ``accumulate_grad_batches=2``, ``check_val_every_n_epoch=2``, two validation dataloaders
    (``IdDataset(7)`` and ``IdDataset(9)``) cut by ``limit_val_batches=2`` and ``num_sanity_val_steps``;
    then on the same Trainer (the same guard instance) ``trainer.test``, ``trainer.validate`` and
    ``trainer.predict``.

    Record keys: ``fit``, ``test``, ``test_returned``, ``validate``, ``validate_returned``, ``predictions``,
    ``weights``, ``global_step``, ``pg_seq``, ``checks`` (of the last stage, predict)."""
    seed_everything(0)
    model = StagesModule()
    callbacks = _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(
        info,
        max_epochs=4,
        accumulate_grad_batches=2,
        check_val_every_n_epoch=2,
        limit_val_batches=2,
        num_sanity_val_steps=num_sanity_val_steps,
        callbacks=callbacks,
    )
    val = [id_loader(7, 2), id_loader(9, 2)]
    trainer.fit(model, train_dataloaders=id_loader(12, 2), val_dataloaders=val)
    record = {"fit": floats(trainer.callback_metrics), "global_step": trainer.global_step, "weights": _weights(model)}
    returned = trainer.test(model, dataloaders=id_loader(5, 2), verbose=False)
    record.update(test=floats(trainer.callback_metrics), test_returned=[floats(d) for d in returned])
    returned = trainer.validate(model, dataloaders=val, verbose=False)
    record.update(validate=floats(trainer.callback_metrics), validate_returned=[floats(d) for d in returned])
    record["predictions"] = trainer.predict(model, dataloaders=id_loader(5, 2))
    record.update(pg_seq=pg_seq() - (before or 0), checks=_checks(callbacks))
    return record


# ---------------------------------------------------------------------------------------------
# 4. Per-rank shards: different ids, a short last batch, metric states of different sizes
# ---------------------------------------------------------------------------------------------


class ShardModule(pl.LightningModule):
    """Validates ``IdDataset`` samples: a ``CatMetric`` of the ids and a ``MeanMetric`` of ``value``,
    updated every batch and computed on every rank in ``on_validation_epoch_end`` (kept in ``computed``;
    the ``MeanMetric`` also logged), the batch's mean ``value`` logged with ``sync_dist=True`` on step
    and epoch, and the ids this rank saw (``seen_ids``)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.cat = torchmetrics.CatMetric()
        self.mean = torchmetrics.MeanMetric()
        self.seen_ids = []
        self.computed = None

    def validation_step(self, batch, batch_idx):
        self.seen_ids.extend(batch["id"].tolist())
        self.cat.update(batch["id"].float())
        self.mean.update(batch["value"])
        self.log("v", batch["value"].mean(), sync_dist=True, on_step=True, batch_size=len(batch["id"]))

    def on_validation_epoch_end(self):
        self.computed = {"cat": sorted(self.cat.compute().tolist()), "mean": float(self.mean.compute())}
        self.log("mean", self.mean.compute())
        self.cat.reset()
        self.mean.reset()


def _rank_loader(info, sizes: list, batch_size: int) -> DataLoader:
    start = sum(sizes[: info.rank])
    subset = Subset(IdDataset(sum(sizes)), list(range(start, start + sizes[info.rank])))
    return DataLoader(subset, batch_size=batch_size)


def shards(info, n=None, batch_size: int = 2, sizes=None, guard: bool = True, limit=None) -> dict:
    """Scenario: ``trainer.validate(ShardModule())``: over ``IdDataset(n)`` sharded by Lightning's
    DistributedSampler, or, with ``sizes``, over ``sizes[r]`` consecutive samples on rank ``r`` (no
    DistributedSampler: ``use_distributed_sampler=False``), in batches of ``batch_size``, cut to ``limit``
    batches (``limit_val_batches``) when given.

    Record keys: ``seen_ids``, ``computed``, ``callback_metrics``, ``logged_metrics``, ``pg_seq``, ``checks``."""
    model = ShardModule()
    callbacks = _callbacks(guard)
    before = pg_seq()
    if sizes is None:
        trainer = ddp_trainer(info, callbacks=callbacks)
        loader = id_loader(n, batch_size)
    else:
        trainer = ddp_trainer(info, callbacks=callbacks, use_distributed_sampler=False, limit_val_batches=limit)
        loader = _rank_loader(info, sizes, batch_size)
    trainer.validate(model, dataloaders=loader, verbose=False)
    return {
        "seen_ids": model.seen_ids,
        "computed": model.computed,
        "callback_metrics": floats(trainer.callback_metrics),
        "logged_metrics": floats(trainer.logged_metrics),
        "pg_seq": pg_seq() - (before or 0),
        "checks": _checks(callbacks),
    }


# ---------------------------------------------------------------------------------------------
# 5. Manual optimization; the module's own barriers
# ---------------------------------------------------------------------------------------------


class ManualBarrierModule(pl.LightningModule):
    """Fits a ``Linear(2, 1)`` with manual optimization (``automatic_optimization = False``:
    ``manual_backward`` and ``optimizer.step`` in ``training_step``), logging ``loss`` with
    ``sync_dist=True``; with ``barriers``, every rank also calls ``self.trainer.strategy.barrier()`` in
    every ``training_step`` and in ``on_train_epoch_end`` and ``on_validation_epoch_end``."""

    def __init__(self, barriers: bool):
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(2, 1)
        self.barriers = barriers

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = self.layer(batch["x"] / 100.0).pow(2).mean()
        self.manual_backward(loss)
        opt.step()
        if self.barriers:
            self.trainer.strategy.barrier()
        self.log("loss", loss, sync_dist=True)

    def validation_step(self, batch, batch_idx):
        self.log("v", self.layer(batch["x"] / 100.0).mean(), sync_dist=True)

    def on_train_epoch_end(self):
        if self.barriers:
            self.trainer.strategy.barrier()

    def on_validation_epoch_end(self):
        if self.barriers:
            self.trainer.strategy.barrier("epoch_end")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def manual_fit(info, barriers: bool, guard: bool = True) -> dict:
    """Scenario: 2 epochs of ``trainer.fit(ManualBarrierModule(barriers))`` over ``IdDataset(8)`` in
    batches of 2, validated on ``IdDataset(4)``. Record keys: ``callback_metrics``, ``weights``,
    ``global_step``, ``pg_seq``, ``checks``."""
    seed_everything(0)
    model = ManualBarrierModule(barriers)
    callbacks = _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(info, max_epochs=2, callbacks=callbacks)
    trainer.fit(model, train_dataloaders=id_loader(8, 2), val_dataloaders=id_loader(4, 2))
    return {
        "callback_metrics": floats(trainer.callback_metrics),
        "weights": _weights(model),
        "global_step": trainer.global_step,
        "pg_seq": pg_seq() - (before or 0),
        "checks": _checks(callbacks),
    }


# ---------------------------------------------------------------------------------------------
# Hazards
# ---------------------------------------------------------------------------------------------


class HazardModule(pl.LightningModule):
    """Validates ``IdDataset`` samples with one hazard, by ``hazard``:

    ``"rank0_barrier"``
        ``if self.global_rank == 0: self.trainer.strategy.barrier()`` in ``validation_step``.
    ``"alternate_compute"``
        a ``MeanMetric`` of ``value`` updated every batch, its ``compute()`` called when
        ``batch_idx % 2 == self.global_rank`` (a different batch on each rank).
    ``"broadcast_own_rank"``
        ``self.trainer.strategy.broadcast(rank, src=self.global_rank)`` in ``on_validation_epoch_end``:
        every rank names itself as the source.
    """

    def __init__(self, hazard: str):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.hazard = hazard
        self.mean = torchmetrics.MeanMetric()
        self.received = None

    def validation_step(self, batch, batch_idx):
        if self.hazard == "rank0_barrier" and self.global_rank == 0:
            self.trainer.strategy.barrier()
        if self.hazard == "alternate_compute":
            self.mean.update(batch["value"])
            if batch_idx % 2 == self.global_rank:
                self.mean.compute()

    def on_validation_epoch_end(self):
        if self.hazard == "broadcast_own_rank":
            self.received = self.trainer.strategy.broadcast(self.global_rank, src=self.global_rank)


def hazard(info, hazard: str, n: int = 8, batch_size: int = 1, guard: bool = True) -> dict:
    """Scenario: ``trainer.validate(HazardModule(hazard))`` over ``IdDataset(n)`` in batches of
    ``batch_size``. Record keys: ``received``, ``pg_seq``, ``checks``."""
    model = HazardModule(hazard)
    callbacks = _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(info, callbacks=callbacks)
    trainer.validate(model, dataloaders=id_loader(n, batch_size), verbose=False)
    return {"received": model.received, "pg_seq": pg_seq() - (before or 0), "checks": _checks(callbacks)}


class PredictGatherModule(pl.LightningModule):
    """``predict_step`` returns the batch's ids and, with ``gather``, first calls ``self.all_gather`` on
    them (a collective in every predict batch)."""

    def __init__(self, gather: bool):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.gather = gather

    def predict_step(self, batch, batch_idx):
        if self.gather:
            self.all_gather(batch["id"])
        return batch["id"].tolist()


def predict_gather(info, n: int, batch_size: int, gather: bool = True, guard: bool = True) -> dict:
    """Scenario: ``trainer.predict(PredictGatherModule(gather))`` over ``IdDataset(n)`` in batches of
    ``batch_size`` (Lightning shards it with ``UnrepeatedDistributedSamplerWrapper``: no padding).
    Record keys: ``predictions``, ``pg_seq``, ``checks``."""
    callbacks = _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(info, callbacks=callbacks)
    predictions = trainer.predict(PredictGatherModule(gather), dataloaders=id_loader(n, batch_size))
    return {"predictions": predictions, "pg_seq": pg_seq() - (before or 0), "checks": _checks(callbacks)}


# ---------------------------------------------------------------------------------------------
# Mid-epoch validation, differentiable all_gather, checkpoints every step, a callback's collective
# ---------------------------------------------------------------------------------------------


class GatherGradModule(StagesModule):
    """``StagesModule`` whose training loss is the mean square of every rank's outputs, gathered with
    ``self.all_gather(out, sync_grads=True)`` (a differentiable all_gather: its backward is a collective
    too, made during ``loss.backward()``)."""

    def training_step(self, batch, batch_idx):
        loss = self.all_gather(self._out(batch), sync_grads=True).pow(2).mean()
        self.log("loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("v", self._out(batch).mean() + batch["value"].mean(), sync_dist=True)


class GatherCallback(pl.Callback):
    """A user's callback that gathers the module's weights with ``pl_module.all_gather`` at every
    validation epoch's end on every rank (kept in ``gathered``)."""

    def __init__(self):
        self.gathered = []

    def on_validation_epoch_end(self, trainer, pl_module):
        self.gathered.append(pl_module.all_gather(pl_module.layer.weight.detach()).tolist())


def gather_grad_fit(info, guard: bool = True) -> dict:
    """Scenario: 2 epochs of ``trainer.fit(GatherGradModule())`` over ``IdDataset(16)`` in batches of 2
    with ``val_check_interval=0.5`` (validation twice per epoch, on ``IdDataset(6)``), a ``GatherCallback``
    and ``ModelCheckpoint(save_last=True, every_n_train_steps=1, save_top_k=-1)``.

    Record keys: ``callback_metrics``, ``weights``, ``gathered`` (the callback's), ``global_step``,
    ``last_model_path`` (its file name), ``pg_seq``, ``checks``."""
    seed_everything(0)
    model = GatherGradModule()
    gather = GatherCallback()
    checkpoint = pl.callbacks.ModelCheckpoint(
        dirpath=os.path.join(info.world_dir, "checkpoints"), save_last=True, every_n_train_steps=1, save_top_k=-1
    )
    callbacks = [gather, checkpoint] + _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(info, max_epochs=2, val_check_interval=0.5, enable_checkpointing=True, callbacks=callbacks)
    trainer.fit(model, train_dataloaders=id_loader(16, 2), val_dataloaders=id_loader(6, 2))
    return {
        "callback_metrics": floats(trainer.callback_metrics),
        "weights": _weights(model),
        "gathered": gather.gathered,
        "global_step": trainer.global_step,
        "last_model_path": os.path.basename(checkpoint.last_model_path),
        "pg_seq": pg_seq() - (before or 0),
        "checks": _checks(callbacks),
    }


def limited_fit(info, sizes: list, limit=None, max_steps: int = -1, guard: bool = True) -> dict:
    """Scenario: 2 epochs of ``trainer.fit(StagesModule())`` over ``sizes[r]`` consecutive samples on rank
    ``r`` (no DistributedSampler) in batches of 2, training and validation cut to ``limit`` batches
    (``limit_train_batches`` / ``limit_val_batches``, the common cure for shards of different lengths;
    no validation without ``limit``), stopping at ``max_steps`` optimizer steps.

    Record keys: ``callback_metrics``, ``weights``, ``global_step``, ``pg_seq``, ``checks``."""
    seed_everything(0)
    model = StagesModule()
    callbacks = _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(
        info,
        max_epochs=2,
        max_steps=max_steps,
        limit_train_batches=limit,
        limit_val_batches=limit if limit is not None else 0,
        use_distributed_sampler=False,
        callbacks=callbacks,
    )
    loader = _rank_loader(info, sizes, 2)
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=loader)
    return {
        "callback_metrics": floats(trainer.callback_metrics),
        "weights": _weights(model),
        "global_step": trainer.global_step,
        "pg_seq": pg_seq() - (before or 0),
        "checks": _checks(callbacks),
    }


class RankZeroLogModule(pl.LightningModule):
    """Logs ``v`` (the batch's mean ``value``) with ``sync_dist=True`` on every rank, and on rank 0 only
    ``rank0`` with ``rank_zero_only=True`` (Lightning's way to log what only rank 0 has: never synced),
    in ``validation_step`` and ``on_validation_epoch_end``."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def validation_step(self, batch, batch_idx):
        self.log("v", batch["value"].mean(), sync_dist=True)
        if self.global_rank == 0:
            self.log("rank0", batch["value"].max(), rank_zero_only=True)

    def on_validation_epoch_end(self):
        if self.global_rank == 0:
            self.log("rank0_end", 1.0, rank_zero_only=True)
        self.log("v_end", float(self.global_rank), sync_dist=True)


def rank_zero_log(info, n: int, guard: bool = True) -> dict:
    """Scenario: ``trainer.validate(RankZeroLogModule())`` over ``IdDataset(n)`` in batches of 2.
    Record keys: ``callback_metrics``, ``pg_seq``, ``checks``."""
    callbacks = _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(info, callbacks=callbacks)
    trainer.validate(RankZeroLogModule(), dataloaders=id_loader(n, 2), verbose=False)
    return {
        "callback_metrics": floats(trainer.callback_metrics),
        "pg_seq": pg_seq() - (before or 0),
        "checks": _checks(callbacks),
    }

"""Scenarios for tests/tooling/guard/test_guard_correct_runs.py: correct runs written the way users write
them (gradient accumulation with a partial last group, mid-epoch validation, ``ReduceLROnPlateau`` on a
synced monitor, ``LearningRateMonitor``, several optimizers, ``limit_*_batches``,
``check_val_every_n_epoch``, a ``LightningDataModule``, ``trainer.test`` and ``trainer.predict`` after
fit, manual optimization stopped by ``max_steps`` over shards of different lengths), with
``CollectiveGuard`` (``guard=True``) or without it.

Every record holds the values the run produced on its rank, ``pg_seq`` (how far the default process
group's sequence number moved: how many collectives the backend ran) and ``checks`` (the checks the guard
passed in its last stage; None without the guard), like tests/support/guard_breaking.py, whose modules
and helpers these reuse.
"""

import os
import time

import torch
from torch.utils.data import DataLoader

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer, floats, id_loader, seed_everything
from ddpprobe.probes.data import IdDataset
from ddpprobe.trace import pg_seq
from tests.support.guard_breaking import StagesModule, _callbacks, _checks, _rank_loader, _weights


def _record(trainer, model, callbacks: list, before, **fields) -> dict:
    return {
        "callback_metrics": floats(trainer.callback_metrics),
        "weights": _weights(model),
        "global_step": trainer.global_step,
        "pg_seq": pg_seq() - (before or 0),
        "checks": _checks(callbacks),
        **fields,
    }


class PlateauModule(StagesModule):
    """``StagesModule`` whose SGD learning rate ``ReduceLROnPlateau`` halves when the synced validation
    value ``v`` (``sync_dist=True``) stops falling (``patience=0``), checked at every validation."""

    def validation_step(self, batch, batch_idx):
        # grows with every validation (the ids do not change, the weights do): the plateau is reached
        self.log("v", self._out(batch).pow(2).mean() + float(self.current_epoch), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "v"}}


def accumulate_plateau(info, guard: bool = True) -> dict:
    """Scenario: 3 epochs of ``trainer.fit(PlateauModule())`` over ``IdDataset(7 * W)`` in batches of 1
    (7 batches per rank), ``accumulate_grad_batches=3`` (groups of 3, 3 and a partial 1), validation twice
    an epoch (``val_check_interval=0.5``) over half the validation batches (``limit_val_batches=0.5``),
    ``LearningRateMonitor`` on a ``CSVLogger``, ``log_every_n_steps=1``.

    Record keys: ``callback_metrics``, ``weights``, ``global_step``, ``lrs`` (what the monitor recorded),
    ``lr`` (the optimizer's learning rate after the fit), ``pg_seq``, ``checks``."""
    seed_everything(0)
    model = PlateauModule()
    monitor = pl.callbacks.LearningRateMonitor(logging_interval="step")
    callbacks = [monitor] + _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(
        info,
        max_epochs=3,
        accumulate_grad_batches=3,
        val_check_interval=0.5,
        limit_val_batches=0.5,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        logger=pl.loggers.CSVLogger(info.rank_dir),
        callbacks=callbacks,
    )
    loader = id_loader(7 * info.world_size, 1)
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=id_loader(4 * info.world_size, 1))
    lrs = {name: [float(v) for v in values] for name, values in monitor.lrs.items()}
    return _record(trainer, model, callbacks, before, lrs=lrs, lr=trainer.optimizers[0].param_groups[0]["lr"])


class TwoOptimizersModule(StagesModule):
    """Two ``Linear(2, 1)`` layers, each with its own optimizer (SGD and Adam), both stepped after one
    ``manual_backward`` of their joint loss in ``training_step`` (manual optimization, as Lightning 2
    requires for several optimizers), the loss logged with ``sync_dist=True``; ``global_step`` and
    ``max_steps`` count both optimizers' steps."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.other = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        x = batch["x"] / 100.0
        loss = (self.layer(x) + 2 * self.other(x)).pow(2).mean()
        optimizers = self.optimizers()
        for opt in optimizers:
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in optimizers:
            opt.step()
        self.log("loss", loss, sync_dist=True)

    def configure_optimizers(self):
        return [torch.optim.SGD(self.layer.parameters(), lr=0.1), torch.optim.Adam(self.other.parameters(), lr=0.01)]


def two_optimizers(info, sizes=None, max_steps: int = -1, guard: bool = True) -> dict:
    """Scenario: 2 epochs of ``trainer.fit(TwoOptimizersModule())`` in batches of 2: over ``IdDataset(8 *
    W)`` sharded by Lightning, or, with ``sizes``, over ``sizes[r]`` consecutive samples on rank ``r`` (no
    DistributedSampler), stopping at ``max_steps`` optimizer steps (two per batch), no validation.

    Record keys: ``callback_metrics``, ``weights``, ``global_step``, ``pg_seq``, ``checks``."""
    seed_everything(0)
    model = TwoOptimizersModule()
    callbacks = _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(
        info,
        max_epochs=2,
        max_steps=max_steps,
        limit_val_batches=0,
        use_distributed_sampler=sizes is None,
        callbacks=callbacks,
    )
    loader = id_loader(8 * info.world_size, 2) if sizes is None else _rank_loader(info, sizes, 2)
    trainer.fit(model, train_dataloaders=loader)
    return _record(trainer, model, callbacks, before)


class IdDataModule(pl.LightningDataModule):
    """``IdDataset`` train/val/test/predict splits of ``n`` samples each in batches of 2; ``prepare_data``
    (called on local rank 0 only) and ``setup`` count their calls (``prepared``, ``set_up``)."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n
        self.prepared = 0
        self.set_up = []

    def prepare_data(self):
        self.prepared += 1

    def setup(self, stage: str):
        self.set_up.append(stage)

    def _loader(self):
        return DataLoader(IdDataset(self.n), batch_size=2)

    train_dataloader = val_dataloader = test_dataloader = predict_dataloader = _loader


def datamodule_stages(info, guard: bool = True) -> dict:
    """Scenario: ``trainer.fit(StagesModule(), datamodule=IdDataModule(12 * W))`` for 4 epochs, validated
    every second epoch (``check_val_every_n_epoch=2``), three quarters of the training batches
    (``limit_train_batches=0.75``) and 2 validation batches (``limit_val_batches=2``); then
    ``trainer.test`` and ``trainer.predict`` on the same Trainer and datamodule.

    Record keys: ``callback_metrics`` (after fit), ``weights``, ``global_step``, ``tested`` (test's
    ``callback_metrics``), ``predicted`` (this rank's predictions: ids and outputs), ``prepared``,
    ``set_up``, ``pg_seq``, ``checks`` (of the predict stage)."""
    seed_everything(0)
    model = StagesModule()
    data = IdDataModule(12 * info.world_size)
    callbacks = _callbacks(guard)
    before = pg_seq()
    trainer = ddp_trainer(
        info,
        max_epochs=4,
        check_val_every_n_epoch=2,
        limit_train_batches=0.75,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    trainer.fit(model, datamodule=data)
    fitted = floats(trainer.callback_metrics)
    trainer.test(model, datamodule=data, verbose=False)
    tested = floats(trainer.callback_metrics)
    predicted = trainer.predict(model, datamodule=data)
    return _record(
        trainer,
        model,
        callbacks,
        before,
        callback_metrics=fitted,
        tested=tested,
        predicted=predicted,
        prepared=data.prepared,
        set_up=data.set_up,
    )


class SlowWriteIO(pl.plugins.TorchCheckpointIO):
    """Lightning's checkpoint writer, ``write_s`` seconds slower per checkpoint (a slow file system)."""

    def __init__(self, write_s: float):
        super().__init__()
        self.write_s = write_s

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        time.sleep(self.write_s)
        super().save_checkpoint(checkpoint, path, storage_options)


class SlowPrepareModule(StagesModule):
    """``StagesModule`` whose ``prepare_data`` (local rank 0 only) takes ``prepare_s`` seconds."""

    def __init__(self, prepare_s: float):
        super().__init__()
        self.prepare_s = prepare_s

    def prepare_data(self):
        time.sleep(self.prepare_s)


def slow_steps(info, guard_timeout: float, write_s: float = 0.0, prepare_s: float = 0.0, guard: bool = True) -> dict:
    """Scenario: 2 epochs of ``trainer.fit(SlowPrepareModule(prepare_s))`` over ``IdDataset(4 * W)`` in
    batches of 2 with ``ModelCheckpoint`` saving every epoch through ``SlowWriteIO(write_s)``, under
    ``CollectiveGuard(timeout=guard_timeout)``.

    Record keys: ``callback_metrics``, ``weights``, ``global_step``, ``files`` (the checkpoints written),
    ``pg_seq``, ``checks``."""
    seed_everything(0)
    model = SlowPrepareModule(prepare_s)
    checkpoint = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(info.world_dir, "ckpt"), save_top_k=-1)
    callbacks = [checkpoint] + ([CollectiveGuard(timeout=guard_timeout)] if guard else [])
    before = pg_seq()
    trainer = ddp_trainer(
        info, max_epochs=2, enable_checkpointing=True, callbacks=callbacks, plugins=[SlowWriteIO(write_s)]
    )
    trainer.fit(model, train_dataloaders=id_loader(4 * info.world_size, 2), val_dataloaders=id_loader(4, 2))
    files = sorted(os.listdir(checkpoint.dirpath)) if os.path.isdir(checkpoint.dirpath) else []
    return _record(trainer, model, callbacks, before, files=files)

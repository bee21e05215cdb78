"""Modules for the audit's fidelity tests (tests/tooling/audit/test_audit_fidelity.py): the reference is the user's
single process, an equality is proven under a second split of the samples, padding is told apart from a cause.

The F1 data (:func:`make_f1_8`) is chosen so that every competing semantics gives another number. Sample ``i``
carries its own prediction and target (the model's weights play no part, so every run scores the same outputs):

====  ===  ===  ===  ===  ===  ===  ===  ===
i     0    1    2    3    4    5    6    7
====  ===  ===  ===  ===  ===  ===  ===  ===
kind  FP   FP   FP   TN   FN   FN   FN   TP
====  ===  ===  ===  ===  ===  ===  ===  ===

F1 = 2 TP / (2 TP + FP + FN). Over the whole set 2 / (2 + 3 + 3) = 1/4. At W=2 ``DistributedSampler`` gives rank 0
samples 0, 2, 4, 6 (F1 0) and rank 1 samples 1, 3, 5, 7 (F1 2 / 4 = 1/2): the mean of the ranks' F1 is 1/4, equal to
the whole set's by chance. Split into contiguous blocks (0-3 and 4-7) the ranks' F1 are 0 and 2 / 5, mean 1/5.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from ddpprobe._lightning import pl

#: (prediction, target) of each sample of :func:`make_f1_8` (module docstring).
F1_8 = [(1, 0), (1, 0), (1, 0), (0, 0), (0, 1), (0, 1), (0, 1), (1, 1)]


class Scored(Dataset):
    """Sample ``i``: ``{"id": i, "pred": p, "target": t}`` from a list of ``(p, t)``."""

    def __init__(self, outcomes: list):
        self.outcomes = list(outcomes)

    def __len__(self) -> int:
        return len(self.outcomes)

    def __getitem__(self, i: int) -> dict:
        pred, target = self.outcomes[i]
        return {"id": i, "pred": pred, "target": target}


def f1_of(pairs) -> float:
    """F1 of ``[(prediction, target)]`` (0 where there is no positive prediction or target), computed here from
    its definition, not by any library the audited modules use."""
    tp = sum(1 for p, t in pairs if p and t)
    fp = sum(1 for p, t in pairs if p and not t)
    fn = sum(1 for p, t in pairs if t and not p)
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


class PerRankF1(pl.LightningModule):
    """The seed question's bug: each rank keeps its predictions and targets in lists and computes F1 from them in
    ``on_validation_epoch_end``, logged with ``sync_dist`` as given (the ranks' F1 are then averaged)."""

    def __init__(self, sync_dist: bool):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.sync_dist = sync_dist
        self.preds, self.targets = [], []

    def validation_step(self, batch, batch_idx):
        self.preds += batch["pred"].tolist()
        self.targets += batch["target"].tolist()

    def on_validation_epoch_end(self):
        pairs = list(zip(self.preds, self.targets))
        tp = sum(1 for p, t in pairs if p and t)
        wrong = sum(1 for p, t in pairs if bool(p) != bool(t))
        f1 = 2 * tp / (2 * tp + wrong) if tp + wrong else 0.0
        self.log("val_f1", torch.tensor(f1), sync_dist=self.sync_dist)
        self.preds, self.targets = [], []


def make_synced_per_rank_f1() -> PerRankF1:
    return PerRankF1(sync_dist=True)


def make_unsynced_per_rank_f1() -> PerRankF1:
    return PerRankF1(sync_dist=False)


def make_f1_8() -> DataLoader:
    """The 8 samples of the module docstring in batches of 2."""
    return DataLoader(Scored(F1_8), batch_size=2)


class MetricF1(pl.LightningModule):
    """The documented recipe: a torchmetrics ``BinaryF1Score`` updated in ``validation_step`` and logged as the
    object (its counts are summed over the ranks at ``compute()``)."""

    def __init__(self):
        super().__init__()
        from torchmetrics.classification import BinaryF1Score

        self.layer = torch.nn.Linear(1, 1)
        self.f1 = BinaryF1Score()

    def validation_step(self, batch, batch_idx):
        self.f1.update(batch["pred"], batch["target"])
        self.log("val_f1", self.f1, on_epoch=True)


def make_metric_f1() -> MetricF1:
    return MetricF1()


#: 7 samples (FP, FP, FN, TN, TP, TP, TN): at W=2 ``DistributedSampler`` repeats sample 0 (an FP) on rank 1. Whole
#: set: TP 2, FP 2, FN 1, F1 4 / 7; with the repeat: FP 3, F1 4 / 8.
F1_7 = [(1, 0), (1, 0), (0, 1), (0, 0), (1, 1), (1, 1), (0, 0)]


def make_f1_7() -> DataLoader:
    """The 7 samples of :data:`F1_7` in batches of 2."""
    return DataLoader(Scored(F1_7), batch_size=2)


class BatchF1(pl.LightningModule):
    """F1 of each batch logged with ``sync_dist=True``: the epoch value averages per-batch F1 (non-decomposable),
    whatever the repeats add."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def validation_step(self, batch, batch_idx):
        pairs = list(zip(batch["pred"].tolist(), batch["target"].tolist()))
        tp = sum(1 for p, t in pairs if p and t)
        wrong = sum(1 for p, t in pairs if bool(p) != bool(t))
        self.log("val_f1", 2 * tp / (2 * tp + wrong) if tp + wrong else 0.0, batch_size=len(pairs), sync_dist=True)


def make_batch_f1() -> BatchF1:
    return BatchF1()


class OwnAllReduce(pl.LightningModule):
    """Sums each batch's targets with ``torch.distributed.all_reduce`` (no check that a process group exists):
    a single-device ``Trainer(devices=1)`` raises there, DDP at any W runs it."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def validation_step(self, batch, batch_idx):
        total = batch["target"].float().sum()
        torch.distributed.all_reduce(total)
        self.log("val_positives", total, reduce_fx="sum")


def make_own_all_reduce() -> OwnAllReduce:
    return OwnAllReduce()


class ReadsTheWrappedModel(pl.LightningModule):
    """Reads ``self.trainer.model.hparams`` at the validation epoch's end: in one process ``trainer.model`` is the
    module; in a ``fit`` under DDP's strategy it is the ``DistributedDataParallel`` wrap, which has no ``hparams``
    (at W=1 as at W=N; pytorch_lightning/strategies/ddp.py ``DDPStrategy.setup`` wraps the module when fitting)."""

    def __init__(self):
        super().__init__()
        self.save_hyperparameters({"threshold": 0.5})
        self.layer = torch.nn.Linear(1, 1)

    def validation_step(self, batch, batch_idx):
        self.log("val_positives", batch["target"].float().sum(), reduce_fx="sum", sync_dist=True)

    def on_validation_epoch_end(self):
        self.log("val_threshold", float(self.trainer.model.hparams["threshold"]))

    def training_step(self, batch, batch_idx):
        return self.layer(batch["pred"].float().unsqueeze(-1)).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def make_reads_the_wrapped_model() -> ReadsTheWrappedModel:
    return ReadsTheWrappedModel()


def make_f1_8_fit() -> dict:
    """:func:`make_f1_8`'s samples as the training and the validation set."""
    return {"train": DataLoader(Scored(F1_8), batch_size=2), "val": DataLoader(Scored(F1_8), batch_size=2)}


class SavesWithTorch(pl.LightningModule):
    """Saves what it wrote with ``torch.save`` (torch's C++ writer, which Python's ``open`` never sees): every rank
    its predictions to one fixed path at the validation epoch's end, and global rank 0 the weights of
    ``trainer.model`` after training (the DDP wrap in a DDP ``fit``: keys prefixed ``module.``)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.preds = []

    def training_step(self, batch, batch_idx):
        return self.layer(batch["pred"].float().unsqueeze(-1)).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.preds.append(batch["pred"])

    def on_validation_epoch_end(self):
        torch.save(torch.cat(self.preds), "preds.pt")
        self.preds = []

    def on_train_end(self):
        if self.trainer.is_global_zero:
            torch.save(self.trainer.model.state_dict(), "weights.pt")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def make_saves_with_torch() -> SavesWithTorch:
    return SavesWithTorch()


class RankZeroOnlySynced(pl.LightningModule):
    """Logs each batch's positive rate with ``sync_dist=True`` *and* ``rank_zero_only=True`` on every rank: the second
    argument turns the sync off (pytorch_lightning/trainer/connectors/logger_connector/result.py ``_Sync``), so each
    rank keeps its own shard's value."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def validation_step(self, batch, batch_idx):
        rate = batch["target"].float().mean()
        self.log("val_rate", rate, batch_size=len(batch["id"]), sync_dist=True, rank_zero_only=True)


def make_rank_zero_only_synced() -> RankZeroOnlySynced:
    return RankZeroOnlySynced()


#: 8 samples whose targets put 3 positives on rank 0's shard (samples 0, 2, 4) and 1 on rank 1's (sample 5) at W=2.
RATES_8 = [(0, 1), (0, 0), (0, 1), (0, 0), (0, 1), (0, 1), (0, 0), (0, 0)]


def make_rates_8() -> DataLoader:
    """The 8 samples of :data:`RATES_8` in batches of 2."""
    return DataLoader(Scored(RATES_8), batch_size=2)


from tests.support.process_traits import HASHED_NAMES  # noqa: E402 - the light module the torchrun script runs


class SetOrderBuffers(pl.LightningModule):
    """Registers one buffer per name of a ``set`` of strings, in the set's iteration order, each holding its position:
    the buffers' values follow the string-hash secret, which differs between the processes of a launch."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        for position, name in enumerate(set(HASHED_NAMES)):
            self.register_buffer(f"slot_{name}", torch.tensor(float(position)))

    def validation_step(self, batch, batch_idx):
        self.log("val_slot_alpha", self.slot_alpha, sync_dist=True)


def make_set_order_buffers() -> SetOrderBuffers:
    return SetOrderBuffers()


class SumOverWholeCount(pl.LightningModule):
    """Sums each rank's targets and divides by the whole validation set's length at the epoch's end, logged with
    ``sync_dist=True``: each rank holds a share of the whole set's positive rate, and the mean sync halves it at
    W=2."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.total = 0.0

    def validation_step(self, batch, batch_idx):
        self.total += float(batch["target"].sum())

    def on_validation_epoch_end(self):
        rate = self.total / len(self.trainer.val_dataloaders.dataset)
        self.log("val_rate", torch.tensor(rate), sync_dist=True)
        self.total = 0.0


def make_sum_over_whole_count() -> SumOverWholeCount:
    return SumOverWholeCount()


class LazyLayer(pl.LightningModule):
    """A ``torch.nn.LazyLinear`` whose parameters have no shape until its first forward, which never runs here
    (validation logs the targets' rate only): the audit's records read it as unreadable, never raise."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.LazyLinear(1)

    def validation_step(self, batch, batch_idx):
        self.log("val_rate", batch["target"].float().mean(), batch_size=len(batch["id"]), sync_dist=True)


def make_lazy_layer() -> LazyLayer:
    return LazyLayer()


class LinearDecay(pl.LightningModule):
    """A learning rate decayed linearly to 0 over ``total`` optimizer steps (``LambdaLR``, stepped per step), where
    ``total`` is sized from the dataset's length (the steps one process takes) or from
    ``trainer.estimated_stepping_batches`` (the steps each rank takes)."""

    def __init__(self, sized_by: str):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.sized_by = sized_by

    def training_step(self, batch, batch_idx):
        return self.layer(batch["pred"].float().unsqueeze(-1)).pow(2).mean()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        if self.sized_by == "dataset":
            total = len(F1_8) // 2  # batches of 2, one epoch
        else:
            total = int(self.trainer.estimated_stepping_batches)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def make_decay_sized_by_the_dataset() -> LinearDecay:
    return LinearDecay("dataset")


def make_decay_sized_by_the_trainer() -> LinearDecay:
    return LinearDecay("trainer")


def make_f1_8_train() -> DataLoader:
    """:func:`make_f1_8`'s samples as the training set (no validation)."""
    return DataLoader(Scored(F1_8), batch_size=2)


#: The variable naming the file :class:`WritesOutside` writes (an absolute path of the test's choosing).
OUTSIDE_FILE = "DDPPROBE_FIDELITY_OUTSIDE_FILE"


class WritesOutside(pl.LightningModule):
    """Writes ``preds.csv`` (a relative path: the working folder the ranks share) and, on global rank 0, the absolute
    path :data:`OUTSIDE_FILE` names, at the validation epoch's end: one line per sample this rank ran."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.ids = []

    def validation_step(self, batch, batch_idx):
        self.ids += batch["id"].tolist()

    def on_validation_epoch_end(self):
        import os

        lines = "".join(f"{i}\\n" for i in self.ids)
        with open("preds.csv", "w") as fh:
            fh.write(lines)
        if self.trainer.is_global_zero:
            with open(os.environ[OUTSIDE_FILE], "w") as fh:
                fh.write(lines)
        self.ids = []


def make_writes_outside() -> WritesOutside:
    return WritesOutside()


class SetsInPrepareData(pl.LightningModule):
    """Sets ``self.num_classes`` in ``prepare_data``, which Lightning runs on local rank 0 only
    (``prepare_data_per_node``, pytorch_lightning/core/hooks.py ``DataHooks.prepare_data``); every other rank keeps
    the ``__init__`` value."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.num_classes = 0

    def prepare_data(self):
        self.num_classes = 2

    def validation_step(self, batch, batch_idx):
        self.log("val_classes", float(self.num_classes), sync_dist=True)


def make_sets_in_prepare_data() -> SetsInPrepareData:
    return SetsInPrepareData()


class PlateauOnARankLocalKey(pl.LightningModule):
    """``ReduceLROnPlateau`` (patience 0, factor 0.5) monitoring ``val_score``, logged without ``sync_dist``. Training
    raises the one weight ``w`` by the learning rate at every step (loss ``-w``); each sample's score is
    ``-(id % 2) * w``, a per-sample mean. At W=2 rank 0 (even ids) logs 0 every epoch (no improvement: its rate
    halves after the second epoch) while rank 1 (odd ids) logs ``-w``, lower every epoch (its rate stays)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.constant_(self.layer.weight, 1.0)

    def training_step(self, batch, batch_idx):
        return -self.layer.weight.sum()

    def validation_step(self, batch, batch_idx):
        score = -(batch["id"] % 2).float().mean() * self.layer.weight.sum()
        self.log("val_score", score, batch_size=len(batch["id"]))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "val_score"}}


def make_plateau_on_a_rank_local_key() -> PlateauOnARankLocalKey:
    return PlateauOnARankLocalKey()


class BatchNormOnTheRemainder(pl.LightningModule):
    """A ``BatchNorm1d`` in training: a batch of one sample raises (``Expected more than 1 value per channel``). On 10
    samples in batches of 4, one process's batches hold 4, 4 and 2; at W=2 each rank's shard of 5 ends in a batch of
    1."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 2)
        self.norm = torch.nn.BatchNorm1d(2)

    def training_step(self, batch, batch_idx):
        return self.norm(self.layer(batch["pred"].float().unsqueeze(-1))).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def make_batch_norm_on_the_remainder() -> BatchNormOnTheRemainder:
    return BatchNormOnTheRemainder()


def make_ten_in_fours() -> DataLoader:
    """10 samples (:data:`F1_8` and two more) in batches of 4."""
    return DataLoader(Scored(F1_8 + [(1, 1), (0, 0)]), batch_size=4)


class SetsInPrepareDataAndSetup(SetsInPrepareData):
    """Sets ``self.num_classes`` in ``prepare_data`` (local rank 0 only) and again in ``setup``, which every rank runs
    after the callbacks' ``setup``: every rank holds 2 from the stage's start on, a correct pattern."""

    def setup(self, stage):
        self.num_classes = 2


def make_sets_in_prepare_data_and_setup() -> SetsInPrepareDataAndSetup:
    return SetsInPrepareDataAndSetup()

"""The rank-state probe: what each rank holds of state that no collective synchronizes: random draws after
``seed_everything`` (in ``training_step``, in dropout, in DataLoader workers), the initial weights before and
after DDP wraps the model, the logger's version folder, ``rank_zero_only.rank`` before a Trainer exists.

Sources: lightning_fabric/utilities/seed.py (``seed_everything``, ``pl_worker_init_function``),
lightning_fabric/utilities/data.py ``_auto_add_worker_init_fn``, torch/utils/data/dataloader.py
(``_BaseDataLoaderIter.__init__`` draws the workers' ``base_seed`` from the rank's default generator;
torch/utils/data/_utils/worker.py ``_worker_loop`` seeds worker ``k`` with ``base_seed + k``),
torch/nn/parallel/distributed.py ``DistributedDataParallel.__init__`` (``_sync_module_states`` broadcasts
rank 0's parameters and buffers).
"""

from __future__ import annotations

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, seed_everything
from ddpprobe.probes.data import IdDataset

#: Numbers drawn per ``training_step`` (``torch.rand(NOISE_SIZE)``) and elements of the dropout mask.
NOISE_SIZE, MASK_SIZE = 3, 16


class NoisyIdDataset(IdDataset):
    """``IdDataset`` whose item also carries ``noise``: one ``torch.rand(())`` drawn when the item is loaded
    (in the DataLoader worker that loads it), a float32 scalar."""

    def item(self, i: int) -> dict:
        return {**super().item(i), "noise": torch.rand(())}


class NoiseProbe(pl.LightningModule):
    """A ``Linear(2, 2)`` that records its initial weights and, per ``training_step``, a random draw and a
    dropout mask.

    Both draws use torch's default generator: ``torch.rand(NOISE_SIZE)``, then
    ``torch.nn.functional.dropout(torch.ones(MASK_SIZE), p=0.5, training=True)``.

    Args:
        rank_seed: None, or an int: ``on_train_start`` (after DDP has broadcast rank 0's weights) calls
            ``torch.manual_seed(rank_seed + global_rank)``, the per-rank reseed that gives each rank its
            own stream while the weights stay equal.
    """

    def __init__(self, rank_seed=None):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.rank_seed = rank_seed
        self.initial_weight = self.layer.weight.detach().flatten().tolist()
        self.train_start_weight = None
        self.noise: list = []
        self.masks: list = []
        self.worker_noise: list = []
        self.ids: list = []

    def on_train_start(self):
        self.train_start_weight = self.layer.weight.detach().flatten().tolist()
        if self.rank_seed is not None:
            torch.manual_seed(self.rank_seed + self.global_rank)

    def training_step(self, batch, batch_idx):
        self.ids.append(batch_ids(batch))
        self.worker_noise.append(batch["noise"].tolist())
        self.noise.append(torch.rand(NOISE_SIZE).tolist())
        mask = torch.nn.functional.dropout(torch.ones(MASK_SIZE), p=0.5, training=True) > 0
        self.masks.append([int(m) for m in mask])
        return self.layer(batch["x"] / 100.0).sum() * 0.0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def seeded_randomness(
    info: RankInfo,
    seed=None,
    workers: bool = False,
    num_workers: int = 0,
    rank_seed=None,
    n_per_rank: int = 4,
    batch_size: int = 2,
) -> dict:
    """Scenario: optionally ``seed_everything(seed, workers=workers)`` (None: no call), then build a
    ``NoiseProbe(rank_seed)`` and fit it for one epoch over ``NoisyIdDataset(n_per_rank * W)`` with
    ``num_workers`` DataLoader workers.

    Record keys: ``initial_weight`` (the 4 weights as built, before the Trainer), ``train_start_weight``
    (in ``on_train_start``, after DDP wrapped the model), ``noise`` (per step, ``NOISE_SIZE`` floats),
    ``masks`` (per step, the dropout mask as 0/1), ``worker_noise`` (per step, each sample's ``noise``
    drawn where it was loaded), ``ids`` (per step, the sample ids).
    """
    if seed is not None:
        seed_everything(seed, workers=workers)
    model = NoiseProbe(rank_seed=rank_seed)
    loader = torch.utils.data.DataLoader(
        NoisyIdDataset(n_per_rank * info.world_size), batch_size=batch_size, num_workers=num_workers
    )
    trainer = ddp_trainer(info, max_epochs=1, limit_val_batches=0)
    trainer.fit(model, train_dataloaders=loader)
    return {
        "initial_weight": model.initial_weight,
        "train_start_weight": model.train_start_weight,
        "noise": model.noise,
        "masks": model.masks,
        "worker_noise": model.worker_noise,
        "ids": model.ids,
    }

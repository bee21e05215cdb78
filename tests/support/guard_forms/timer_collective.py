"""A collective fired by a clock, not by the rank: "sync the running count every ``EVERY_S`` seconds", written as
``if time.monotonic() - self._synced_at > EVERY_S: dist.all_reduce(self._count)`` in ``training_step``. Each rank
reads its own clock, and one rank's first step is slow: sample 0 is damaged (``DAMAGED`` in its first feature) and
takes ``SLOW_S`` seconds to repair in ``training_step``, before the clock is read, and it is in the first batch of
one rank only (:func:`slow_rank`: Lightning shuffles a training loader's DistributedSampler, seed 0). So that rank's
clock has passed ``EVERY_S`` at its first step and the others' has not: it alone makes the all_reduce, while the
others are in DDP's gradient all_reduce. No line reads the rank. The clock is a private attribute
(``_synced_at``): a rank's own time is no state the DDP contract compares."""

import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms import _plain

#: Seconds between syncs, and the seconds sample 0 takes to repair (well above, so only the slow rank is past it).
EVERY_S, SLOW_S = 2.0, 6.0
#: The first feature of the damaged sample 0.
DAMAGED = 50.0


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, generator=generator).clamp(-3, 3)
    x[0, 0] = DAMAGED
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=2)


def slow_rank(world_size: int) -> int:
    """The rank whose first batch holds sample 0 in epoch 0 (``DistributedSampler(shuffle=True, seed=0)``, as
    Lightning gives a training loader: pytorch_lightning/trainer/connectors/data_connector.py)."""
    dataset, batch = loader().dataset, loader().batch_size
    for rank in range(world_size):
        if 0 in list(DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0))[:batch]:
            return rank
    raise AssertionError("sample 0 is in no rank's first batch: the script shows no hazard")


class LitClassifier(_plain.LitClassifier):
    def on_train_start(self):
        self._synced_at = time.monotonic()
        self._count = torch.zeros(1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if (x.abs() > 10).any():  # a damaged sample: repair it (slow)
            time.sleep(SLOW_S)
        self._count += len(x)
        if time.monotonic() - self._synced_at > EVERY_S:
            dist.all_reduce(self._count)
            self._synced_at = time.monotonic()
        return super().training_step(batch, batch_idx)


def train(info, guard_timeout: float = 15.0) -> dict:
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(), train_dataloaders=loader())
    return {}

"""An input-noise level set from the rank in ``setup``, before training (each rank "its own augmentation"):
``self.noise_std = 0.1 * (self.global_rank + 1)``. Lightning syncs no attribute the user sets, so each rank
trains on differently perturbed inputs; no collective differs."""

import torch

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from tests.support.guard_forms._data import loader


class LitClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def setup(self, stage):
        self.noise_std = 0.1 * (self.global_rank + 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = x + self.noise_std * torch.randn_like(x)
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train(info, guard_timeout: float = 5.0) -> dict:
    torch.manual_seed(0)
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[CollectiveGuard(timeout=guard_timeout)])
    trainer.fit(LitClassifier(), train_dataloaders=loader())
    return {}

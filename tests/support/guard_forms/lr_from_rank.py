"""The linear scaling rule written with the wrong attribute: ``lr = 0.01 * (self.global_rank + 1)`` where
``self.trainer.world_size`` was meant, so each rank steps with its own learning rate. No collective differs:
DDP averages the gradients, then every rank applies them with its own rate, and the weights part after the
first step (tests/facts/test_what_ddp_keeps_equal.py). ``fixed=True`` trains the fix: ``self.trainer.world_size``."""

import torch

from ddpprobe._lightning import pl
from ddpprobe.guard import CollectiveGuard
from ddpprobe.probes.common import ddp_trainer
from ddpprobe.trace import pg_seq
from tests.support.guard_forms._data import loader


class LitClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        lr = 0.01 * (self.global_rank + 1)  # scale by the number of processes
        return torch.optim.SGD(self.parameters(), lr=lr)


class FixedLitClassifier(LitClassifier):
    def configure_optimizers(self):
        lr = 0.01 * self.trainer.world_size
        return torch.optim.SGD(self.parameters(), lr=lr)


def train(info, state=True, fixed: bool = False, guard_timeout: float = 5.0) -> dict:
    torch.manual_seed(0)
    guard = CollectiveGuard(timeout=guard_timeout, state=state)
    before = pg_seq()
    trainer = ddp_trainer(info, max_epochs=2, callbacks=[guard])
    model = FixedLitClassifier() if fixed else LitClassifier()
    trainer.fit(model, train_dataloaders=loader())
    return {
        "lr": trainer.optimizers[0].param_groups[0]["lr"],
        "weight": model.net.weight.detach().flatten().tolist(),
        "global_step": trainer.global_step,
        "pg_seq": pg_seq() - (before or 0),
        "checks": guard.checks,
    }

"""Manual optimization under ``DDPStrategy`` options: which gradients ``self.manual_backward`` leaves in
``.grad`` on each rank with ``DDPStrategy(static_graph=True)`` and with ``static_graph=False``.

``ManualRegressionProbe`` is the training probe's ``Linear(2, 1)`` (ddpprobe/probes/training.py,
``INIT_WEIGHT``/``INIT_BIAS``, ``RegressionDataset``) trained with ``automatic_optimization = False``::

    opt.zero_grad()
    loss = mse_loss(self.layer(batch["x"]).squeeze(-1), batch["y"])
    self.manual_backward(loss)
    # recorded here: [weight.grad[0], weight.grad[1], bias.grad[0]]
    opt.step()                                   # SGD(lr)

DDP averages the gradients across ranks inside ``backward`` (the reducer's all_reduce of each bucket,
divided by the world size). With ``static_graph=True`` its first iteration delays that all_reduce until
the whole graph has been seen (torch/nn/parallel/distributed.py: ``_DDPSink`` queues
``reducer._delay_all_reduce``), which Lightning's manual optimization path did not trigger before 2.6.0
(Lightning #18086); since 2.6.0 ``DDPStrategy.post_backward`` calls ``reducer._delay_all_reduce()`` once
after the first manual backward (pytorch_lightning/strategies/ddp.py, PR #21251).
"""

from __future__ import annotations

import datetime

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer
from ddpprobe.probes.training import INIT_BIAS, INIT_WEIGHT, regression_loader


class ManualRegressionProbe(pl.LightningModule):
    """``Linear(2, 1)`` from ``INIT_WEIGHT``/``INIT_BIAS``, manual optimization with ``SGD(lr)``; records
    ``train_ids`` (per step), ``grads`` (``[dw0, dw1, db]`` after each ``manual_backward``) and ``params``
    (``[w0, w1, b]`` after each ``opt.step()``) and ``static_graph`` (what the ``DistributedDataParallel``
    wrapping it reports after the first step)."""

    def __init__(self, lr: float):
        super().__init__()
        self.automatic_optimization = False
        self.lr = lr
        self.layer = torch.nn.Linear(2, 1)
        with torch.no_grad():
            self.layer.weight.copy_(torch.tensor(INIT_WEIGHT))
            self.layer.bias.copy_(torch.tensor(INIT_BIAS))
        self.train_ids: list = []
        self.grads: list = []
        self.params: list = []
        self.static_graph = None

    def _flat(self, tensors) -> list:
        return [float(v) for v in torch.cat([t.detach().reshape(-1) for t in tensors])]

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.train_ids.append(batch_ids(batch))
        loss = torch.nn.functional.mse_loss(self.layer(batch["x"]).squeeze(-1), batch["y"])
        self.manual_backward(loss)
        self.grads.append(self._flat([self.layer.weight.grad, self.layer.bias.grad]))
        opt.step()
        self.params.append(self._flat([self.layer.weight, self.layer.bias]))
        if self.static_graph is None:
            self.static_graph = bool(getattr(self.trainer.strategy.model, "static_graph", False))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit_manual(
    info: RankInfo, static_graph: bool, n: int = 8, batch_size: int = 2, max_steps: int = 3, lr: float = 0.05
) -> dict:
    """Scenario: ``trainer.fit`` a ``ManualRegressionProbe`` on ``RegressionDataset(n)`` for ``max_steps``
    steps with ``strategy=DDPStrategy(static_graph=static_graph)`` (and the world's backend and timeout).

    Record keys: ``train_ids``, ``grads``, ``params``, ``static_graph`` (see ``ManualRegressionProbe``).
    """
    torch.manual_seed(0)
    model = ManualRegressionProbe(lr)
    strategy = pl.strategies.DDPStrategy(
        process_group_backend=info.backend,
        timeout=datetime.timedelta(seconds=info.pg_timeout),
        static_graph=static_graph,
    )
    trainer = ddp_trainer(info, strategy=strategy, max_steps=max_steps)
    trainer.fit(model, train_dataloaders=regression_loader(n, batch_size))
    return {
        "train_ids": model.train_ids,
        "grads": model.grads,
        "params": model.params,
        "static_graph": model.static_graph,
    }

"""The parameter and gradient probes: rank 0's parameters outside ``fit``, gradients
after ``manual_backward``, gradients through ``all_gather(..., sync_grads=True)``, parameters unused by
the loss.

Every module here is a ``Linear(2, 1)`` over ``RegressionDataset`` (ddpprobe/probes/training.py,
``x = [id / 4, ±1]``, ``y = id % 3 - 1``). Scenarios:

- ``evaluate_rank_weights``: ``validate``/``test``/``predict`` a module whose weights, bias and one buffer
  are set per rank in ``__init__`` (``rank_weights(rank)``); records what each step saw;
- ``fit_manual``: manual optimization with SGD; records the gradient right after ``manual_backward``;
- ``gather_with_grads``: one training step that differentiates a loss of ``self.all_gather(x, sync_grads=...)``
  with respect to the rank's own ``x``;
- ``fit_unused``: a module with a second ``Linear`` its loss never uses.
"""

from __future__ import annotations

import datetime

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer
from ddpprobe.probes.training import INIT_BIAS, INIT_WEIGHT, BatchNormProbe, RegressionProbe, regression_loader

#: ``Trainer`` method per evaluation stage.
STAGES = ("validate", "test", "predict")


def rank_weights(rank: int) -> dict:
    """The parameters rank ``rank``'s module starts with: ``weight`` ``[[r + 1, -(r + 1) / 2]]``, ``bias``
    ``[r / 4]`` and the buffer ``offset`` ``10 + r``."""
    return {"weight": [[rank + 1.0, -(rank + 1.0) / 2]], "bias": [rank / 4.0], "offset": 10.0 + rank}


def _params(layer) -> list:
    """``[weight_0, weight_1, bias]`` of a ``Linear(2, 1)`` as floats."""
    return [float(v) for v in torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach().reshape(-1)])]


class RankWeightsProbe(pl.LightningModule):
    """``Linear(2, 1)`` plus a buffer ``offset``, initialised per rank (``rank_weights``); each evaluation
    step records ``{"ids", "outputs": w . x + b + offset per sample, "params", "offset", "wrapper"}``,
    ``wrapper`` being the class of ``trainer.strategy.model`` (the DDP wrapper, or the module itself)."""

    def __init__(self, rank: int):
        super().__init__()
        init = rank_weights(rank)
        self.layer = torch.nn.Linear(2, 1)
        with torch.no_grad():
            self.layer.weight.copy_(torch.tensor(init["weight"]))
            self.layer.bias.copy_(torch.tensor(init["bias"]))
        self.register_buffer("offset", torch.tensor(init["offset"]))
        self.steps: list = []

    def _record(self, batch):
        out = self.layer(batch["x"]).squeeze(-1) + self.offset
        self.steps.append(
            {
                "ids": batch_ids(batch),
                "outputs": [float(v) for v in out],
                "params": _params(self.layer),
                "offset": float(self.offset),
                "wrapper": type(self.trainer.strategy.model).__name__,
            }
        )
        return out

    def validation_step(self, batch, batch_idx):
        self._record(batch)

    def test_step(self, batch, batch_idx):
        self._record(batch)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self._record(batch)


def evaluate_rank_weights(info: RankInfo, stage: str, n: int = 4, batch_size: int = 2) -> dict:
    """Scenario: ``trainer.<stage>`` a ``RankWeightsProbe(info.rank)`` over ``RegressionDataset(n)``.

    Record keys: ``steps`` (one dict per batch, see ``RankWeightsProbe``), ``after`` (the module's
    ``[weight_0, weight_1, bias]`` once the stage returned).

    Raises:
        ValueError: ``stage`` not one of ``STAGES``.
    """
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}; use one of {STAGES}")
    model = RankWeightsProbe(info.rank)
    trainer = ddp_trainer(info)
    kwargs = {"return_predictions": False} if stage == "predict" else {"verbose": False}
    getattr(trainer, stage)(model, dataloaders=regression_loader(n, batch_size), **kwargs)
    return {"steps": model.steps, "after": _params(model.layer)}


class ManualProbe(RegressionProbe):
    """``RegressionProbe`` under manual optimization: ``manual_backward`` of the batch MSE, then
    ``opt.step()`` and ``opt.zero_grad()``. Records ``grads`` (``[dw0, dw1, db]`` right after
    ``manual_backward``), ``params`` after each step (``on_train_batch_end``) and ``train_ids``."""

    def __init__(self, lr: float):
        super().__init__(lr)
        self.automatic_optimization = False
        self.grads: list = []

    def training_step(self, batch, batch_idx):
        self.train_ids.setdefault(self.current_epoch, []).append(batch_ids(batch))
        opt = self.optimizers()
        pred = self.layer(batch["x"]).squeeze(-1)
        loss = torch.nn.functional.mse_loss(pred, batch["y"])
        self.manual_backward(loss)
        self.grads.append([float(v) for v in torch.cat([self.layer.weight.grad.reshape(-1), self.layer.bias.grad])])
        opt.step()
        opt.zero_grad()


def fit_manual(info: RankInfo, n: int, batch_size: int, max_steps: int, lr: float) -> dict:
    """Scenario: ``trainer.fit(ManualProbe(lr), max_steps)`` over ``RegressionDataset(n)`` (no validation).

    Record keys: ``grads``, ``params``, ``train_ids`` (``{epoch: [ids per batch]}``), ``init`` (the
    initial ``[weight_0, weight_1, bias]``).
    """
    model = ManualProbe(lr)
    trainer = ddp_trainer(info, max_steps=max_steps, limit_val_batches=0)
    trainer.fit(model, train_dataloaders=regression_loader(n, batch_size))
    return {
        "grads": model.grads,
        "params": model.params,
        "train_ids": {str(k): v for k, v in model.train_ids.items()},
        "init": INIT_WEIGHT[0] + INIT_BIAS,
    }


class AutomaticGradProbe(RegressionProbe):
    """``RegressionProbe`` under automatic optimization that records ``grads`` (``[dw0, dw1, db]`` in
    ``on_before_optimizer_step``: after the backward, before ``optimizer.step()``) and ``static_graph``
    (what the ``DistributedDataParallel`` wrapper holds, read at the first step)."""

    def __init__(self, lr: float):
        super().__init__(lr)
        self.grads: list = []
        self.static_graph = None

    def on_before_optimizer_step(self, *args):
        self.grads.append([float(v) for v in torch.cat([self.layer.weight.grad.reshape(-1), self.layer.bias.grad])])
        if self.static_graph is None:
            self.static_graph = bool(getattr(self.trainer.strategy.model, "static_graph", False))


def fit_automatic(info: RankInfo, static_graph: bool, n: int, batch_size: int, max_steps: int, lr: float) -> dict:
    """Scenario: ``trainer.fit(AutomaticGradProbe(lr), max_steps)`` over ``RegressionDataset(n)`` (no
    validation) with ``strategy=DDPStrategy(static_graph=static_graph)`` (and the world's backend and
    process-group timeout).

    Record keys: ``grads``, ``params`` (after each step), ``static_graph``, ``train_ids``
    (``{epoch: [ids per batch]}``), ``init`` (the initial ``[weight_0, weight_1, bias]``).
    """
    model = AutomaticGradProbe(lr)
    strategy = pl.strategies.DDPStrategy(
        process_group_backend=info.backend,
        timeout=datetime.timedelta(seconds=info.pg_timeout),
        static_graph=static_graph,
    )
    trainer = ddp_trainer(info, strategy=strategy, max_steps=max_steps, limit_val_batches=0)
    trainer.fit(model, train_dataloaders=regression_loader(n, batch_size))
    return {
        "grads": model.grads,
        "params": model.params,
        "static_graph": model.static_graph,
        "train_ids": {str(k): v for k, v in model.train_ids.items()},
        "init": INIT_WEIGHT[0] + INIT_BIAS,
    }


def gathered_input(rank: int) -> list:
    """The tensor rank ``rank`` gathers: ``[r + 1, 2 * (r + 1)]`` (shape (2,))."""
    return [rank + 1.0, 2.0 * (rank + 1)]


class GatherGradProbe(RegressionProbe):
    """In its one training step: ``g = self.all_gather(x, sync_grads)`` with ``x = gathered_input(rank)``
    (``requires_grad``), rank s's loss ``sum_k (s + 1) * (k + 1) * sum(g[k] ** 2)``, and
    ``torch.autograd.grad(loss, x)``. Records ``gathered`` (``g``), ``grad`` (the gradient, or None) and
    ``error`` (what ``autograd.grad`` raised, or None). Returns the usual MSE loss for DDP."""

    def __init__(self, sync_grads: bool):
        super().__init__(lr=0.05)
        self.sync_grads = sync_grads
        self.result: dict = {}

    def training_step(self, batch, batch_idx):
        rank = self.global_rank
        x = torch.tensor(gathered_input(rank), device=self.device, requires_grad=True)
        gathered = self.all_gather(x, sync_grads=self.sync_grads)
        weights = torch.arange(1, gathered.shape[0] + 1, dtype=torch.float32, device=self.device).unsqueeze(-1)
        loss = ((rank + 1) * weights * gathered**2).sum()
        self.result = {"gathered": gathered.detach().tolist(), "grad": None, "error": None}
        try:
            (grad,) = torch.autograd.grad(loss, x)
            self.result["grad"] = grad.tolist()
        except RuntimeError as exc:
            self.result["error"] = str(exc)
        return super().training_step(batch, batch_idx)


def gather_with_grads(info: RankInfo, sync_grads: bool) -> dict:
    """Scenario: one training step of ``GatherGradProbe(sync_grads)``; the record is its ``result``."""
    model = GatherGradProbe(sync_grads)
    trainer = ddp_trainer(info, max_steps=1, limit_val_batches=0)
    trainer.fit(model, train_dataloaders=regression_loader(2 * info.world_size, 2))
    return model.result


class UnusedParameterProbe(RegressionProbe):
    """``RegressionProbe`` with a second ``Linear(2, 1)``, ``unused``, that its loss never touches."""

    def __init__(self):
        super().__init__(lr=0.05)
        self.unused = torch.nn.Linear(2, 1)


def fit_unused(info: RankInfo, find_unused_parameters: bool, max_steps: int = 3) -> dict:
    """Scenario: ``trainer.fit(UnusedParameterProbe())`` for ``max_steps`` steps under
    ``DDPStrategy(find_unused_parameters=...)``.

    Record keys: ``steps`` (training steps that ran), ``raised`` (class name or None), ``message``.
    """
    import datetime

    strategy = pl.strategies.DDPStrategy(
        process_group_backend=info.backend,
        timeout=datetime.timedelta(seconds=info.pg_timeout),
        find_unused_parameters=find_unused_parameters,
    )
    model = UnusedParameterProbe()
    trainer = ddp_trainer(info, strategy=strategy, max_steps=max_steps, limit_val_batches=0)
    try:
        trainer.fit(model, train_dataloaders=regression_loader(4 * info.world_size * max_steps, 2))
    except RuntimeError as exc:
        return {"steps": len(model.losses), "raised": type(exc).__name__, "message": str(exc)}
    return {"steps": len(model.losses), "raised": None, "message": None}


class _BatchNormStageProbe(BatchNormProbe):
    """``BatchNormProbe`` (ddpprobe/probes/training.py) that records, per stage, the class its batch-norm
    layer has in that stage's steps (``during``)."""

    def __init__(self):
        super().__init__(lr=0.05, momentum=0.5)
        self.during: dict = {}

    def _note(self, stage: str) -> None:
        self.during.setdefault(stage, set()).add(type(self.bn).__name__)

    def training_step(self, batch, batch_idx):
        self._note("fit")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self._note(str(self.trainer.state.fn.value))

    def test_step(self, batch, batch_idx):
        self._note("test")

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        self._note("predict")
        return self.layer(self.bn(batch["x"]))


def batchnorm_classes(info: RankInfo, stages, n: int = 8, batch_size: int = 2) -> dict:
    """Scenario: one module, one ``Trainer(sync_batchnorm=True)`` per stage in ``stages`` (``"fit"``,
    ``"validate"``, ``"test"``, ``"predict"``), run in order over ``RegressionDataset(n)``.

    Record keys: ``during`` (stage -> the layer classes seen in its steps), ``after`` (stage -> the layer's
    class once the stage returned).
    """
    model = _BatchNormStageProbe()
    after = {}
    for stage in stages:
        trainer = ddp_trainer(info, sync_batchnorm=True, max_epochs=1, limit_val_batches=0 if stage == "fit" else 1.0)
        loader = regression_loader(n, batch_size)
        if stage == "fit":
            trainer.fit(model, train_dataloaders=loader)
        elif stage == "predict":
            trainer.predict(model, dataloaders=loader, return_predictions=False)
        else:
            getattr(trainer, stage)(model, dataloaders=loader, verbose=False)
        after[stage] = type(model.bn).__name__
    return {"during": {k: sorted(v) for k, v in model.during.items()}, "after": after}

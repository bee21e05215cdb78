"""LightningModules that make a collective through each kind of public call, for the trace's and the
guard's call-chain tests (tests/tooling/trace/test_trace_call_chain.py, tests/tooling/guard/
test_guard_call_chain.py). They live outside the ``ddpprobe`` package, so their lines read as a user's code.

``CallsModule(calls, ranks)`` makes each call named in ``calls`` (``CALLS``) on the ranks in ``ranks``
(None: every rank), each on its own line of this file (``line_of`` finds it): ``log`` in
``training_step``, the others in ``on_train_epoch_end``. Every ``training_step`` also logs ``train_v``
with ``sync_dist=True`` (an epoch sync Lightning makes at the epoch's end on its own) and updates a
``MeanMetric``.
"""

import inspect

import torch
import torch.distributed
from torchmetrics import MeanMetric

from ddpprobe._lightning import pl
from ddpprobe.probes.common import ddp_trainer, id_loader
from ddpprobe.trace import CollectiveTrace, read_trace
from tests.support.boring import BoringModel

#: The kinds of public call, and the text of the line that makes each (found by ``line_of``).
CALLS = {
    "property": "self.read = dict(self.trainer.callback_metrics)",
    "metric": "self.computed = self.mean.compute()",
    "strategy_reduce": 'self.trainer.strategy.reduce(torch.tensor(1.0), reduce_op="sum")',
    "strategy_barrier": "self.trainer.strategy.barrier()",
    "strategy_broadcast": "self.trainer.strategy.broadcast(self.global_rank, src=0)",
    "trainer": 'self.trainer.save_checkpoint(self.trainer.default_root_dir + "/last.ckpt")',
    "all_gather": "self.all_gather(torch.tensor([float(self.global_rank)]))",
    "direct": "torch.distributed.all_reduce(torch.tensor([1.0]))",
    "log": 'self.log("step_v", batch["value"].sum(), on_step=True, on_epoch=False, sync_dist=True)',
}


class CallsModule(pl.LightningModule):
    """Makes the ``calls`` (keys of ``CALLS``) on ``ranks`` (None: every rank), and the ``everywhere`` calls on
    every rank, after them; see the module docstring."""

    def __init__(self, calls, ranks=None, everywhere=()):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.mean = MeanMetric()
        self.calls, self.ranks, self.everywhere = list(calls), ranks, list(everywhere)

    def _makes(self, call: str) -> bool:
        if call in self.everywhere:
            return True
        return call in self.calls and (self.ranks is None or self.global_rank in self.ranks)

    def training_step(self, batch, batch_idx):
        self.mean.update(batch["value"])
        self.log("train_v", batch["value"].sum(), on_step=False, on_epoch=True, sync_dist=True, reduce_fx="sum")
        if self._makes("log"):
            self.log("step_v", batch["value"].sum(), on_step=True, on_epoch=False, sync_dist=True)
        return self.layer(batch["x"]).sum()

    def on_train_epoch_end(self):
        if self._makes("property"):
            self.read = dict(self.trainer.callback_metrics)
        if self._makes("metric"):
            self.computed = self.mean.compute()
        if self._makes("strategy_reduce"):
            self.trainer.strategy.reduce(torch.tensor(1.0), reduce_op="sum")
        if self._makes("strategy_barrier"):
            self.trainer.strategy.barrier()
        if self._makes("strategy_broadcast"):
            self.trainer.strategy.broadcast(self.global_rank, src=0)
        if self._makes("trainer"):
            self.trainer.save_checkpoint(self.trainer.default_root_dir + "/last.ckpt")
        if self._makes("all_gather"):
            self.all_gather(torch.tensor([float(self.global_rank)]))
        if self._makes("direct"):
            torch.distributed.all_reduce(torch.tensor([1.0]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def line_of(call: str) -> str:
    """``"call_modules.py:57 in on_train_epoch_end"``: where ``CallsModule`` makes ``call``."""
    for method in (CallsModule.training_step, CallsModule.on_train_epoch_end):
        lines, start = inspect.getsourcelines(method)
        for offset, line in enumerate(lines):
            if line.strip() == CALLS[call]:
                return f"call_modules.py:{start + offset} in {method.__name__}"
    raise LookupError(f"no line of CallsModule makes {call!r}")


def traced(info, calls, n: int, batch_size: int = 2) -> dict:
    """Scenario: ``trainer.fit`` one epoch of a ``CallsModule(calls)`` (every rank makes every call) under a
    ``CollectiveTrace``. Record: ``events`` (this rank's trace as it wrote it, ``read_trace``; the tests group it
    with ``split_trace``, so a recording of it replays the grouping: tests/tooling/trace/recorded_traces.py)."""
    torch.manual_seed(0)  # the layer's gradients are in the trace: the same on every run of the scenario
    model = CallsModule(calls)
    path = f"{info.rank_dir}/trace.jsonl"
    with CollectiveTrace(path, model) as trace:
        trainer = ddp_trainer(info, max_epochs=1, callbacks=[trace.batch_recorder()])
        trainer.fit(model, train_dataloaders=id_loader(n, batch_size))
    return {"events": read_trace(path)}


def log_line(key: str) -> str:
    """``"call_modules.py:48 in training_step"``: where ``CallsModule`` logs ``key``."""
    lines, start = inspect.getsourcelines(CallsModule.training_step)
    for offset, line in enumerate(lines):
        if line.strip().startswith(f'self.log("{key}"'):
            return f"call_modules.py:{start + offset} in training_step"
    raise LookupError(f"CallsModule logs no {key!r}")


def guarded(info, calls, ranks=(0,), everywhere=(), n: int = 8, batch_size: int = 2) -> dict:
    """Scenario: ``trainer.fit`` one epoch of a ``CallsModule(calls, ranks, everywhere)`` (``calls`` on ``ranks``
    only, ``everywhere`` on every rank)
    with ``CollectiveGuard`` (timeout: half the world's process-group timeout). Record: ``checks``."""
    from ddpprobe.guard import CollectiveGuard

    guard = CollectiveGuard(timeout=info.pg_timeout / 2)
    trainer = ddp_trainer(info, max_epochs=1, callbacks=[guard])
    trainer.fit(CallsModule(calls, list(ranks), everywhere), train_dataloaders=id_loader(n, batch_size))
    return {"checks": guard.checks}


class BoringSavesOnRankZero(BoringModel):
    """Lightning's ``BoringModel`` (tests/support/boring.py), plus what a user adds:
    ``self.log("train_loss", ..., sync_dist=True)`` in ``training_step`` and a checkpoint saved by rank 0
    alone at each epoch's end (``Trainer.save_checkpoint`` ends in a barrier every rank must enter)."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("train_loss", out["loss"], sync_dist=True)
        return out

    def on_train_epoch_end(self):
        if self.global_rank == 0:
            self.trainer.save_checkpoint(self.trainer.default_root_dir + "/epoch.ckpt")


def boring(info, guard: bool = True, limit_batches: int = 4) -> dict:
    """Scenario: ``trainer.fit`` one epoch of ``BoringSavesOnRankZero`` (``limit_batches`` training and
    validation batches), with ``CollectiveGuard`` when ``guard``. Record: ``checks``."""
    from ddpprobe.guard import CollectiveGuard

    callbacks = [CollectiveGuard(timeout=info.pg_timeout / 2)] if guard else []
    trainer = ddp_trainer(
        info, max_epochs=1, callbacks=callbacks, limit_train_batches=limit_batches, limit_val_batches=limit_batches
    )
    # BoringModel draws its RandomDataset when built: without a shared seed each rank holds its own dataset, which
    # the guard's state check reports first (tests/facts/test_what_ddp_keeps_equal.py); seeded, the ranks hold one.
    torch.manual_seed(0)
    trainer.fit(BoringSavesOnRankZero())
    return {"checks": callbacks[0].checks if guard else None}

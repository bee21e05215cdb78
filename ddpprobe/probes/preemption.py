"""The preemption probe: a real ``SIGTERM`` delivered to one rank during ``trainer.fit``.

``SigtermProbe`` trains a ``Linear(2, 1)`` and, on rank ``target_rank`` at batch ``at_step``, sends its own
process ``SIGTERM`` (``os.kill(os.getpid(), signal.SIGTERM)``; Python runs the handler Lightning installed
right after the call, as it would for a signal sent by a cluster manager at that moment), either

- ``where="between_steps"``: in ``on_train_batch_end``, after the step's optimizer update, or
- ``where="mid_step"``: in ``training_step``, before the step's backward (its gradient all_reduce).

It records the default process group's sequence number (``ddpprobe.trace.pg_seq``: how many collectives
the backend has run) at every ``on_train_batch_start`` and ``on_train_batch_end``, so a fact can count the
collectives Lightning runs between two training steps.

What Lightning does with the signal (pytorch_lightning/trainer/connectors/signal_connector.py
``_SignalConnector._sigterm_notifier_fn``; pytorch_lightning/loops/training_epoch_loop.py
``_TrainingEpochLoop._broadcast_sigterm_tensor``, ``advance``, ``on_advance_end``; since 2.5.2, PR #20825):
the handler sets ``trainer.received_sigterm`` and, in a world of more than one rank, calls
``torch.distributed.broadcast(tensor([1]), src=0)`` itself; at the start of every training step every
rank broadcasts rank 0's flag (one collective per step), and a rank that receives 1 runs a barrier and
raises ``SIGTERMException``; a rank whose flag is set raises it at the end of its current step.
``SIGTERMException`` is a ``SystemExit``: ``trainer.fit`` re-raises it after ``on_exception`` and teardown
(pytorch_lightning/trainer/call.py ``_call_and_handle_interrupt``).
"""

from __future__ import annotations

import os
import signal
import time

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, id_loader
from ddpprobe.trace import pg_seq

#: Where ``SigtermProbe`` sends the signal (see the module docstring).
WHERE = ("between_steps", "mid_step", "nowhere")


class SigtermProbe(pl.LightningModule):
    """Sends ``SIGTERM`` to its own process on rank ``target_rank`` at batch ``at_step`` (``where``), and
    records ``steps`` (every ``training_step``'s batch index), ``starts`` and ``ends`` (``pg_seq()`` at
    every ``on_train_batch_start`` / ``on_train_batch_end``)."""

    def __init__(self, target_rank: int, at_step: int, where: str):
        super().__init__()
        if where not in WHERE:
            raise ValueError(f"SigtermProbe(where={where!r}): use one of {WHERE}")
        self.layer = torch.nn.Linear(2, 1)
        self.target_rank, self.at_step, self.where = target_rank, at_step, where
        self.steps: list = []
        self.starts: list = []
        self.ends: list = []

    def _signal_here(self, where: str, batch_idx: int) -> None:
        if self.where == where and self.global_rank == self.target_rank and batch_idx == self.at_step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_start(self, batch, batch_idx):
        self.starts.append(pg_seq())

    def training_step(self, batch, batch_idx):
        self.steps.append(batch_idx)
        self._signal_here("mid_step", batch_idx)
        return self.layer(batch["x"] / 100.0).square().mean()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.ends.append(pg_seq())
        self._signal_here("between_steps", batch_idx)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def received_sigterm(trainer) -> bool:
    """``trainer.received_sigterm``: a property since 2.0; before, Lightning kept no such flag (and set no
    ``SIGTERM`` handler outside SLURM), so ``False``."""
    return bool(getattr(trainer, "received_sigterm", False))


def sigterm_during_fit(
    info: RankInfo, where: str, target_rank: int = 0, at_step: int = 1, n: int = 24, batch_size: int = 2
) -> dict:
    """Scenario: one epoch of ``trainer.fit(SigtermProbe(...))`` over ``IdDataset(n)``, catching what ``fit``
    raises (``BaseException``: ``SIGTERMException`` is a ``SystemExit``) so every rank reports.

    Record keys: ``raised`` (the exception's class name, or ``None`` when ``fit`` returned), ``message``
    (its text), ``steps``, ``starts``, ``ends`` (see ``SigtermProbe``), ``received_sigterm``
    (``trainer.received_sigterm`` after ``fit``), ``seconds`` (how long ``fit`` took, in seconds).
    """
    model = SigtermProbe(target_rank, at_step, where)
    trainer = ddp_trainer(info, max_epochs=1)
    raised, message = None, None
    start = time.monotonic()
    try:
        trainer.fit(model, train_dataloaders=id_loader(n, batch_size))
    except BaseException as exc:  # noqa: BLE001 - what fit raises, SystemExit included, is the record
        raised, message = type(exc).__name__, str(exc)
    return {
        "raised": raised,
        "message": message,
        "steps": model.steps,
        "starts": model.starts,
        "ends": model.ends,
        "received_sigterm": received_sigterm(trainer),
        "seconds": time.monotonic() - start,
    }

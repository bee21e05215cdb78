"""The process-group timeout probe: how long a collective that one rank never joins waits under the
process group Lightning creates from ``DDPStrategy(timeout=...)``.

The strategy is built here, not by ``ddp_trainer``'s default (which shortens the group's timeout itself
after Lightning created it): so the only timeout the group can have is the one Lightning passed on to
``torch.distributed.init_process_group`` (pytorch_lightning/strategies/ddp.py ``DDPStrategy.setup_distributed``,
lightning_fabric/utilities/distributed.py ``_init_dist_connection``), or torch's default when Lightning
drops it.
"""

from __future__ import annotations

import datetime
import time

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, id_loader


class _NoStep(pl.LightningModule):
    """A module whose validation runs no collective: it only lets the Trainer set up the process group."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def validation_step(self, batch, batch_idx):
        pass


def all_reduce_left_by_the_others(info: RankInfo, timeout_s: float, hold_s: float) -> dict:
    """Scenario: ``trainer.validate`` with ``DDPStrategy(process_group_backend=info.backend,
    timeout=timedelta(seconds=timeout_s))`` (Lightning creates the process group), then rank 0 calls
    ``torch.distributed.all_reduce`` on the default group while every other rank sleeps ``hold_s`` seconds
    without joining it.

    Record keys: ``strategy_timeout_s`` (what the strategy was given, in seconds); rank 0 also
    ``raised`` (the exception's class name, or None if the all_reduce returned), ``message`` (its text)
    and ``waited_s`` (seconds from the call to the exception).
    """
    strategy = pl.strategies.DDPStrategy(
        process_group_backend=info.backend, timeout=datetime.timedelta(seconds=timeout_s)
    )
    trainer = ddp_trainer(info, strategy=strategy)
    trainer.validate(_NoStep(), dataloaders=id_loader(2 * info.world_size, 1), verbose=False)
    record = {"strategy_timeout_s": timeout_s}
    if info.rank != 0:
        time.sleep(hold_s)
        return record
    start = time.monotonic()
    try:
        torch.distributed.all_reduce(torch.ones(1))
        raised, message = None, None
    except Exception as exc:  # gloo raises RuntimeError or its subclass DistBackendError, by torch release
        raised, message = type(exc).__name__, str(exc)
    record.update(raised=raised, message=message, waited_s=time.monotonic() - start)
    return record

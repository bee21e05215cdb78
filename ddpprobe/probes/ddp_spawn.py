"""The fresh-interpreter probes of the ``ddp_spawn`` facts: what the process that called ``trainer.fit`` gets back
when Lightning starts the ranks itself (``ddp_spawn``), what ``trainer.predict`` refuses there, and the rank
``rank_zero_only`` reads from the environment at import (``rank_zero_at_import``).

Each scenario runs in a world of one launched process (``run_world(..., 1)``). It first makes the
process look like a plain ``python script.py``: it removes the rank variables the launcher set (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_PORT``, ... and ``OMP_NUM_THREADS``) and keeps
``MASTER_ADDR=127.0.0.1``, so ``Trainer(strategy=DDPStrategy(start_method="spawn"), devices=2)`` starts two
fresh ranks through ``torch.multiprocessing.start_processes`` on a free loopback port
(pytorch_lightning/strategies/launchers/multiprocessing.py ``_MultiProcessingLauncher``).

``SpawnProbe`` trains ``PlainFitProbe`` (ddpprobe/probes/loggers_per_rank.py) and logs, unsynced,
``"rank_value"`` = ``global_rank + 1`` and ``"omp_threads"`` = the ``OMP_NUM_THREADS`` its rank process
sees (-1 when unset).
"""

from __future__ import annotations

import datetime
import os

import torch

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.loggers_per_rank import PlainFitProbe
from ddpprobe.probes.training import regression_loader

#: The variables removed so that Lightning, not an outside launcher, starts the ranks.
_LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMP_NUM_THREADS",
)


def _as_a_plain_script() -> None:
    for name in _LAUNCHER_VARS:
        os.environ.pop(name, None)
    os.environ["MASTER_ADDR"] = "127.0.0.1"


def _spawn_trainer(info: RankInfo, devices: int, **overrides):
    strategy = pl.strategies.DDPStrategy(
        start_method="spawn", process_group_backend="gloo", timeout=datetime.timedelta(seconds=info.pg_timeout)
    )
    kwargs = dict(
        strategy=strategy,
        accelerator="cpu",
        devices=devices,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=info.rank_dir,
    )
    kwargs.update(overrides)
    return pl.Trainer(**kwargs)


class SpawnProbe(PlainFitProbe):
    """See the module docstring."""

    def training_step(self, batch, batch_idx):
        n = len(batch["id"])
        self.log("rank_value", float(self.global_rank + 1), on_step=False, on_epoch=True, batch_size=n)
        self.log(
            "omp_threads", float(os.environ.get("OMP_NUM_THREADS", -1)), on_step=False, on_epoch=True, batch_size=n
        )
        return super().training_step(batch, batch_idx)


def _params(model) -> list:
    return [float(v) for v in torch.cat([p.detach().reshape(-1) for p in model.parameters()])]


def spawn_fit(info: RankInfo, devices: int, n: int, batch_size: int = 2) -> dict:
    """Scenario: one epoch of ``trainer.fit`` a ``SpawnProbe`` under ``ddp_spawn`` with ``devices`` ranks,
    from this process.

    Record keys (this process's view after ``fit`` returned): ``returned`` (``repr`` of what ``fit``
    returned), ``callback_metrics``, ``global_step``, ``initial`` and ``final`` (the module's parameters
    before and after), ``cpus`` (the CPUs this process may run on).
    """
    _as_a_plain_script()
    torch.manual_seed(0)
    model = SpawnProbe()
    initial = _params(model)
    trainer = _spawn_trainer(info, devices, max_epochs=1, limit_val_batches=0)
    returned = trainer.fit(model, train_dataloaders=regression_loader(n, batch_size))
    return {
        "returned": repr(returned),
        "callback_metrics": {k: float(v) for k, v in sorted(trainer.callback_metrics.items())},
        "global_step": trainer.global_step,
        "initial": initial,
        "final": _params(model),
        "cpus": len(os.sched_getaffinity(0)),
    }


class PredictingProbe(PlainFitProbe):
    """``PlainFitProbe`` whose ``predict_step`` returns the batch's sample ids."""

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return batch["id"]


def spawn_predict(info: RankInfo, devices: int, return_predictions: bool) -> dict:
    """Scenario: ``trainer.predict(PlainFitProbe(), return_predictions=...)`` under ``ddp_spawn``.

    Record keys: ``raised`` (class name or None), ``message``, ``returned`` (``repr`` of the result).
    """
    _as_a_plain_script()
    trainer = _spawn_trainer(info, devices)
    try:
        returned = trainer.predict(
            PredictingProbe(), dataloaders=regression_loader(4, 2), return_predictions=return_predictions
        )
    except Exception as exc:  # noqa: BLE001 - what Lightning raises is the record
        return {"raised": type(exc).__name__, "message": str(exc), "returned": None}
    return {"raised": None, "message": None, "returned": repr(returned)}


#: The variables ``rank_zero_only`` reads at import, in its order.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def _rank_at_import(env: dict) -> int:
    import subprocess
    import sys

    from ddpprobe._lightning import fabric

    code = f"from {fabric.__name__}.utilities.rank_zero import rank_zero_only; print(rank_zero_only.rank)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return int(done.stdout.strip().splitlines()[-1])


def rank_zero_at_import(info: RankInfo, variants: dict, variants_on_rank: int) -> dict:
    """Scenario: on rank ``variants_on_rank`` only, in fresh interpreters, import Lightning's ``rank_zero``
    module and read ``rank_zero_only.rank``: once with the rank's own environment (what torchrun or the
    launcher set), and once with each of ``variants`` (name -> ``{variable: value}``) in place of the four
    rank variables. Every rank records its rank variables.

    Record keys: ``variables`` (those of the four the rank has), ``own`` (the rank read with its own
    environment, or None on the other ranks), ``variants`` (name -> the rank read).
    """
    record = {"variables": {k: os.environ[k] for k in RANK_VARIABLES if k in os.environ}, "own": None, "variants": {}}
    if info.rank == variants_on_rank:
        base = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
        record["own"] = _rank_at_import(dict(os.environ))
        record["variants"] = {name: _rank_at_import({**base, **env}) for name, env in variants.items()}
    return record

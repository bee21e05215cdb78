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

import importlib
import os
import time

import torch

from ddpprobe._lightning import fabric, pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, id_loader, seed_everything
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


#: Seconds a rank waits for rank 0's version folder before it gives up (``TimeoutError``).
VERSION_FOLDER_WAIT_S = 20.0


def _wait_for(path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.isdir(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.05)


#: Where ``_LogDirProbe`` reads ``trainer.log_dir`` at the end of the training epoch.
READ_LOG_DIR = (None, "in_rank_zero_only", "on_every_rank")


class _LogDirProbe(pl.LightningModule):
    """Logs ``"v"`` per step. At the end of the training epoch a ``@rank_zero_only`` function records a log
    folder, then (with ``barrier_after_read``) every rank meets in ``trainer.strategy.barrier()``.

    Args:
        read_log_dir: None (nothing read), ``"in_rank_zero_only"`` (the function reads ``trainer.log_dir``
            itself, on rank 0 alone) or ``"on_every_rank"`` (every rank reads ``trainer.log_dir`` and passes
            it to the function).
        barrier_after_read: call ``trainer.strategy.barrier()`` on every rank after the function (default
            True); False: the hook returns right after it.
    """

    def __init__(self, read_log_dir=None, barrier_after_read: bool = True):
        super().__init__()
        if read_log_dir not in READ_LOG_DIR:
            raise ValueError(f"read_log_dir={read_log_dir!r}: use one of {READ_LOG_DIR}")
        self.layer = torch.nn.Linear(2, 1)
        self.read_log_dir = read_log_dir
        self.barrier_after_read = barrier_after_read
        self.read: list = []

    def training_step(self, batch, batch_idx):
        self.log("v", batch["value"].mean(), on_step=True, on_epoch=False, batch_size=len(batch["id"]))
        return self.layer(batch["x"]).sum() * 0.0

    def on_train_epoch_end(self):
        if self.read_log_dir is None:
            return

        @pl.utilities.rank_zero_only
        def save_next_to_the_logs(log_dir=None):
            self.read.append(log_dir if log_dir is not None else self.trainer.log_dir)

        if self.read_log_dir == "on_every_rank":
            save_next_to_the_logs(self.trainer.log_dir)
        else:
            save_next_to_the_logs()
        if self.barrier_after_read:
            self.trainer.strategy.barrier()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def logger_versions(
    info: RankInfo,
    rank0_first: bool = True,
    version=None,
    read_log_dir=None,
    barrier_after_read: bool = True,
    checkpointing: bool = True,
) -> dict:
    """Scenario: every rank makes ``CSVLogger(save_dir=<world folder>, version=version)`` (one folder for all
    ranks) and fits ``_LogDirProbe(read_log_dir, barrier_after_read)`` for one epoch with it, checkpointing on
    (``ModelCheckpoint`` with no ``dirpath``) unless ``checkpointing=False``. With ``barrier_after_read=False``
    the scenario runs no collective of its own after the hook's ``@rank_zero_only`` function: no barrier in
    the hook, and after ``fit`` neither ``trainer.log_dir`` (a broadcast) nor a barrier.

    With ``rank0_first``, rank 0 creates its version folder first (``logger.experiment`` makes
    ``lightning_logs/version_<v>``) and the other ranks make their logger only once ``version_0`` exists
    (they wait up to ``VERSION_FOLDER_WAIT_S``): what happens when rank 0 starts earlier than its peers.

    Paths in the record are relative to the world folder. Record keys: ``version_before_fit``
    (``logger.version`` as the rank first read it), ``version`` and ``logger_log_dir`` (after ``fit``),
    ``trainer_log_dir`` (``trainer.log_dir``, read on every rank after ``fit``; None with
    ``barrier_after_read=False``), ``checkpoint_dirpath`` (None
    without checkpointing),
    ``version_folders`` (``{folder under lightning_logs: sorted entries}`` after ``fit``), ``read`` (what the
    ``@rank_zero_only`` function recorded: one path on rank 0, nothing elsewhere).
    """
    root = os.path.join(info.world_dir, "lightning_logs")
    logger = pl.loggers.CSVLogger(save_dir=info.world_dir, version=version)
    if rank0_first:
        if info.rank == 0:
            logger.experiment  # noqa: B018 - creating the experiment makes the version folder
        else:
            _wait_for(os.path.join(root, "version_0"), VERSION_FOLDER_WAIT_S)
    version_before_fit = logger.version
    model = _LogDirProbe(read_log_dir, barrier_after_read)
    trainer = ddp_trainer(
        info, max_epochs=1, limit_val_batches=0, log_every_n_steps=1, logger=logger, enable_checkpointing=checkpointing
    )
    trainer.fit(model, train_dataloaders=id_loader(2 * info.world_size, 1))
    trainer_log_dir = None
    if barrier_after_read:
        trainer_log_dir = trainer.log_dir
        trainer.strategy.barrier()

    def rel(path):
        return os.path.relpath(path, info.world_dir) if path else path

    folders = {}
    if os.path.isdir(root):
        folders = {name: sorted(os.listdir(os.path.join(root, name))) for name in sorted(os.listdir(root))}
    return {
        "version_before_fit": version_before_fit,
        "version": logger.version,
        "logger_log_dir": rel(logger.log_dir),
        "trainer_log_dir": rel(trainer_log_dir),
        "checkpoint_dirpath": rel(trainer.checkpoint_callback.dirpath) if trainer.checkpoint_callback else None,
        "version_folders": folders,
        "read": [rel(p) for p in model.read],
    }


#: The variables a launcher sets to say which rank a process is (ddpprobe's launcher sets them all). The
#: ``rank_zero_only_before_the_trainer`` scenario moves them to ``PROBE_<NAME>``, as a launcher that names
#: them its own way would, before Lightning's import-time rank lookup runs again.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


class ProbeEnvironment(fabric.plugins.environments.ClusterEnvironment):
    """A custom ``ClusterEnvironment`` for processes started by a launcher of one's own, which tells each
    process its rank in ``PROBE_RANK``, ``PROBE_LOCAL_RANK``, ``PROBE_NODE_RANK`` and ``PROBE_WORLD_SIZE``
    (not in ``RANK``/``LOCAL_RANK``); the rendezvous address and port are ``MASTER_ADDR``/``MASTER_PORT``.
    Source of the interface: lightning_fabric/plugins/environments/cluster_environment.py."""

    def __init__(self):
        super().__init__()
        self._global_rank = int(os.environ["PROBE_RANK"])
        self._world_size = int(os.environ["PROBE_WORLD_SIZE"])

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        return int(os.environ["MASTER_PORT"])

    @staticmethod
    def detect() -> bool:
        return "PROBE_RANK" in os.environ

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    def local_rank(self) -> int:
        return int(os.environ["PROBE_LOCAL_RANK"])

    def node_rank(self) -> int:
        return int(os.environ["PROBE_NODE_RANK"])


def _import_time_rank_lookup() -> None:
    """Run Lightning's import-time rank lookup again in this process's current environment, as a fresh
    ``import lightning_fabric`` would: lightning_fabric/utilities/rank_zero.py sets
    ``rank_zero_only.rank = getattr(rank_zero_only, "rank", _get_rank() or 0)`` (``_get_rank`` reads
    ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``, ``JSM_NAMESPACE_RANK``). ``rank_zero_only`` is one function
    object shared by lightning_utilities, lightning_fabric and the trainer package."""
    module = importlib.import_module(f"{fabric.__name__}.utilities.rank_zero")
    if hasattr(module.rank_zero_only, "rank"):
        del module.rank_zero_only.rank
    importlib.reload(module)


def rank_zero_only_before_the_trainer(info: RankInfo, set_rank_first: bool = False) -> dict:
    """Scenario: a process whose launcher says its rank in ``PROBE_*`` variables only (``RANK_VARIABLES``
    removed, Lightning's import-time rank lookup run again), then, in order: read ``rank_zero_only.rank``,
    call a ``@rank_zero_only`` function and a ``CSVLogger(save_dir=".")``'s ``log_metrics`` + ``save``
    (``"x"`` = the global rank, step 0; the rank's own folder), build
    ``Trainer(strategy="ddp", plugins=[ProbeEnvironment()])``, read ``rank_zero_only.rank`` and call the
    function again, then ``trainer.validate`` (joins the world: proves the environment works).

    With ``set_rank_first``, the process first sets ``rank_zero_only.rank = int(os.environ["PROBE_RANK"])``
    itself (the fix).

    Record keys: ``env_rank`` (what ``RANK`` holds after the move: None), ``rank_before``, ``ran_before``
    (the function ran), ``rank_after``, ``ran_after``, ``global_rank`` (``trainer.global_rank``),
    ``world_size`` (``trainer.world_size``).
    """
    saved_env, rank_zero_only = dict(os.environ), pl.utilities.rank_zero_only
    saved_rank = rank_zero_only.rank
    try:
        for name in RANK_VARIABLES:
            os.environ[f"PROBE_{name}"] = os.environ.pop(name)
        _import_time_rank_lookup()
        return _before_and_after_the_trainer(info, set_rank_first)
    finally:  # leave the process as it was (a scenario may run inside a torchrun world's own process)
        os.environ.clear()
        os.environ.update(saved_env)
        rank_zero_only.rank = saved_rank


def _before_and_after_the_trainer(info: RankInfo, set_rank_first: bool) -> dict:
    rank_zero_only = pl.utilities.rank_zero_only
    if set_rank_first:
        rank_zero_only.rank = int(os.environ["PROBE_RANK"])

    calls: list = []

    @rank_zero_only
    def note():
        calls.append(rank_zero_only.rank)

    rank_before = rank_zero_only.rank
    note()
    ran_before = bool(calls)
    logger = pl.loggers.CSVLogger(save_dir=".")
    logger.log_metrics({"x": float(info.rank)}, step=0)
    logger.save()
    trainer = ddp_trainer(info, plugins=[ProbeEnvironment()])
    rank_after = rank_zero_only.rank
    calls.clear()
    note()
    ran_after = bool(calls)
    trainer.validate(_ValidateNothing(), dataloaders=id_loader(info.world_size, 1), verbose=False)
    return {
        "env_rank": os.environ.get("RANK"),
        "rank_before": rank_before,
        "ran_before": ran_before,
        "rank_after": rank_after,
        "ran_after": ran_after,
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
    }


class _ValidateNothing(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def validation_step(self, batch, batch_idx):
        return None

"""The collectives probe: what ``self.all_gather`` returns, what happens when ranks disagree, and a
pad-gather-trim helper for tensors whose first dimension differs between ranks.

``CollectiveProbe`` runs one named action in ``on_validation_epoch_end`` (every rank reaches that hook
once per ``trainer.validate``) and records what it got back:

==================  =================================================================================
action              what each rank does
==================  =================================================================================
``"shapes"``        ``self.all_gather`` of a tensor, a 0-d tensor, a Python float and a dict of tensors
``"uneven"``        ``self.all_gather`` of ``uneven_rows(rank)``: rank ``r`` sends ``r + 1`` rows
``"pad_trim"``      ``all_gather_uneven(self, uneven_rows(rank))``: the same rows, padded and trimmed
``"log_rank0"``     ``self.log(..., sync_dist=True)`` inside ``if self.global_rank == 0:``
==================  =================================================================================

The tensors each rank sends are pure functions of its rank (``local_tensor``, ``local_scalar``,
``uneven_rows``), so a test computes the expected gather without Lightning.
Sources: pytorch_lightning/core/module.py ``LightningModule.all_gather``;
lightning_fabric/utilities/distributed.py ``_all_gather_ddp_if_available``;
pytorch_lightning/strategies/single_device.py ``SingleDeviceStrategy.all_gather``.
"""

from __future__ import annotations

import torch
import torch.distributed

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, id_loader, recorded_warnings, trainer_metrics

#: Shape of the tensor ``local_tensor`` gives each rank.
LOCAL_SHAPE = (2, 3)

#: The actions ``CollectiveProbe`` knows.
ACTIONS = ("shapes", "uneven", "pad_trim", "log_rank0")


def local_tensor(rank: int) -> torch.Tensor:
    """The (2, 3) float32 tensor rank ``rank`` all-gathers: ``100 * rank + [[0, 1, 2], [3, 4, 5]]``."""
    return (100 * rank + torch.arange(6, dtype=torch.float32)).reshape(LOCAL_SHAPE)


def local_scalar(rank: int) -> float:
    """The number rank ``rank`` all-gathers as a 0-d tensor and as a Python float: ``rank + 0.5``."""
    return rank + 0.5


def uneven_rows(rank: int) -> torch.Tensor:
    """A ``(rank + 1, 2)`` float32 tensor: row ``i`` is ``[10 * rank + i + 1, -(10 * rank + i + 1)]``.

    Rank 0 has 1 row, rank 1 has 2, ...: first dimensions differ between ranks, as they do for the
    last, partial batch of a shard or for per-rank lists of variable length. No entry is 0, so a
    padding row (zeros) left in a result cannot pass for data.
    """
    ids = torch.arange(rank + 1, dtype=torch.float32) + 10 * rank + 1
    return torch.stack([ids, -ids], dim=1)


def all_gather_uneven(module: pl.LightningModule, tensor: torch.Tensor) -> list:
    """``all_gather`` a tensor whose first dimension may differ between ranks; a collective.

    ``LightningModule.all_gather`` needs the same shape on every rank (its docstring: "otherwise your
    program will stall forever"). This helper makes the shapes equal, then undoes it:

    1. all_gather the first-dimension sizes (one int64 per rank);
    2. pad this rank's tensor with zero rows up to the largest size;
    3. all_gather the padded tensors, shape ``(W, max_rows, *tensor.shape[1:])``;
    4. trim each rank's block back to its own size.

    Every rank must call it (it runs two all_gathers). Works in a non-distributed run too, where
    ``all_gather`` adds no leading dimension (``SingleDeviceStrategy.all_gather`` returns its input).

    Args:
        module: the LightningModule whose ``all_gather`` (hence whose Trainer's strategy) to use.
        tensor: shape ``(n_r, *rest)``; ``rest`` and dtype must match across ranks, ``n_r`` may not.

    Returns:
        A list of ``W`` tensors, element ``r`` being rank ``r``'s ``tensor`` (shape ``(n_r, *rest)``),
        identical on every rank.
    """
    size = torch.tensor(tensor.shape[0], dtype=torch.int64, device=tensor.device)
    sizes = module.all_gather(size).reshape(-1)
    max_rows = int(sizes.max())
    padded = tensor.new_zeros((max_rows, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    gathered = module.all_gather(padded)
    if gathered.dim() == padded.dim():  # no process group: all_gather returned its input
        gathered = gathered.unsqueeze(0)
    return [gathered[r, : int(n)] for r, n in enumerate(sizes.tolist())]


def _describe(value) -> dict:
    """``{"shape": [...], "values": nested list}`` of a tensor, or a dict of those for a dict."""
    if isinstance(value, dict):
        return {key: _describe(item) for key, item in sorted(value.items())}
    return {"shape": list(value.shape), "values": value.tolist()}


class CollectiveProbe(pl.LightningModule):
    """Runs ``action`` (one of ``ACTIONS``) in ``on_validation_epoch_end`` and keeps the result.

    Args:
        action: what to do, see the module docstring.
        log_rank_zero_only: for ``"log_rank0"``, the ``rank_zero_only`` argument of the ``self.log`` call.
    """

    def __init__(self, action: str, log_rank_zero_only: bool = False):
        super().__init__()
        if action not in ACTIONS:
            raise ValueError(f"CollectiveProbe(action={action!r}): use one of {ACTIONS}")
        self.layer = torch.nn.Linear(2, 1)
        self.action = action
        self.log_rank_zero_only = log_rank_zero_only
        self.result: dict = {}

    def validation_step(self, batch, batch_idx):
        return None

    def on_validation_epoch_end(self):
        rank = self.global_rank
        if self.action == "shapes":
            self.result = {
                "tensor": _describe(self.all_gather(local_tensor(rank))),
                "scalar_tensor": _describe(self.all_gather(torch.tensor(local_scalar(rank)))),
                "python_float": _describe(self.all_gather(local_scalar(rank))),
                "dict": _describe(self.all_gather({"t": local_tensor(rank), "s": torch.tensor(local_scalar(rank))})),
            }
        elif self.action == "uneven":
            self.result = {"gathered": _describe(self.all_gather(uneven_rows(rank)))}
        elif self.action == "pad_trim":
            self.result = {"gathered": [part.tolist() for part in all_gather_uneven(self, uneven_rows(rank))]}
        elif self.action == "log_rank0":
            if self.global_rank == 0:
                self.log("rank0_value", local_scalar(rank), sync_dist=True, rank_zero_only=self.log_rank_zero_only)
            self.result = {"logged": self.global_rank == 0}


def collective(info: RankInfo, action: str, strategy: str = "ddp", log_rank_zero_only: bool = False) -> dict:
    """Scenario: ``trainer.validate`` a ``CollectiveProbe`` running ``action``; return what it got.

    Args:
        strategy: ``"ddp"`` builds the Trainer with ``ddp_trainer`` (devices = world size);
            ``"auto"`` builds ``Trainer(accelerator="cpu", devices=1, strategy="auto")``, a
            non-distributed run (meaningful in a world of size 1).

    Record keys: ``global_rank``, ``world_size``, ``strategy`` (class name of the Trainer's strategy),
    ``process_group`` (whether ``torch.distributed`` is initialised), ``result`` (the action's output:
    ``{"shape", "values"}`` per gathered object), the three metric dicts, ``warnings``.
    """
    model = CollectiveProbe(action, log_rank_zero_only=log_rank_zero_only)
    with recorded_warnings() as warnings:
        if strategy == "ddp":
            trainer = ddp_trainer(info)
        elif strategy == "auto":
            trainer = pl.Trainer(
                accelerator="cpu",
                devices=1,
                strategy="auto",
                logger=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                enable_checkpointing=False,
                default_root_dir=info.rank_dir,
            )
        else:
            raise ValueError(f"strategy={strategy!r}: use 'ddp' or 'auto'")
        trainer.validate(model, dataloaders=id_loader(info.world_size, 1), verbose=False)
    return {
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "process_group": torch.distributed.is_available() and torch.distributed.is_initialized(),
        "result": model.result,
        **trainer_metrics(trainer),
        "warnings": warnings,
    }

"""The collective probes of tests/facts/test_collectives.py, test_fabric.py and test_reductions_outside_log.py:
``strategy.broadcast`` of a
Python object, Lightning's ``_gather_all_tensors`` on shapes that differ between ranks, and Fabric's
collectives, ``rank_zero_first``, ``no_backward_sync`` and ``setup_dataloaders``.

``evaluate_collectives`` runs them from ``on_validation_start`` of a ``trainer.validate``;
``fabric_collectives_and_loaders`` from a ``Fabric`` that joins the launched world (``fabric.launch()``; the processes
exist already, ``LOCAL_RANK`` is set).
"""

from __future__ import annotations

import datetime
import os
import time

import torch
from torch.utils.data import DataLoader, WeightedRandomSampler

from ddpprobe._lightning import fabric, pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import batch_ids, ddp_trainer, id_loader
from ddpprobe.probes.data import IdDataset


def uneven_tensors(rank: int) -> tuple:
    """The two tensors rank ``rank`` gathers: ``arange(rank)`` (shape (r,), empty on rank 0) and
    ``full((r + 1, 2 - r), r)`` (float32)."""
    return torch.arange(rank, dtype=torch.float32), torch.full((rank + 1, 2 - rank), float(rank))


class _CollectivesProbe(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.result: dict = {}

    def on_validation_start(self):
        from lightning_fabric.utilities.distributed import _gather_all_tensors

        rank = self.global_rank
        obj = {"rank": rank, "names": [f"from rank {rank}"]}
        given = {"rank": rank, "names": [f"from rank {rank}"]}
        got = self.trainer.strategy.broadcast(given)
        one, two = uneven_tensors(rank)
        self.result = {
            "broadcast": got,
            "input_after": given,
            "input_unchanged": given == obj,
            "gathered_1d": [t.tolist() for t in _gather_all_tensors(one.to(self.device))],
            "gathered_2d": [t.tolist() for t in _gather_all_tensors(two.to(self.device))],
        }

    def validation_step(self, batch, batch_idx):
        pass


def evaluate_collectives(info: RankInfo) -> dict:
    """Scenario: ``trainer.validate`` a module whose ``on_validation_start`` calls
    ``trainer.strategy.broadcast({"rank": r, "names": [...]})`` and ``_gather_all_tensors`` of
    ``uneven_tensors(rank)``.

    Record keys: ``broadcast`` (what came back), ``input_after`` and ``input_unchanged`` (the object
    passed in, after the call), ``gathered_1d`` / ``gathered_2d`` (the gathered tensors, as lists, one
    per rank).
    """
    model = _CollectivesProbe()
    ddp_trainer(info).validate(model, dataloaders=id_loader(info.world_size, 1), verbose=False)
    return model.result


def _fabric(info: RankInfo):
    strategy = fabric.strategies.DDPStrategy(
        process_group_backend=info.backend, timeout=datetime.timedelta(seconds=info.pg_timeout)
    )
    runner = fabric.Fabric(
        accelerator=info.accelerator, devices=info.devices, num_nodes=info.num_nodes, strategy=strategy
    )
    runner.launch()
    return runner


#: Rank 0's time inside ``rank_zero_first`` (seconds), long enough for an unordered peer to enter first.
ZERO_FIRST_HOLD_S = 0.5


def _rank_zero_first(runner, info: RankInfo) -> dict:
    marker = os.path.join(info.world_dir, "rank0_done")
    with runner.rank_zero_first():
        saw_done = os.path.exists(marker)
        if runner.global_rank == 0:
            time.sleep(ZERO_FIRST_HOLD_S)
            with open(marker, "w", encoding="utf-8") as f:
                f.write("done")
    return {"saw_rank0_done_on_entry": saw_done}


def _no_backward_sync(runner, rank: int) -> dict:
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.5)
    model = runner.setup_module(model)
    x = torch.tensor([[rank + 1.0]], device=runner.device)
    grads = {}
    for enabled in (True, False):
        with runner.no_backward_sync(model, enabled=enabled):
            runner.backward((model(x) ** 2).sum())
        grads["no_sync" if enabled else "synced"] = float(model.weight.grad.reshape(-1)[0])
        model.weight.grad = None
    return grads


def _collections(runner, rank: int) -> dict:
    def tensor(value):
        return torch.tensor(value, device=runner.device)

    reduced = runner.all_reduce({"a": tensor(rank + 1.0), "b": [tensor(2.0 * (rank + 1))], "s": "text"})
    summed = runner.all_reduce({"a": tensor(rank + 1.0)}, reduce_op="sum")
    gathered = runner.all_gather({"a": tensor(float(rank)), "b": [tensor([rank, rank])]})
    return {
        "all_reduce": {"a": float(reduced["a"]), "b": [float(t) for t in reduced["b"]], "s": reduced["s"]},
        "all_reduce_sum": float(summed["a"]),
        "all_gather": {"a": gathered["a"].tolist(), "b": [t.tolist() for t in gathered["b"]]},
    }


class _UnsizedSampler(torch.utils.data.Sampler):
    """A custom sampler without ``__len__``: yields ``0 .. n-1`` in order."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def _setup_dataloaders(runner, n: int, seed: int) -> dict:
    dataset = IdDataset(n)
    plain = runner.setup_dataloaders(DataLoader(dataset, batch_size=2, shuffle=False))
    shuffled = runner.setup_dataloaders(DataLoader(dataset, batch_size=2, shuffle=True))
    weights = [1.0] * (n - 1) + [float(n)]
    sampler = WeightedRandomSampler(weights, n, generator=torch.Generator().manual_seed(seed))
    custom = runner.setup_dataloaders(DataLoader(dataset, batch_size=2, sampler=sampler))
    try:
        runner.setup_dataloaders(DataLoader(dataset, batch_size=2, sampler=_UnsizedSampler(n)))
        unsized = None
    except Exception as exc:
        unsized = [type(exc).__name__, str(exc)]
    return {
        "plain": [i for b in plain for i in batch_ids(b)],
        "plain_shuffle": plain.sampler.shuffle,
        "shuffled": [[i for b in shuffled for i in batch_ids(b)] for _ in range(2)],
        "custom": [i for b in custom for i in batch_ids(b)],
        "custom_sampler": type(custom.sampler).__name__,
        "custom_shuffle": custom.sampler.shuffle,
        "unsized": unsized,
    }


def fabric_collectives_and_loaders(info: RankInfo, n: int = 8, seed: int = 3) -> dict:
    """Scenario: a launched ``Fabric`` (``DDPStrategy``, this world's backend) runs, in order:

    - ``rank_zero_first``: rank 0 holds the block ``ZERO_FIRST_HOLD_S`` seconds, then leaves a marker file
      in the world's folder; every rank records whether the marker existed when it entered;
    - ``no_backward_sync``: a ``Linear(1, 1, bias=False)`` (weight 0.5) set up with Fabric, input ``r + 1``,
      loss ``(w x)^2``; the weight's gradient with ``enabled=True`` and then ``False``;
    - ``all_reduce`` / ``all_gather`` of dicts holding tensors, a list and a string;
    - ``setup_dataloaders`` of ``IdDataset(n)`` loaders: ``shuffle=False``, ``shuffle=True`` (iterated
      twice), a seeded ``WeightedRandomSampler`` and a custom sampler without ``__len__`` (``unsized``: the
      ``[class name, message]`` of what it raised, or None).

    Record keys: ``rank_zero_first``, ``no_backward_sync``, ``collections``, ``dataloaders``.
    """
    runner = _fabric(info)
    return {
        "rank_zero_first": _rank_zero_first(runner, info),
        "no_backward_sync": _no_backward_sync(runner, info.rank),
        "collections": _collections(runner, info.rank),
        "dataloaders": _setup_dataloaders(runner, n, seed),
    }

"""Seeds per rank: ``seed_everything(s)`` gives every rank the same random stream, so noise drawn in
``training_step`` and dropout masks are the *same* on every rank; without a seed they differ (where torch seeds
each fresh process from OS entropy, as 2.13 does), and the initial weights are equal either way because DDP
broadcasts rank 0's.

``seed_everything`` (lightning_fabric/utilities/seed.py) calls ``torch.manual_seed(s)`` (and Python's and
NumPy's) with the same ``s`` in every rank; nothing in it depends on the rank. ``DistributedDataParallel``
broadcasts rank 0's parameters and buffers when it wraps the model (torch/nn/parallel/distributed.py
``_sync_module_states``), before ``on_train_start``. DataLoader worker ``k`` is seeded ``base_seed + k``, where
``base_seed`` is drawn from the rank's default generator when the iterator is created
(torch/utils/data/dataloader.py ``_BaseDataLoaderIter.__init__``, torch/utils/data/_utils/worker.py
``_worker_loop``): equal on every seeded rank. ``seed_everything(s, workers=True)`` makes Lightning add
``pl_worker_init_function`` (lightning_fabric/utilities/data.py ``_auto_add_worker_init_fn``), which reseeds
each worker from ``(base_seed, worker_id, global_rank)``. The fix for per-rank noise with equal weights:
``torch.manual_seed(s + self.global_rank)`` in ``on_train_start``, after the broadcast.

The probe (ddpprobe/probes/rank_state.py ``NoiseProbe``) draws ``torch.rand(3)`` and a 16-element dropout
mask per step; rank ``r`` sees different samples than its peers (``ids``), so equal draws are not equal data.
"""

import functools
import itertools
import json
import subprocess
import sys

import pytest
import torch

from ddpprobe.probes import rank_state, samplers_per_loader
from tests.support import oracle

SEED = 7


def _pairs(per_rank):
    return list(itertools.combinations(range(len(per_rank)), 2))


@functools.lru_cache(maxsize=None)
def _fresh_interpreters_draw_differently() -> bool:
    """Whether two brand-new interpreters draw different first numbers from torch's default generator: torch
    2.13 seeds it from OS entropy; older torch starts every process at one fixed default seed
    (``default_rng_seed_val``, c10/core/GeneratorImpl.h). The oracle for the unseeded case."""
    code = "import json, torch\nprint(json.dumps(torch.rand(2).tolist()))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    draws = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        draws.append(json.loads(out.strip().splitlines()[-1]))
    return draws[0] != draws[1]


def _replayed_stream(seed: int, steps: int) -> tuple:
    """What a process draws after ``torch.manual_seed(seed)`` when each step draws ``torch.rand(3)`` and then a
    dropout mask of 16 ones (p = 0.5), as ``NoiseProbe.training_step`` does: ``(noise, masks)`` per step.
    torch itself replays it (in a forked generator state, leaving this process's untouched)."""
    noise, masks = [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(steps):
            noise.append(torch.rand(rank_state.NOISE_SIZE).tolist())
            mask = torch.nn.functional.dropout(torch.ones(rank_state.MASK_SIZE), p=0.5, training=True) > 0
            masks.append([int(m) for m in mask])
    return noise, masks


def _replayed_initial_weight(seed: int) -> list:
    """The 4 weights of ``NoiseProbe``'s ``Linear(2, 2)`` built right after ``torch.manual_seed(seed)``,
    replayed by torch in a forked generator state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.nn.Linear(2, 2).weight.detach().flatten().tolist()


@pytest.mark.parametrize("world_size", [2, 3])
def test_seed_everything_gives_every_rank_the_same_noise_and_dropout_masks_on_different_samples(
    run_world, semantics, world_size
):
    """After ``seed_everything(7)`` before the Trainer, every rank's ``torch.rand`` in ``training_step``, its
    dropout masks and the noise its dataset draws (no workers: in the rank itself) are identical, step by
    step, while the ranks hold different samples: the "independent noise per rank" a user expects is the
    same noise W times. The initial weights are equal too (same seed, same draws): on every rank they are
    the weights torch draws for a ``Linear(2, 2)`` right after ``torch.manual_seed(7)``, so the ranks agree
    because each one was seeded with 7, not because they started from one default state."""
    world = run_world(rank_state.seeded_randomness, world_size, seed=SEED)

    records = world.records
    seeded_weight = _replayed_initial_weight(SEED)
    initial = [rec["initial_weight"] for rec in records]
    assert initial == [seeded_weight] * world_size, (
        oracle.side_by_side("initial_weight", initial) + f"  expected {seeded_weight}"
    )
    ids = [rec["ids"] for rec in records]
    assert all(ids[a] != ids[b] for a, b in _pairs(ids)), oracle.side_by_side("ids", ids)
    noise = [rec["noise"] for rec in records]
    assert noise[0][0] != noise[0][1], "data do not discriminate: two steps drew the same noise"
    semantics.number("ranks with rank 0's noise", sum(n == noise[0] for n in noise), vs=("ranks", world_size))
    for key in ("noise", "masks", "worker_noise", "initial_weight", "train_start_weight"):
        got = [rec[key] for rec in records]
        assert got == [got[0]] * world_size, oracle.side_by_side(key, got)


@pytest.mark.parametrize("world_size", [2, 3])
def test_without_a_seed_ranks_draw_as_fresh_interpreters_do_and_ddp_broadcasts_rank_0s_initial_weights(
    run_world, semantics, world_size
):
    """Without ``seed_everything`` each rank starts from a fresh interpreter's generator state: with a torch
    that seeds from OS entropy (2.13 here: two fresh interpreters draw differently), noise, dropout masks and
    initial weights differ between every pair of ranks; with a torch that starts at its fixed default seed
    they are equal on every rank, as if seeded. Either way DDP's broadcast makes every rank train from rank
    0's initial weights: ``train_start_weight`` on every rank equals rank 0's ``initial_weight``."""
    world = run_world(rank_state.seeded_randomness, world_size)

    records = world.records
    initial = [rec["initial_weight"] for rec in records]
    entropy_seeded = _fresh_interpreters_draw_differently()
    for key in ("noise", "masks", "initial_weight"):
        got = [rec[key] for rec in records]
        if entropy_seeded:
            assert all(got[a] != got[b] for a, b in _pairs(got)), oracle.side_by_side(key, got)
        else:
            assert got == [got[0]] * world_size, oracle.side_by_side(key, got)
    start = [rec["train_start_weight"] for rec in records]
    semantics.number(
        "ranks training from rank 0's initial weights",
        sum(s == initial[0] for s in start),
        vs=("ranks built with rank 0's weights", sum(i == initial[0] for i in initial)),
    )
    assert start == [initial[0]] * world_size, oracle.side_by_side("train_start_weight", start)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("workers", [False, True])
def test_dataloader_workers_draw_the_same_numbers_on_every_rank_unless_seed_everything_workers_true(
    run_world, semantics, world_size, workers
):
    """Two DataLoader workers per rank, ``seed_everything(7, workers=...)``. With ``workers=False`` torch seeds
    worker ``k`` with ``base_seed + k``, ``base_seed`` drawn from the rank's (equally seeded) generator: the
    noise each sample draws in its worker is the same on every rank at every step. With ``workers=True``
    Lightning's ``pl_worker_init_function`` mixes in the global rank: every rank's worker noise differs. In
    both cases the two workers of one rank differ (batch 0 comes from worker 0, batch 1 from worker 1)."""
    world = run_world(rank_state.seeded_randomness, world_size, seed=SEED, workers=workers, num_workers=2)

    got = [rec["worker_noise"] for rec in world.records]
    for rank_noise in got:
        assert rank_noise[0] != rank_noise[1], oracle.side_by_side("worker noise per batch", got)
    same_as_rank0 = sum(g == got[0] for g in got)
    semantics.number(f"ranks with rank 0's worker noise (workers={workers})", same_as_rank0, vs=("ranks", world_size))
    if workers:
        assert all(got[a] != got[b] for a, b in _pairs(got)), oracle.side_by_side("worker noise", got)
    else:
        assert got == [got[0]] * world_size, oracle.side_by_side("worker noise", got)


@pytest.mark.parametrize("world_size", [2, 3])
def test_reseeding_with_the_global_rank_in_on_train_start_gives_each_rank_its_own_stream_and_equal_weights(
    run_world, semantics, world_size
):
    """The fix: ``seed_everything(7, workers=True)`` before the Trainer (equal initial weights, reproducible
    runs, per-rank worker seeds), then ``torch.manual_seed(7 + self.global_rank)`` in ``on_train_start``, which
    runs after DDP broadcast the weights. Rank ``r``'s noise and dropout masks are exactly the stream torch
    draws after ``manual_seed(7 + r)`` (the dataset draws in the workers, so the rank's own generator serves
    only the probe), different on every rank; every rank trains from the same weights."""
    world = run_world(rank_state.seeded_randomness, world_size, seed=SEED, workers=True, num_workers=2, rank_seed=SEED)

    records = world.records
    steps = len(records[0]["noise"])
    for rank, rec in enumerate(records):
        noise, masks = _replayed_stream(SEED + rank, steps)
        assert rec["noise"] == noise, oracle.side_by_side("noise", [r["noise"] for r in records])
        assert rec["masks"] == masks, oracle.side_by_side("masks", [r["masks"] for r in records])
    noise = [rec["noise"] for rec in records]
    semantics.number("rank 1's first draw", noise[1][0][0], vs=("rank 0's", noise[0][0][0]))
    assert all(noise[a] != noise[b] for a, b in _pairs(noise)), oracle.side_by_side("noise", noise)
    start = [rec["train_start_weight"] for rec in records]
    assert start == [records[0]["initial_weight"]] * world_size, oracle.side_by_side("train_start_weight", start)


@pytest.mark.mirrors(
    "tests_pytorch/trainer/test_dataloaders.py::test_auto_add_worker_init_fn_distributed",
    "tests_fabric/utilities/test_seed.py::test_pl_worker_init_function",
)
@pytest.mark.parametrize("workers", [False, True])
def test_dataloader_workers_draw_numpy_stdlib_and_torch_numbers_unique_per_rank_only_with_seed_everything_workers(
    run_world, semantics, workers
):
    """Two DataLoader workers per rank after ``seed_everything(7, workers=...)``, each item drawing from
    NumPy's, the standard library's and torch's global generator inside its worker. torch seeds all three
    in each worker from ``base_seed + worker_id``, so the two workers of a rank always draw differently;
    but ``base_seed`` comes from the rank's own generator, seeded alike on every rank, so with
    ``workers=False`` rank 1's workers draw exactly rank 0's numbers, for all three generators. With
    ``workers=True`` Lightning's ``pl_worker_init_function`` mixes the global rank in, and no number repeats
    across (rank, worker). Mirrors Lightning's tests_pytorch/trainer/test_dataloaders.py::
    test_auto_add_worker_init_fn_distributed (NumPy draws, 2 GPUs) and tests_fabric/utilities/test_seed.py::
    test_pl_worker_init_function (one process). Source: lightning_fabric/utilities/seed.py
    ``pl_worker_init_function``; pytorch_lightning/trainer/connectors/data_connector.py
    ``_auto_add_worker_init_fn``; torch/utils/data/_utils/worker.py ``_worker_loop`` (seeds ``random``,
    torch and NumPy)."""
    world_size = 2
    world = run_world(samplers_per_loader.worker_draws, world_size, seed=7, workers=workers)

    draws = [rec["draws"] for rec in world.records]
    for rank_draws in draws:
        by_worker = {d["worker"]: d for d in rank_draws}
        assert sorted(by_worker) == [0, 1], oracle.side_by_side("workers", draws)
        for generator in ("numpy", "stdlib", "torch"):
            assert by_worker[0][generator] != by_worker[1][generator], oracle.side_by_side(generator, draws)
    if workers:
        for generator in ("numpy", "stdlib", "torch"):
            values = [d[generator] for rank_draws in draws for d in rank_draws]
            assert len(set(values)) == len(values), oracle.side_by_side(generator, draws)
    else:
        assert draws == [draws[0]] * world_size, oracle.side_by_side("draws", draws)
    same = sum(d == draws[0] for d in draws)
    semantics.number(f"ranks drawing rank 0's worker numbers (workers={workers})", same, vs=("ranks", world_size))

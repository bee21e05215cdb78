"""What does DDP keep equal across ranks, and what is left to your code?

DDP keeps two things equal: it broadcasts rank 0's parameters and buffers when it wraps the module (and the
buffers again before every training forward), and it averages the gradients at every backward
(torch/nn/parallel/distributed.py ``_sync_module_states``, the reducer's all-reduce divided by the world size).
Everything else a rank holds is that rank's own: the optimizer's and the scheduler's settings (Lightning's
``configure_optimizers`` runs on every rank, pytorch_lightning/core/optimizer.py ``_init_optimizers_and_lr_schedulers``,
and nothing syncs what it returns), plain attributes of the module (a tensor attribute is not a buffer), and the
dataset a rank builds in ``setup`` (``DistributedSampler`` shards the dataset the rank holds). And the first step
of W ranks of batch b is one process's on the W*b samples only when the loss is averaged over the batch.

These are the facts behind the DDP contract's table (ddpprobe/contract/_table.py), which the audit and the guard
explain with. The probe: ddpprobe/probes/contract.py (a ``Linear(3, 1)`` from fixed weights, SGD, squared errors).
Expected values are computed here from the samples each rank ran (``x = [i, 1, i % 2]``, ``y = i % 3``), in
plain Python.
"""

import math

import pytest
import torch

from ddpprobe.probes import contract
from tests.support import oracle


def _gradient(weight: list, ids: list, loss: str) -> list:
    """d/dw of ``sum_i (w.x_i - y_i)^2`` over ``ids`` (``loss="sum"``) or of its mean (``"mean"``)."""
    grad = [0.0, 0.0, 0.0]
    for i in ids:
        x, y = contract.line_sample(i)
        error = sum(w * xi for w, xi in zip(weight, x)) - y
        grad = [g + 2 * error * xi for g, xi in zip(grad, x)]
    return [g / len(ids) for g in grad] if loss == "mean" else grad


def _average(vectors: list) -> list:
    return [sum(parts) / len(vectors) for parts in zip(*vectors)]


def _step(weight: list, lr: float, grad: list) -> list:
    return [w - lr * g for w, g in zip(weight, grad)]


def _close(a: list, b: list, tol: float = 1e-5) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_optimizer_setting_computed_from_a_rank_local_value_stays_rank_local_and_sets_the_weights_apart(
    run_world, semantics, world_size
):
    """``configure_optimizers`` runs on every rank and nothing syncs what it returns: a learning rate computed from
    the rank (``BASE_LR * (1 + global_rank)``) stays each rank's own. DDP still averages the gradients, so after the
    first step rank r holds ``w0 - lr_r * mean_r(grad_r)``: the ranks' weights differ from the first step on, and
    nothing brings them back together."""
    world = run_world(contract.contract_fit, world_size, n=4 * world_size, steps=1, lr_from_rank=True)

    w0 = list(contract.INITIAL_WEIGHT)
    lrs = [rec["lrs"][0] for rec in world.records]
    grad = _average([_gradient(w0, rec["ids"][0], "mean") for rec in world.records])
    expected = [_step(w0, contract.BASE_LR * (1 + r), grad) for r in range(world_size)]
    synced_lr = _step(w0, contract.BASE_LR, grad)
    oracle.assert_distinct(own_lr=expected[1][0], rank_0s_lr=synced_lr[0])
    after = [rec["weights"][0] for rec in world.records]
    semantics.number(
        "rank 1's first weight after step 1", after[1][0], vs=("with rank 0's learning rate", synced_lr[0])
    )
    assert lrs == [contract.BASE_LR * (1 + r) for r in range(world_size)], oracle.side_by_side("lr", lrs)
    assert all(_close(a, e) for a, e in zip(after, expected)), (
        oracle.side_by_side("weights", after) + f" expected {expected}"
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_lr_scheduler_setting_computed_from_a_rank_local_value_stays_rank_local(run_world, semantics, world_size):
    """A ``StepLR`` whose ``gamma`` comes from the rank (``0.5 / (1 + global_rank)``): Lightning steps every rank's
    scheduler after each optimizer step (``interval="step"``) and syncs none of its settings, so the second step
    runs with ``BASE_LR * gamma_r`` on rank r, and the weights differ after it (they were equal after the first,
    which ran with the same ``BASE_LR`` everywhere)."""
    world = run_world(contract.contract_fit, world_size, n=4 * world_size, steps=2, gamma_from_rank=True)

    w0 = list(contract.INITIAL_WEIGHT)
    w1 = _step(w0, contract.BASE_LR, _average([_gradient(w0, rec["ids"][0], "mean") for rec in world.records]))
    grad2 = _average([_gradient(w1, rec["ids"][1], "mean") for rec in world.records])
    lr2 = [contract.BASE_LR * 0.5 / (1 + r) for r in range(world_size)]
    expected = [_step(w1, lr, grad2) for lr in lr2]
    oracle.assert_distinct(own_gamma=expected[1][0], rank_0s_gamma=_step(w1, lr2[0], grad2)[0])
    got_lr = [rec["lrs"] for rec in world.records]
    semantics.number("rank 1's second learning rate", got_lr[1][1], vs=("rank 0's", got_lr[0][1]))
    assert all(_close(got, [contract.BASE_LR, lr], 1e-12) for got, lr in zip(got_lr, lr2)), oracle.side_by_side(
        "lr per step", got_lr
    )
    first = [rec["weights"][0] for rec in world.records]
    assert all(_close(f, w1) for f in first), oracle.side_by_side("weights after step 1", first)
    second = [rec["weights"][1] for rec in world.records]
    assert all(_close(a, e) for a, e in zip(second, expected)), oracle.side_by_side("weights after step 2", second)


@pytest.mark.parametrize("world_size", [2, 3])
def test_an_attribute_set_from_the_rank_before_training_stays_that_ranks_own(run_world, semantics, world_size):
    """The module's ``__init__`` stores ``[global_rank]`` twice: as a plain tensor attribute and as a registered
    buffer. DDP broadcasts rank 0's buffers when it wraps the module (and before every training forward), so the
    buffer is ``[0]`` on every rank from ``on_fit_start`` on; the plain attribute is nobody's business but the
    rank's: ``[r]`` on rank r at the start and at the end of ``fit``."""
    world = run_world(contract.contract_fit, world_size, n=4 * world_size, steps=1)

    for moment in ("fit_start", "fit_end"):
        attr = [rec["attrs"][moment]["attr"] for rec in world.records]
        buffer = [rec["attrs"][moment]["buffer"] for rec in world.records]
        assert attr == [[float(r)] for r in range(world_size)], oracle.side_by_side(f"attribute at {moment}", attr)
        assert buffer == [[0.0]] * world_size, oracle.side_by_side(f"buffer at {moment}", buffer)
    semantics.number(
        "rank 1's attribute at the end", world.records[1]["attrs"]["fit_end"]["attr"][0], vs=("its buffer", 0.0)
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_buffer_a_rank_updates_outside_forward_is_overwritten_by_rank_0s_at_the_next_forward(
    run_world, semantics, world_size
):
    """DDP broadcasts rank 0's buffers before every training forward (``broadcast_buffers=True``, the default), and
    Lightning runs ``training_step`` inside that forward. A running total kept in a buffer and updated in
    ``training_step`` therefore starts every step at rank 0's total: after each batch rank r holds rank 0's total of
    the steps before plus its own batch, and what the other ranks added is lost at the next step. After 3 steps every
    rank's total starts from rank 0's, not from the sum over all ranks' samples."""
    steps = 3
    world = run_world(contract.contract_fit, world_size, n=4 * world_size, batch_size=2, steps=steps)

    targets = [[sum(contract.line_sample(i)[1] for i in ids) for ids in rec["ids"]] for rec in world.records]
    rank0_total, expected_at, expected_after = 0.0, [[] for _ in targets], [[] for _ in targets]
    for k in range(steps):
        for r in range(world_size):
            expected_at[r].append(rank0_total)
            expected_after[r].append(rank0_total + targets[r][k])
        rank0_total += targets[0][k]
    every_sample = sum(sum(t) for t in targets)
    oracle.assert_distinct(rank_0s_total=rank0_total, every_ranks_samples=every_sample)
    at = [rec["seen_at_step"] for rec in world.records]
    after = [rec["seen_after_step"] for rec in world.records]
    semantics.number("rank 0's total after 3 steps", after[0][-1], vs=("over every rank's samples", every_sample))
    assert at == expected_at, oracle.side_by_side("buffer as training_step starts", at) + f"  expected {expected_at}"
    assert after == expected_after, oracle.side_by_side("buffer after the batch", after)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_that_build_their_dataset_apart_shard_different_datasets(run_world, semantics, world_size):
    """A datamodule's ``setup`` runs on every rank; a ``random_split`` there without a generator draws from each
    rank's own random state (seeded apart here, as fresh processes are), so each rank holds another validation
    subset. ``DistributedSampler`` gives rank r the positions ``r, r + W, ...`` of the subset *it* holds: the
    ranks validate samples of different subsets, some twice and some never, instead of partitioning one set."""
    n, val = 12, 6
    world = run_world(contract.split_apart, world_size, n=n, val=val, batch_size=3)

    subsets = [rec["val_set"] for rec in world.records]
    expected = [[subsets[r][p] for p in oracle.shard(val, world_size, r)] for r in range(world_size)]
    outside = len([i for ids in expected for i in ids if i not in subsets[0]])
    oracle.assert_distinct(apart=outside, one_dataset=0)
    ran = [rec["ids"] for rec in world.records]
    semantics.number("samples validated outside rank 0's subset", outside, vs=("one subset partitioned", 0))
    assert any(s != subsets[0] for s in subsets[1:]), oracle.side_by_side("validation subsets", subsets)
    assert ran == expected, oracle.side_by_side("validated ids", ran) + f"  expected {expected}"


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("loss", ["mean", "sum"])
def test_the_first_step_of_w_ranks_equals_one_process_on_all_their_samples_only_for_a_loss_averaged_over_the_batch(
    run_world, semantics, world_size, loss
):
    """DDP averages the ranks' gradients. With a loss averaged over each rank's batch of b, the average is the
    gradient of one process on the W*b samples; with a loss summed over the batch, it is 1/W of that process's
    (summed) gradient, so the W-rank step is W times smaller than one process's on the same samples."""
    world = run_world(contract.contract_fit, world_size, n=4 * world_size, steps=1, loss=loss)

    w0 = list(contract.INITIAL_WEIGHT)
    all_ids = [i for rec in world.records for i in rec["ids"][0]]
    one_process = _gradient(w0, all_ids, loss)
    expected = one_process if loss == "mean" else [g / world_size for g in one_process]
    summed = [g * world_size for g in expected]
    oracle.assert_distinct(averaged_over_ranks=expected[0], summed_over_ranks=summed[0])
    got = [rec["first_grad"] for rec in world.records]
    semantics.number("first gradient, first weight", got[0][0], vs=("one process on all samples", one_process[0]))
    assert all(_close(g, expected) for g in got), oracle.side_by_side("first gradient", got) + f"  expected {expected}"


def _one_cycle_lrs(total_steps: int, steps: int) -> list:
    """The learning rates torch's own ``OneCycleLR(max_lr=0.1, total_steps=total_steps)`` gives after each of
    ``steps`` steps (the oracle: torch, not Lightning)."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total_steps)
    out = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        out.append(optimizer.param_groups[0]["lr"])
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_trainer_counts_the_ranks_shard_so_a_schedule_sized_by_the_modules_own_loader_stops_part_way(
    run_world, semantics, world_size
):
    """Each rank runs ``ceil(ceil(N / W) / b)`` batches an epoch, and ``trainer.num_training_batches`` and
    ``trainer.estimated_stepping_batches`` count those; a loader the module builds itself
    (``len(self.train_dataloader())``) holds all ``N / b``. A ``OneCycleLR`` sized by that loader plans W times the
    steps the ranks take, so at the end of the epoch its learning rate is part way through the cycle, where one
    process (which runs all ``N / b`` batches) ends at the cycle's last learning rate."""
    n, b = 16, 2
    world = run_world(contract.own_loader_schedule, world_size, n=n, batch_size=b)

    shard = math.ceil(math.ceil(n / world_size) / b)
    planned = math.ceil(n / b)
    expected = _one_cycle_lrs(planned, shard)
    one_process_end = _one_cycle_lrs(planned, planned)[-1]
    oracle.assert_distinct(end_at_w_ranks=expected[-1], end_in_one_process=one_process_end)
    records = world.records
    semantics.number("learning rate at the end", records[0]["lrs"][-1], vs=("one process's", one_process_end))
    counts = [(r["own_loader"], r["num_training_batches"], r["estimated_stepping_batches"]) for r in records]
    assert counts == [(planned, shard, shard)] * world_size, oracle.side_by_side("own, trainer, estimated", counts)
    assert all(_close(r["lrs"], expected, 1e-9) for r in records), oracle.side_by_side(
        "lrs", [r["lrs"] for r in records]
    )


def _lines(path) -> list:
    with open(path, encoding="utf-8") as fh:
        return [int(line) for line in fh.read().splitlines()]


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_writing_one_path_leaves_the_file_with_one_ranks_shard_not_the_whole_set(
    run_world, semantics, world_size, tmp_path
):
    """Lightning runs ``on_test_epoch_end`` on every rank, and each rank holds only its shard's outputs, so code that
    writes them to one path writes it W times: each ``open(path, "w")`` truncates what another rank wrote, and the
    file ends with the last writer's shard, never the whole test set a single process writes. Here every rank writes
    the same number of equal-length lines (``DistributedSampler`` pads the shards to one length), so the file is
    exactly one rank's shard; with shards of different byte lengths the writes can also interleave. Lightning writes
    its own checkpoints and logs on global rank 0 only; a file your code writes is left to your code. Reported
    upstream as https://github.com/Lightning-AI/pytorch-lightning/issues/17521."""
    n, path = 11, str(tmp_path / "test_ids.txt")
    world = run_world(contract.write_test_ids, world_size, path=path, n=n)

    shards = [sorted(oracle.shard(n, world_size, r)) for r in range(world_size)]
    assert [sorted(rec["ids"]) for rec in world.records] == shards, oracle.side_by_side("tested ids", world.records)
    # Every rank wrote the one path, each its whole shard: the file holds one shard because the writes replaced each
    # other, not because one rank alone wrote.
    wrote = [(rec["written"], rec["lines_written"]) for rec in world.records]
    assert wrote == [(path, len(s)) for s in shards], oracle.side_by_side("wrote", wrote)
    oracle.assert_distinct(one_rank=len(shards[0]), one_process=n, gathered=world_size * len(shards[0]))
    in_file = _lines(path)
    semantics.number("lines in the file every rank wrote", len(in_file), vs=("one process", n))
    assert in_file in shards, f"the file holds {in_file}; " + oracle.side_by_side("the ranks' shards", shards)


@pytest.mark.parametrize("world_size", [2, 3])
def test_one_file_per_rank_named_by_global_rank_holds_every_sample_once_plus_the_padding_duplicates(
    run_world, semantics, world_size, tmp_path
):
    """The fix: each rank writes its own file, named by ``global_rank``, and whoever can read them all merges them.
    Together the files hold every sample of the set, plus the samples ``DistributedSampler`` repeated to pad the
    shards to one length (``oracle.duplicates``): merge by sample id to drop them. (For predictions,
    ``BasePredictionWriter`` with one file per rank is Lightning's own recipe; predict does not pad.)"""
    n, path = 11, str(tmp_path / "test_ids.txt")
    world = run_world(contract.write_test_ids, world_size, path=path, n=n, per_rank=True)

    written = [rec["written"] for rec in world.records]
    assert written == [f"{path}.rank{r}" for r in range(world_size)], oracle.side_by_side("paths", written)
    files = [_lines(p) for p in written]
    assert files == [sorted(oracle.shard(n, world_size, r)) for r in range(world_size)], oracle.side_by_side(
        "lines per file", files
    )
    lines = [i for f in files for i in f]
    repeated = sum(oracle.duplicates(n, world_size).values())
    oracle.assert_distinct(with_padding=n + repeated, merged_by_id=n)
    semantics.number("lines over every rank's file", len(lines), vs=("samples", n))
    assert len(lines) == n + repeated, f"{len(lines)} lines, expected {n} samples + {repeated} padding duplicates"
    assert sorted(set(lines)) == list(range(n)), f"merged by id: {sorted(set(lines))}"

"""``self.log`` reductions under DDP: what ``reduce_fx``, ``on_step``, ``sync_dist``, ``sync_dist_group``,
``rank_zero_only`` and the value's type do to the number each rank ends with.

Two reductions happen, in this order. First each rank accumulates its own logged values over the
epoch with ``reduce_fx``: ``"mean"`` keeps a ``batch_size``-weighted sum and an integer count,
``"sum"`` adds the values (batch sizes ignored), ``"max"``/``"min"`` keep the extreme. Then, with
``sync_dist=True``, the accumulated state is all-reduced across the ranks of the process group with
the *same* op (``"mean"``: the all-rank mean of the weighted sums divided by the all-rank mean of the
counts). A step-level value (``on_step=True``) is all-reduced at that step, on its own, with no
batch-size weighting. ``rank_zero_only=True`` switches the all-reduce off; a ``torchmetrics.Metric``
object bypasses all of it and syncs its own state.

A ``Metric`` passed to ``self.log`` belongs to Lightning's result collection, which resets it when the epoch's
results are done (result.py ``_ResultCollection.reset`` -> ``_ResultMetric.reset`` -> ``Metric.reset``); a
metric only ``compute()``-d is the user's to reset (torchmetrics/metric.py ``Metric.compute`` syncs, computes
and restores the local state). The ``reduce_fx`` strings are lower-cased and ``"avg"`` means ``"mean"``
(``_Metadata._parse_reduce_fx``). Without ``batch_size`` Lightning takes the batch size from the batch
(``extract_batch_size``) for the weighted epoch mean. The facts on those three use
ddpprobe/probes/logged_metrics.py.

Every probe here logs, per batch, the batch mean of ``IdDataset``'s ``value`` (``id ** 2``) with an
explicit ``batch_size=``; the expected numbers come from ``tests/support/oracle.py`` (``log_reduce``,
``sync_reduce``), which restate the rule without Lightning. Sources:
pytorch_lightning/trainer/connectors/logger_connector/result.py (``_Metadata._parse_reduce_fx``,
``_Sync``, ``_ResultMetric.update``/``compute``, ``_ResultCollection._get_cache``/``metrics``),
lightning_fabric/utilities/distributed.py ``_sync_ddp``, pytorch_lightning/core/module.py
``LightningModule.log``/``log_dict``.
"""

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import log_spec, logged_metrics, reductions
from tests.support import oracle, upstream

#: Samples and batch size of the reduce_fx facts: with them every competing answer differs for W = 1, 2, 3.
N, BATCH = 19, 4


def _logged_batch_means(n, world_size, batch_size, weights=None):
    """``[rank] -> [(batch mean of value, batch_size passed to self.log), ...]`` for ``ReductionProbe``."""
    per_rank = []
    for r, rank_batches in enumerate(oracle.rank_batches(n, world_size, batch_size)):
        sizes = weights[r] if weights else [len(b) for b in rank_batches]
        per_rank.append([(oracle.mean(oracle.values(b)), s) for b, s in zip(rank_batches, sizes)])
    return per_rank


def _farthest_unsynced(reduce_fx, per_rank_logged, synced):
    """The rank-local (unsynced) value farthest from ``synced``: some rank always holds the global max
    or min itself, so "unsynced" means "what at least one rank would have kept"."""
    return max((oracle.log_reduce(reduce_fx, rank) for rank in per_rank_logged), key=lambda x: abs(x - synced))


def _got(world, key, where="callback_metrics"):
    return [rec[where].get(key) for rec in world.records]


def _messages(record, fragment):
    return [w["message"] for w in record["warnings"] if fragment in w["message"]]


# ---------------------------------------------------------------------------------------------
# reduce_fx at epoch level
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduce_fx", ["mean", "sum", "max", "min"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_reduce_fx_reduces_each_ranks_logged_values_then_the_same_op_reduces_across_ranks(
    run_world, semantics, world_size, reduce_fx
):
    """``self.log("v", batch_mean, reduce_fx=fx, sync_dist=True)`` in ``validation_step``: each rank first
    reduces its own logged values with ``fx`` (``_ResultMetric.update``: ``"mean"`` is weighted by
    ``batch_size``, ``"sum"`` adds the logged values, i.e. the batch *means*, not the samples), then
    ``_ResultMetric.compute`` all-reduces that state with the op named after ``fx`` (``_Metadata.sync``
    sets ``_Sync.op = reduce_fx.__name__``). So every rank gets: the weighted mean over all ranks' samples
    (padding duplicates included), the sum of every batch mean of every rank, or the extreme batch mean
    of all ranks. The data make each of these differ from the single-process value, from the same op
    applied to raw samples, from a rank's unsynced value and (for "sum") from a mean of rank sums."""
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=N,
        batch_size=BATCH,
        plan=[log_spec("v", reduce_fx=reduce_fx, sync_dist=True)],
    )

    assert [rec["seen_ids"] for rec in world.records] == oracle.rank_batches(N, world_size, BATCH)
    logged = _logged_batch_means(N, world_size, BATCH)
    expected = oracle.sync_reduce(reduce_fx, logged)
    samples = oracle.values(oracle.padded_indices(N, world_size))
    competing = {
        "mean": {"mean_of_batch_means": oracle.mean(v for rank in logged for v, _ in rank)},
        "sum": {"sum_of_samples": sum(samples)},
        "max": {"max_of_samples": max(samples)},
        "min": {"min_of_samples": min(samples)},
    }[reduce_fx]
    if world_size > 1:
        competing["a_rank_unsynced"] = _farthest_unsynced(reduce_fx, logged, expected)
        if reduce_fx == "mean":
            competing["single_process"] = oracle.mean(oracle.values(range(N)))
        if reduce_fx == "sum":
            competing["mean_of_rank_sums"] = expected / world_size
    oracle.assert_distinct(lightning=expected, **competing)

    got = _got(world, "v")
    semantics.number(
        f"synced {reduce_fx}", got[0], vs=(next(iter(competing)).replace("_", " "), next(iter(competing.values())))
    )
    assert got == pytest.approx([expected] * world_size, rel=1e-6), (
        oracle.side_by_side("v", got) + f"  expected {expected}; competing {competing}"
    )


def test_an_unsupported_reduce_fx_string_raises_misconfiguration_exception_on_every_rank(run_world, semantics):
    """``reduce_fx`` must be one of "min", "max", "mean", "sum" (any case, "avg" meaning "mean") or the
    matching torch/builtin function; anything else, e.g. "median", makes ``self.log`` raise
    ``MisconfigurationException("Only `self.log(..., reduce_fx={min,max,mean,sum})` are supported. ...")``
    in the first ``validation_step`` of every rank, before any collective, so no rank hangs.
    Source: result.py ``_Metadata._parse_reduce_fx``."""
    world = run_world(
        reductions.validate_plan,
        2,
        n=4,
        batch_size=2,
        plan=[log_spec("v", reduce_fx="median", sync_dist=True)],
        expect_error=True,
    )

    errors = [rec["error"] for rec in world.records]
    semantics.number(
        "ranks raising", sum(bool(e) and e["type"] == "MisconfigurationException" for e in errors), vs=("world size", 2)
    )
    assert [e and e["type"] for e in errors] == ["MisconfigurationException"] * 2, oracle.side_by_side("error", errors)
    for e in errors:
        assert "Only `self.log(..., reduce_fx={min,max,mean,sum})` are supported." in e["message"]
        assert "Found: median" in e["message"]


# ---------------------------------------------------------------------------------------------
# on_step vs on_epoch
# ---------------------------------------------------------------------------------------------

#: ``batch_size=`` each rank passes for its two batches; totals divide by W so the count's mean is exact.
STEP_WEIGHTS = {2: [[1, 3], [3, 1]], 3: [[1, 3], [3, 1], [2, 2]]}


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_step_value_is_the_unweighted_mean_over_ranks_and_the_epoch_value_is_batch_size_weighted(
    run_world, semantics, world_size
):
    """``self.log("v", x, on_step=True, on_epoch=True, sync_dist=True, batch_size=b)`` with ranks passing
    different ``batch_size`` at the same step. The step value (``v_step``, read from
    ``trainer.logged_metrics`` in ``on_validation_batch_end``) is all-reduced right away with the plain
    mean op, ignoring ``batch_size``: the unweighted mean of the ranks' values at that step
    (``_ResultMetric.update``: ``_forward_cache = sync(value)``). The epoch value (``v_epoch``) is the
    ``batch_size``-weighted mean over all ranks' logged values — weighted by the sizes passed, not by the
    samples the batches held (``_ResultMetric.compute``)."""
    n, batch_size, weights = 3 * world_size, 2, STEP_WEIGHTS[world_size]
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        weights=weights,
        plan=[log_spec("v", on_step=True, on_epoch=True, sync_dist=True)],
    )

    logged = _logged_batch_means(n, world_size, batch_size, weights)
    steps = range(len(logged[0]))
    step_unweighted = [oracle.mean(rank[s][0] for rank in logged) for s in steps]
    step_weighted = [oracle.log_reduce("mean", [rank[s] for rank in logged]) for s in steps]
    epoch_weighted = oracle.sync_reduce("mean", logged)
    for s in steps:
        oracle.assert_distinct(step_unweighted=step_unweighted[s], step_weighted=step_weighted[s])
    oracle.assert_distinct(
        epoch_weighted=epoch_weighted,
        epoch_unweighted=oracle.mean(v for rank in logged for v, _ in rank),
        epoch_by_sample_count=oracle.mean(oracle.values(oracle.padded_indices(n, world_size))),
    )
    semantics.number(
        "first v_step",
        world.records[0]["step_logged_metrics"][0].get("v_step"),
        vs=("batch_size-weighted", step_weighted[0]),
    )
    semantics.number(
        "v_epoch", _got(world, "v_epoch")[0], vs=("unweighted", oracle.mean(v for rank in logged for v, _ in rank))
    )

    for rec in world.records:
        got_steps = [step.get("v_step") for step in rec["step_logged_metrics"]]
        assert got_steps == pytest.approx(step_unweighted, rel=1e-6), (
            f"rank {rec['global_rank']}: v_step per step {got_steps}; unweighted mean over ranks {step_unweighted}, "
            f"batch_size-weighted {step_weighted}"
        )
    got = _got(world, "v_epoch")
    assert got == pytest.approx([epoch_weighted] * world_size, rel=1e-6), oracle.side_by_side("v_epoch", got)


@pytest.mark.parametrize("stage", ["validate", "fit"])
def test_on_step_and_on_epoch_fork_the_name_and_only_training_puts_the_step_key_in_callback_metrics(
    run_world, semantics, stage
):
    """With ``on_step=True, on_epoch=True`` the name forks (``_Metadata.forked_name``): ``logged_metrics``
    holds ``v_step`` (the last step's value) and ``v_epoch``, never a bare ``v``. ``callback_metrics``
    holds ``v`` and ``v_epoch`` (both the epoch value) and, only in training, ``v_step`` too: for
    evaluation ``_ResultCollection.metrics`` adds step values to the callback dict only when
    ``self.training``. During a validation batch ``callback_metrics`` therefore holds nothing of ``v``,
    while during a training batch it holds ``v`` and ``v_step`` equal to that step's value. The same
    keys and numbers on every rank."""
    world_size, n, batch_size = 2, 8, 2
    scenario = reductions.validate_plan if stage == "validate" else reductions.fit_plan
    world = run_world(
        scenario,
        world_size,
        n=n,
        batch_size=batch_size,
        plan=[log_spec("v", on_step=True, on_epoch=True, sync_dist=True)],
    )

    # Training shuffles its DistributedSampler, so take the ids each rank saw from its record.
    seen = [rec["seen_ids"] for rec in world.records]
    steps = [oracle.mean(oracle.mean(oracle.values(rank[s])) for rank in seen) for s in range(len(seen[0]))]
    epoch = oracle.mean(oracle.values(i for rank in seen for b in rank for i in b))
    oracle.assert_distinct(last_step=steps[-1], epoch=epoch)
    semantics.number(
        "v_step",
        world.records[0]["logged_metrics"].get("v_step"),
        vs=("v_epoch", world.records[0]["logged_metrics"].get("v_epoch")),
    )

    for rec in world.records:
        where = f"rank {rec['global_rank']} ({stage})"
        assert set(rec["logged_metrics"]) == {"v_step", "v_epoch"}, f"{where}: {rec['logged_metrics']}"
        assert rec["logged_metrics"]["v_step"] == pytest.approx(steps[-1], rel=1e-6), where
        assert rec["logged_metrics"]["v_epoch"] == pytest.approx(epoch, rel=1e-6), where
        expected_callback = {"v": epoch, "v_epoch": epoch}
        if stage == "fit":
            expected_callback["v_step"] = steps[-1]
        got = rec["callback_metrics"]
        assert got == pytest.approx(expected_callback, rel=1e-6), f"{where}: callback_metrics {got}"
        during = rec["step_callback_metrics"]
        if stage == "fit":
            for s, (got_step, expected_step) in enumerate(zip(during, steps)):
                assert got_step == pytest.approx({"v": expected_step, "v_step": expected_step}, rel=1e-6), (
                    f"{where}, step {s}: {got_step}"
                )
            assert len(during) == len(steps), f"{where}: {during}"
        else:
            assert during == [{}] * len(steps), f"{where}: callback_metrics during validation batches {during}"


# ---------------------------------------------------------------------------------------------
# The integer batch-size count (upstream bug)
# ---------------------------------------------------------------------------------------------

#: ``batch_size=`` per rank and batch whose totals do NOT divide by W (W=2: 3+4=7, W=3: 2+2+3=7).
FLOOR_WEIGHTS = {2: [[1, 2], [2, 2]], 3: [[1, 1], [1, 1], [1, 2]]}


@upstream.FLOORED_COUNT_BUG
@pytest.mark.parametrize("world_size", [2, 3])
def test_the_synced_epoch_mean_is_the_batch_size_weighted_mean_even_when_the_count_does_not_divide_by_world_size(
    run_world, semantics, world_size
):
    """The correct ``sync_dist=True`` epoch mean is ``sum(value * batch_size) / sum(batch_size)`` over all
    ranks. Lightning all-reduces both with the mean op, and ``cumulated_batch_size`` is an int64 tensor:
    ``_sync_ddp`` on gloo sums it, then ``result.copy_(result / world_size)`` truncates back into the
    integer tensor (NCCL's AVG on integers also floors). When the ranks' batch-size totals sum to a
    number not divisible by W the denominator is floored and every rank gets
    ``(sum(v*b) / W) / floor(sum(b) / W)``, too large (see
    ``test_the_synced_epoch_mean_divides_by_the_floored_mean_of_the_integer_batch_size_counts``). Source:
    result.py ``_ResultMetric.__init__`` (``torch.tensor(0)``) and ``compute``;
    lightning_fabric/utilities/distributed.py ``_sync_ddp``."""
    n, batch_size, weights = 3 * world_size, 2, FLOOR_WEIGHTS[world_size]
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        weights=weights,
        plan=[log_spec("v", sync_dist=True)],
    )

    logged = _logged_batch_means(n, world_size, batch_size, weights)
    correct = oracle.sync_reduce("mean", logged)
    floored = oracle.floored_sync_mean(logged)
    oracle.assert_distinct(correct=correct, floored_count=floored)
    got = _got(world, "v")
    semantics.number("synced mean", got[0], vs=("correct weighted mean", correct))
    assert got == pytest.approx([correct] * world_size, rel=1e-6), (
        oracle.side_by_side("v", got) + f"  correct weighted mean {correct}, with floored count {floored}"
    )


@upstream.FLOORED_COUNT_TODAY
@pytest.mark.parametrize("world_size", [2, 3])
def test_the_synced_epoch_mean_divides_by_the_floored_mean_of_the_integer_batch_size_counts(
    run_world, semantics, world_size
):
    """What Lightning gives today for the same log: the ranks pass ``batch_size=`` totals that add up to
    7, which W = 2 and W = 3 do not divide, and every rank gets ``(sum(v*b) / W) / floor(sum(b) / W)``,
    the weighted sums' mean over the floored mean of the int64 counts: 15.67 instead of 13.43 at W = 2,
    40.08 instead of 34.36 at W = 3. Upstream issue
    https://github.com/Lightning-AI/pytorch-lightning/issues/21859. Source: result.py
    ``_ResultMetric.compute``; lightning_fabric/utilities/distributed.py ``_sync_ddp``."""
    n, batch_size, weights = 3 * world_size, 2, FLOOR_WEIGHTS[world_size]
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        weights=weights,
        plan=[log_spec("v", sync_dist=True)],
    )

    reported = [rec["reported_batch_sizes"] for rec in world.records]
    assert reported == weights, oracle.side_by_side("batch_size=", reported) + f"  expected {weights}"
    assert sum(map(sum, weights)) % world_size != 0, "the counts' total must not divide by W for the floor to bite"
    logged = _logged_batch_means(n, world_size, batch_size, weights)
    floored = oracle.floored_sync_mean(logged)
    correct = oracle.sync_reduce("mean", logged)
    mean_of_rank_means = oracle.mean(oracle.log_reduce("mean", rank) for rank in logged)
    oracle.assert_distinct(floored_count=floored, correct=correct, mean_of_rank_means=mean_of_rank_means)
    got = _got(world, "v")
    semantics.number("synced mean", got[0], vs=("correct weighted mean", correct))
    assert got == pytest.approx([floored] * world_size, rel=1e-6), (
        oracle.side_by_side("v", got) + f"  expected (floored count) {floored}; correct weighted mean {correct}; "
        f"mean of rank means {mean_of_rank_means}"
    )


# ---------------------------------------------------------------------------------------------
# rank_zero_only and sync_dist_group
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_rank_zero_only_switches_sync_dist_off_so_each_rank_keeps_its_own_value(run_world, semantics, world_size):
    """``self.log("v", x, sync_dist=True, rank_zero_only=True)`` called on every rank: ``_Sync`` uses its
    no-op function whenever ``rank_zero_only`` is set (``_Sync._generate_sync_fn``), so no collective
    runs, nothing hangs, and each rank keeps its own weighted mean. No "sync_dist=True" hint is emitted
    either (the hint looks at ``sync_dist``, which is True)."""
    n, batch_size = 7, 2
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        plan=[log_spec("v", sync_dist=True, rank_zero_only=True)],
    )

    logged = _logged_batch_means(n, world_size, batch_size)
    local = [oracle.log_reduce("mean", rank) for rank in logged]
    oracle.assert_distinct(synced=oracle.sync_reduce("mean", logged), **{f"rank{r}": v for r, v in enumerate(local)})
    got = _got(world, "v")
    semantics.number("rank 1's v", got[1], vs=("synced", oracle.sync_reduce("mean", logged)))
    assert got == pytest.approx(local, rel=1e-6), oracle.side_by_side("v", got) + f"  expected own values {local}"
    hints = [_messages(rec, "sync_dist=True") for rec in world.records]
    assert hints == [[]] * world_size, oracle.side_by_side("sync_dist hints", hints)


def test_a_value_logged_with_rank_zero_only_from_rank_0_alone_exists_on_rank_0_only(run_world, semantics):
    """The documented use of ``rank_zero_only=True``: only rank 0 calls ``self.log`` (here with
    ``sync_dist=True`` as well). Rank 0 gets its own weighted mean, the other ranks have no such key,
    and nothing waits for a collective the other ranks never join."""
    world_size, n, batch_size = 2, 7, 2
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        plan=[log_spec("v", ranks=[0], sync_dist=True, rank_zero_only=True)],
    )

    logged = _logged_batch_means(n, world_size, batch_size)
    rank0 = oracle.log_reduce("mean", logged[0])
    oracle.assert_distinct(rank0=rank0, synced=oracle.sync_reduce("mean", logged))
    got = _got(world, "v")
    semantics.number("rank 0's v", got[0], vs=("synced", oracle.sync_reduce("mean", logged)))
    assert got[0] == pytest.approx(rank0, rel=1e-6) and got[1:] == [None], oracle.side_by_side("v", got)


@pytest.mark.parametrize("world_size, members", [(3, [0, 1]), (4, [1, 3])])
def test_sync_dist_group_averages_over_the_groups_ranks_only(run_world, semantics, world_size, members):
    """``self.log("v", x, sync_dist=True, sync_dist_group=group)`` with ``group =
    torch.distributed.new_group(members)`` (created in ``setup`` on every rank, as ``new_group`` requires)
    and logged by the members only; the other ranks log ``v`` without ``sync_dist``. The all-reduce runs
    over the group (``_sync_ddp(group=...)`` divides by the group's size), so the members get the
    weighted mean over the members' samples — not over all ranks — and the others keep their own."""
    n, batch_size = 2 * world_size + 1, 2
    others = [r for r in range(world_size) if r not in members]
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        subgroup_ranks=members,
        plan=[log_spec("v", ranks=members, sync_dist=True, subgroup=True), log_spec("v", ranks=others)],
    )

    logged = _logged_batch_means(n, world_size, batch_size)
    group_mean = oracle.sync_reduce("mean", [logged[r] for r in members])
    local = [oracle.log_reduce("mean", rank) for rank in logged]
    oracle.assert_distinct(
        group_mean=group_mean,
        world_mean=oracle.sync_reduce("mean", logged),
        **{f"rank{r}": local[r] for r in range(world_size)},
    )
    expected = [group_mean if r in members else local[r] for r in range(world_size)]
    got = _got(world, "v")
    semantics.number(
        f"rank {members[0]}'s v", got[members[0]], vs=("mean over all ranks", oracle.sync_reduce("mean", logged))
    )
    assert got == pytest.approx(expected, rel=1e-6), oracle.side_by_side("v", got) + f"  expected {expected}"


@pytest.mark.parametrize("reduce_fx", ["sum", "mean"])
def test_a_rank_outside_sync_dist_group_that_passes_the_group_keeps_its_sum_but_its_mean_raises(
    run_world, semantics, reduce_fx
):
    """W=3, group = ``new_group([0, 1])``, and rank 2 (not a member) also logs with
    ``sync_dist_group=group``. For ``reduce_fx="sum"`` (and max/min) torch's ``barrier``/``all_reduce``
    on a group the rank is not in return at once with the warning "Running all_reduce on global rank 2
    which does not belong to the given group.", so rank 2 keeps its own sum. For ``"mean"``
    ``_sync_ddp`` first asks ``torch.distributed.get_backend(group)`` (to emulate AVG on gloo), which
    raises ``ValueError("Invalid process group specified")`` on rank 2. Ranks 0 and 1 get the group's
    result either way."""
    world_size, n, batch_size, members = 3, 7, 2, [0, 1]
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        subgroup_ranks=members,
        plan=[log_spec("v", reduce_fx=reduce_fx, sync_dist=True, subgroup=True)],
        expect_error=True,
    )

    logged = _logged_batch_means(n, world_size, batch_size)
    group_value = oracle.sync_reduce(reduce_fx, [logged[r] for r in members])
    rank2 = oracle.log_reduce(reduce_fx, logged[2])
    oracle.assert_distinct(group=group_value, rank2_own=rank2, world=oracle.sync_reduce(reduce_fx, logged))
    errors = [rec["error"] for rec in world.records]
    got = _got(world, "v")
    semantics.number("rank 2's v", got[2], vs=("the group's", group_value))
    assert got[:2] == pytest.approx([group_value] * 2, rel=1e-6), oracle.side_by_side("v", got)
    assert errors[:2] == [None, None], oracle.side_by_side("error", errors)
    if reduce_fx == "sum":
        assert errors[2] is None and got[2] == pytest.approx(rank2, rel=1e-6), oracle.side_by_side("v", got)
        not_member = "Running all_reduce on global rank 2 which does not belong to the given group"
        assert _messages(world.records[2], not_member), world.records[2]["warnings"]
    else:
        assert errors[2] == {"type": "ValueError", "message": "Invalid process group specified"}, errors[2]


# ---------------------------------------------------------------------------------------------
# log_dict, Python numbers and integer tensors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduce_fx", ["mean", "max"])
def test_log_dict_with_sync_dist_gives_what_self_log_gives_for_each_key(run_world, semantics, reduce_fx):
    """``self.log_dict({"d": x}, sync_dist=True, reduce_fx=fx)`` is a loop of ``self.log(key, value, ...)``
    with the same options (``LightningModule.log_dict``): ``d`` and a ``self.log("s", x, ...)`` twin end
    with the same synced number, the one the reduce_fx rule predicts."""
    world_size, n, batch_size = 2, 7, 2
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        plan=[
            log_spec("s", sync_dist=True, reduce_fx=reduce_fx),
            log_spec("d", via="log_dict", sync_dist=True, reduce_fx=reduce_fx),
        ],
    )

    logged = _logged_batch_means(n, world_size, batch_size)
    expected = oracle.sync_reduce(reduce_fx, logged)
    oracle.assert_distinct(synced=expected, a_rank_unsynced=_farthest_unsynced(reduce_fx, logged, expected))
    semantics.number("log_dict value", _got(world, "d")[0], vs=("self.log value", _got(world, "s")[0]))
    for key in ("s", "d"):
        got = _got(world, key)
        assert got == pytest.approx([expected] * world_size, rel=1e-6), oracle.side_by_side(key, got)


def test_python_floats_and_ints_are_synced_as_float32_and_only_an_integer_tensor_gets_the_cast_warning(
    run_world, semantics
):
    """``self.log`` turns a Python ``float`` or ``int`` into a float32 tensor itself
    (``LightningModule.__to_tensor`` uses the default float dtype), so both sync like tensors and emit
    no warning. An int64 *tensor* is cast in ``_ResultMetric.update`` with the warning "You called
    `self.log('t', ...)` in your `validation_step` but the value needs to be floating to be reduced.
    Converting it to torch.float32." — on rank 0 only (``WarningCache.warn`` is rank-zero). Values here:
    the batch mean of ``value`` as a float, the sum of the batch's ids as an int and as an int tensor."""
    world_size, n, batch_size = 2, 7, 2
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        plan=[
            log_spec("f", "python_float", sync_dist=True),
            log_spec("i", "python_int", sync_dist=True),
            log_spec("t", "int_tensor", sync_dist=True),
        ],
    )

    rank_batches = oracle.rank_batches(n, world_size, batch_size)
    float_expected = oracle.sync_reduce("mean", _logged_batch_means(n, world_size, batch_size))
    id_sums = [[(sum(b), len(b)) for b in rank] for rank in rank_batches]
    int_expected = oracle.sync_reduce("mean", id_sums)
    oracle.assert_distinct(int_synced=int_expected, a_rank_unsynced=_farthest_unsynced("mean", id_sums, int_expected))
    for key, expected in (("f", float_expected), ("i", int_expected), ("t", int_expected)):
        got = _got(world, key)
        assert got == pytest.approx([expected] * world_size, rel=1e-6), oracle.side_by_side(key, got)

    cast = "but the value needs to be floating to be reduced. Converting it to torch.float32."
    per_key = {
        key: [
            len(_messages(rec, f"`self.log('{key}', ...)` in your `validation_step` {cast}")) for rec in world.records
        ]
        for key in ("f", "i", "t")
    }
    semantics.number(
        "cast warnings for the int tensor",
        sum(per_key["t"]),
        vs=("for Python numbers", sum(per_key["f"]) + sum(per_key["i"])),
    )
    assert per_key == {"f": [0, 0], "i": [0, 0], "t": [1, 0]}, per_key


# ---------------------------------------------------------------------------------------------
# torchmetrics objects
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sync_dist, reduce_fx", [(False, "mean"), (True, "mean"), (True, "sum"), (False, "max")])
def test_a_logged_metric_object_syncs_its_own_state_and_ignores_sync_dist_and_reduce_fx(
    run_world, semantics, sync_dist, reduce_fx
):
    """``self.log("mean", self.mean_metric, sync_dist=..., reduce_fx=...)`` with a ``torchmetrics.MeanMetric``
    (and likewise a ``SumMetric``) updated with every batch's values: ``_ResultMetric`` stores the object
    and at epoch end returns ``metric.compute()``, which all-reduces the metric's states (torchmetrics
    ``Metric.sync``); ``_Sync`` and ``reduce_fx`` are never applied to it (``_ResultMetric.compute``), and
    ``_get_cache`` warns about ``sync_dist`` only for tensors. So every rank gets the mean (sum) over the
    padded set — the padding duplicates of ``DistributedSampler`` counted — whatever the options say."""
    world_size, n, batch_size = 3, 7, 2
    options = dict(sync_dist=sync_dist, reduce_fx=reduce_fx)
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        plan=[
            log_spec("mean", "mean_metric", **options),
            log_spec("sum", "sum_metric", **options),
        ],
    )

    padded = oracle.values(oracle.padded_indices(n, world_size))
    unique = oracle.values(range(n))
    rank_values = [oracle.values(oracle.shard(n, world_size, r)) for r in range(world_size)]
    oracle.assert_distinct(
        padded_mean=oracle.mean(padded),
        dataset_mean=oracle.mean(unique),
        **{f"rank{r}_mean": oracle.mean(v) for r, v in enumerate(rank_values)},
    )
    oracle.assert_distinct(
        padded_sum=sum(padded),
        dataset_sum=sum(unique),
        mean_of_rank_sums=sum(padded) / world_size,
        **{f"rank{r}_sum": sum(v) for r, v in enumerate(rank_values)},
    )
    semantics.number("logged MeanMetric", _got(world, "mean")[0], vs=("dataset mean", oracle.mean(unique)))
    for key, expected in (("mean", oracle.mean(padded)), ("sum", sum(padded))):
        got = _got(world, key)
        assert got == pytest.approx([expected] * world_size, rel=1e-6), (
            oracle.side_by_side(key, got) + f"  expected over the padded set {expected}"
        )
    hints = [_messages(rec, "sync_dist=True") for rec in world.records]
    assert hints == [[]] * world_size, oracle.side_by_side("sync_dist hints", hints)


def test_logging_metric_compute_as_a_tensor_warns_to_use_sync_dist_although_the_value_is_already_global(
    run_world, semantics
):
    """``self.log("computed", self.metric.compute())`` in ``on_validation_epoch_end`` logs a plain tensor:
    ``compute()`` has already all-reduced the metric's state, so every rank holds the mean over the
    padded set, yet Lightning cannot know that and rank 0 gets the hint "It is recommended to use
    `self.log('computed', ..., sync_dist=True)` when logging on epoch level in distributed setting to
    accumulate the metric across devices." (``_ResultCollection._get_cache``). Here the hint is harmless:
    adding ``sync_dist=True`` would only average equal numbers."""
    world_size, n, batch_size = 2, 7, 2
    world = run_world(
        reductions.validate_plan,
        world_size,
        n=n,
        batch_size=batch_size,
        plan=[log_spec("computed", "metric_compute", hook="epoch_end")],
    )

    padded_mean = oracle.mean(oracle.values(oracle.padded_indices(n, world_size)))
    oracle.assert_distinct(
        padded_mean=padded_mean,
        rank0_mean=oracle.mean(oracle.values(oracle.shard(n, 2, 0))),
        rank1_mean=oracle.mean(oracle.values(oracle.shard(n, 2, 1))),
    )
    got = _got(world, "computed")
    semantics.number(
        "rank 1's computed", got[1], vs=("rank 1's own mean", oracle.mean(oracle.values(oracle.shard(n, 2, 1))))
    )
    assert got == pytest.approx([padded_mean] * world_size, rel=1e-6), oracle.side_by_side("computed", got)
    hint = "It is recommended to use `self.log('computed', ..., sync_dist=True)` when logging on epoch level"
    counts = [len(_messages(rec, hint)) for rec in world.records]
    assert counts == [1, 0], oracle.side_by_side("sync_dist hints", counts)


@pytest.mark.mirrors("tests_pytorch/core/test_metric_result_integration.py::test_result_reduce_ddp", row=9)
def test_a_logged_metric_is_reset_at_each_epoch_end_while_an_unlogged_one_keeps_growing(run_world, semantics):
    """Two ``SumMetric`` objects fed the same validation values over two epochs of ``fit`` at W=2: the one
    passed to ``self.log`` starts each epoch from its default (local state 0) and logs the padded set's
    sum every epoch (30 for N=5); the one only ``compute()``-d in ``on_validation_epoch_end`` keeps its
    local state (rank 0 holds 20, rank 1 10 at the start of epoch 1), so its synced ``compute()`` is 30
    then 60. Mirrors Lightning's tests_pytorch/core/test_metric_result_integration.py::test_result_reduce_ddp
    (``result.reset()`` then ``metric.x == metric._defaults["x"]``; 2 GPUs); the unlogged case is
    torchmetrics' design, not in Lightning's tests. Source: result.py ``_ResultCollection.reset``;
    torchmetrics/metric.py ``Metric.compute``."""
    n, val_n, batch_size, epochs, world_size = 4, 5, 2, 2, 2
    world = run_world(
        logged_metrics.fit_metric_reset, world_size, n=n, val_n=val_n, batch_size=batch_size, epochs=epochs
    )

    epoch_sum = sum(oracle.values(oracle.padded_indices(val_n, world_size)))
    local = [sum(oracle.values(oracle.shard(val_n, world_size, r))) for r in range(world_size)]
    oracle.assert_distinct(fresh=epoch_sum, cumulative=2 * epoch_sum)
    got = [[rec["epochs"][str(e)] for e in range(epochs)] for rec in world.records]
    logged = [[e["logged_value"] for e in rank] for rank in got]
    assert logged == [[epoch_sum] * epochs] * world_size, oracle.side_by_side("logged_sum per epoch", logged)
    logged_state = [[e["logged_state"] for e in rank] for rank in got]
    assert logged_state == [[0.0] * epochs] * world_size, oracle.side_by_side("logged metric's state", logged_state)
    unlogged = [[e["unlogged_compute"] for e in rank] for rank in got]
    expected = [epoch_sum * (e + 1) for e in range(epochs)]
    assert unlogged == [expected] * world_size, oracle.side_by_side("unlogged compute() per epoch", unlogged)
    kept = [rank[1]["unlogged_state"] for rank in got]
    assert kept == local, oracle.side_by_side("unlogged state at epoch 1's start", kept) + f"  expected {local}"
    semantics.number("unlogged compute() in epoch 1", unlogged[0][1], vs=("logged value", logged[0][1]))


@run_if(min_gpus=2, backend="nccl")
@pytest.mark.mirrors("tests_pytorch/core/test_metric_result_integration.py::test_result_reduce_ddp", row=9)
def test_a_logged_metric_is_reset_at_each_epoch_end_on_two_gpus(run_world, semantics):
    """test_log_reductions.py::test_a_logged_metric_is_reset_at_each_epoch_end_while_an_unlogged_one_keeps_growing
    over NCCL. Mirrors tests_pytorch/core/test_metric_result_integration.py::test_result_reduce_ddp."""
    test_a_logged_metric_is_reset_at_each_epoch_end_while_an_unlogged_one_keeps_growing(run_world, semantics)


#: The ``reduce_fx`` strings logged, and the reduction each names.
REDUCE_FXS = {"max": max, "min": min, "sum": sum, "mean": oracle.mean, "SUM": sum, "AVG": oracle.mean, "Max": max}


@pytest.mark.mirrors(
    "tests_pytorch/trainer/logging_/test_train_loop_logging.py::test_logging_sync_dist_true",
    "tests_pytorch/trainer/logging_/test_train_loop_logging.py::test_logging_sync_dist_true_ddp",
    row=(1, 5),
)
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_step_level_synced_value_is_reduced_across_ranks_with_reduce_fx_and_its_case_insensitive_aliases(
    run_world, semantics, world_size
):
    """Rank r logs ``(r+1)**2 + 0.5`` with ``on_step=True, on_epoch=False, sync_dist=True`` and each
    ``reduce_fx`` of ``max``, ``min``, ``sum``, ``mean``, ``"SUM"``, ``"AVG"``, ``"Max"``: every rank
    gets the cross-rank max, min, sum or mean at that step (at W=3: 9.5, 1.5, 15.5, 5.17), the upper-case
    strings the same as the lower-case ones and ``"AVG"`` as ``"mean"``. Mirrors Lightning's
    tests_pytorch/trainer/logging_/test_train_loop_logging.py::test_logging_sync_dist_true (``foo_5``,
    max) and ::test_logging_sync_dist_true_ddp (``"SUM"``, ``"AVG"``; 2 GPUs). Source: result.py
    ``_Metadata._parse_reduce_fx``, ``_ResultMetric.update`` (``self.meta.sync`` at step level)."""
    world = run_world(logged_metrics.fit_step_reductions, world_size, reduce_fxs=list(REDUCE_FXS))

    values = [logged_metrics.step_value(r) for r in range(world_size)]
    expected = {f"v_{fx}": reduce(values) for fx, reduce in REDUCE_FXS.items()}
    oracle.assert_distinct(max=max(values), min=min(values), sum=sum(values), mean=oracle.mean(values))
    assert len(set(values)) == world_size, (
        "ranks must log different values, so an unsynced value differs from max or min"
    )
    for rec in world.records:
        got = {k: rec["callback_metrics"][k] for k in expected}
        assert got == pytest.approx(expected), (
            oracle.side_by_side("step values", [r["callback_metrics"] for r in world.records])
            + f"  expected {expected}"
        )
    semantics.number(
        "step-level max across ranks", world.records[0]["callback_metrics"]["v_max"], vs=("rank 0's", values[0])
    )


@run_if(min_gpus=2, backend="nccl")
@pytest.mark.mirrors("tests_pytorch/trainer/logging_/test_train_loop_logging.py::test_logging_sync_dist_true_ddp")
def test_step_level_reduce_fx_and_its_aliases_reduce_across_two_gpus(run_world, semantics):
    """test_log_reductions.py::test_a_step_level_synced_value_is_reduced_across_ranks_with_reduce_fx_and_its_case_insensitive_aliases
    at W=2 over NCCL. Mirrors tests_pytorch/trainer/logging_/test_train_loop_logging.py::
    test_logging_sync_dist_true_ddp."""
    test_a_step_level_synced_value_is_reduced_across_ranks_with_reduce_fx_and_its_case_insensitive_aliases(
        run_world, semantics, 2
    )


@pytest.mark.mirrors(
    "tests_pytorch/trainer/logging_/test_logger_connector.py::test_result_collection_batch_size_extraction",
    "tests_pytorch/trainer/logging_/test_logger_connector.py::test_result_collection_on_tensor_with_mean_reduction",
)
def test_without_batch_size_the_epoch_mean_is_weighted_by_the_batch_size_inferred_from_the_batch(run_world, semantics):
    """Validation batches of 2 and 1 samples (N=5, W=2, batch size 2), each batch's mean logged with
    ``sync_dist=True``: without ``batch_size`` the synced epoch value is the same as with
    ``batch_size=len(batch)``, the mean over the padded set (5.0), because Lightning reads the size of the
    batch's first tensor; ``batch_size=1`` gives the unweighted mean of batch means (5.75). Mirrors
    Lightning's tests_pytorch/trainer/logging_/test_logger_connector.py::
    test_result_collection_batch_size_extraction and ::test_result_collection_on_tensor_with_mean_reduction
    (one process). Source: pytorch_lightning/utilities/data.py ``extract_batch_size``; result.py
    ``_ResultCollection.log`` (``batch_size``) and ``_ResultMetric.update``."""
    n, batch_size, world_size = 5, 2, 2
    world = run_world(logged_metrics.validate_inference, world_size, n=n, batch_size=batch_size)

    batches = oracle.rank_batches(n, world_size, batch_size)
    per_rank = [[(oracle.mean(oracle.values(b)), len(b)) for b in rank] for rank in batches]
    weighted = oracle.sync_reduce("mean", per_rank)
    unweighted = oracle.sync_reduce("mean", [[(v, 1) for v, _ in rank] for rank in per_rank])
    oracle.assert_distinct(weighted=weighted, unweighted=unweighted)
    got = [{k: rec["callback_metrics"][k] for k in ("inferred", "explicit", "unweighted")} for rec in world.records]
    want = {"inferred": weighted, "explicit": weighted, "unweighted": unweighted}
    assert got == [pytest.approx(want)] * world_size, (
        oracle.side_by_side("synced epoch values", got) + f"  expected {want}"
    )
    semantics.number("synced mean without batch_size", got[0]["inferred"], vs=("unweighted", unweighted))

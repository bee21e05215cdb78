"""DDP's gradient all-reduces, made from C++ by its reducer, are in the trace: one ``collective`` event
per bucket per training batch per rank, through a communication hook that leaves the values unchanged.

``TwoLayers`` (tests/tooling/trace/gradient_modules.py) runs with a bucket cap small enough for DDP to use
several buckets. The oracle for the counts is a user's own comm hook that counts its calls per batch in a
run without the trace (torch calls a registered hook once per bucket: torch/nn/parallel/distributed.py
``register_comm_hook``); the oracle for the values is the same run with no hook, no trace and no guard
(DDP's C++ reduction). Source: ddpprobe/trace/_gradients.py.

The count of buckets per batch is the trace's grouping of its events (ddpprobe/trace/_read.py ``split_trace``: a
gradient bucket belongs to the training batch running when it was written): the ranks' events and the counting
hook's calls are read from their recordings (tests/tooling/trace/recorded_traces.py) and grouped here. That the
weights stay bit for bit those of DDP is a claim about live ranks: those tests run in the integration run.
"""

import math

import pytest

from ddpprobe.trace import split_trace
from tests.tooling.trace import gradient_modules


def _by_batch(pairs) -> dict:
    out: dict = {}
    for batch_idx, bucket in pairs:
        out.setdefault(str(batch_idx), []).append(bucket)
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_trace_has_one_gradient_all_reduce_per_bucket_per_batch_on_every_rank(traced_world, world_size):
    """Each rank's trace holds, for every training batch, one ``all_reduce`` of ``source`` ``"gradient"``
    per bucket, in the order the reducer ran them: the same ``{batch: [bucket, ...]}`` a counting comm
    hook of the user's records in a run without the trace; and more than one bucket per batch after the
    first (DDP rebuilds its buckets after the first iteration), so a per-bucket count can be told from a
    per-batch one."""
    n = 6 * world_size
    counted = traced_world(gradient_modules.fit, world_size, hook="counting", n=n)
    traced = traced_world(gradient_modules.fit, world_size, under="trace", n=n, events=True)
    for rank in range(world_size):
        expected = counted[rank]["hook_calls"]
        assert any(len(buckets) > 1 for buckets in expected.values()), expected
        split = split_trace(traced[rank]["events"])
        assert not [c for c in split["collectives"] if c["source"] == "gradient"], "gradients among collectives"
        got = _by_batch([c["batch"][1], c["bucket"]] for c in split["gradient_collectives"])
        assert got == expected, f"rank {rank} buckets per batch: trace {got}  counting hook {expected}"


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_the_trace_and_the_guard_leave_ddps_gradients_unchanged(run_world, world_size):
    """The weights after an epoch under the trace and under the guard (each registering its comm hook
    around DDP's own reduction) equal, bit for bit, those of DDP without any hook; and a hook that does
    change the reduction (the sum instead of the mean) gives other weights, so the comparison can fail."""
    n = 6 * world_size
    plain = run_world(gradient_modules.fit, world_size, n=n).records
    summed = run_world(gradient_modules.fit, world_size, hook="summing", n=n).records
    for under in ("trace", "guard"):
        seen = run_world(gradient_modules.fit, world_size, under=under, n=n).records
        for rank in range(world_size):
            weights = seen[rank]["weights"]
            assert all(math.isfinite(w) for w in weights), weights
            assert weights == plain[rank]["weights"], f"rank {rank} under {under}: {weights} {plain[rank]['weights']}"
    assert summed[0]["weights"] != plain[0]["weights"], "the data cannot tell a changed reduction apart"


@pytest.mark.integration
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_users_own_comm_hook_keeps_working_under_the_trace_and_the_guard(run_world, world_size):
    """A user's hook registered in ``on_fit_start`` (``summing_hook``: the sum, not the mean) is registered
    wrapped: under the trace and under the guard the weights equal those of the same hook without either
    (and differ from DDP's default, so the hook did run), and the trace names the user's hook."""
    n = 6 * world_size
    alone = run_world(gradient_modules.fit, world_size, hook="summing", n=n).records
    plain = run_world(gradient_modules.fit, world_size, n=n).records
    assert alone[0]["weights"] != plain[0]["weights"], "the user's hook does not change the weights"
    for under in ("trace", "guard"):
        seen = run_world(gradient_modules.fit, world_size, under=under, hook="summing", n=n).records
        for rank in range(world_size):
            assert seen[rank]["weights"] == alone[rank]["weights"], f"rank {rank} under {under}"
    counted = run_world(gradient_modules.fit, world_size, under="trace", hook="counting", n=n).records
    for rank in range(world_size):
        assert _by_batch(counted[rank]["gradients"]) == counted[rank]["hook_calls"], f"rank {rank}"
        assert set(counted[rank]["comm_hooks"]) == {"counting_hook"}, counted[rank]["comm_hooks"]

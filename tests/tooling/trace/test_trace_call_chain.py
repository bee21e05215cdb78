"""The trace names the call chain of every collective: the user's line, the public library call made
from it, and, for a collective Lightning makes on its own, the loop step that made it.

One ``trainer.fit`` epoch of ``CallsModule`` (tests/tooling/trace/call_modules.py) makes, on every rank,
a collective through each kind of public call: a property (``trainer.callback_metrics``), a metric
method (``MeanMetric.compute``), strategy methods (``reduce``, ``barrier``, ``broadcast``), a ``Trainer``
method (``save_checkpoint``), ``LightningModule.all_gather``, a logging call (``self.log(...,
sync_dist=True)`` at the step) and ``torch.distributed.all_reduce`` itself; Lightning then syncs the
epoch value of ``train_v`` on its own. The expected names are the public names a reader finds in the
libraries' documentation, written out here, not read from a run. Source: ddpprobe/trace/_classify.py
``CallClassifier.chain``, ddpprobe/trace/_words.py ``describe_call``.

The ranks' trace events are read from their recording (tests/tooling/trace/recorded_traces.py) and grouped
(``split_trace``) and worded here; W=2 of the first test runs its world live: the trace's one live world in the
default run, where the patch, the classifier and the recorder work in real ranks (a ``fit`` that also writes logs,
batches and DDP's gradient buckets).
"""

import pytest

from ddpprobe._lightning import pl
from ddpprobe.trace import describe_call, split_trace
from tests.tooling.trace import call_modules
from tests.tooling.trace.call_modules import line_of

#: call -> (the public name, its kind, the source the trace gives, what it runs, as ``describe_call`` says).
EXPECTED = {
    "property": ("Trainer.callback_metrics", "property", "self.log", "the epoch sync of 'train_v' (barrier)"),
    "metric": ("MeanMetric.compute", "method", "torchmetrics", None),
    "strategy_reduce": ("DDPStrategy.reduce", "method", "user", "a barrier"),
    "strategy_barrier": ("DDPStrategy.barrier", "method", "user", "a barrier"),
    "strategy_broadcast": ("DDPStrategy.broadcast", "method", "user", "a broadcast_object_list"),
    "trainer": ("Trainer.save_checkpoint", "method", "user", "a barrier"),
    "all_gather": ("LightningModule.all_gather", "method", "user", "an all_gather"),
    "direct": ("torch.distributed.all_reduce", "function", "user", None),
    "log": ("LightningModule.log", "method", "self.log", "the step sync of 'step_v' (barrier)"),
}


def _sentence(call: str) -> str:
    name, kind, _, runs = EXPECTED[call]
    file_line, _, function = line_of(call).partition(" in ")
    file, _, line = file_line.partition(":")
    site = f"line {line} of {file} ({function})"
    if call == "direct":
        return f"{site} calls `{name}()`"
    if call == "metric":
        return None  # what a metric's sync runs first depends on torchmetrics' release; checked by name below
    verb, written = ("reads", name) if kind == "property" else ("calls", f"{name}()")
    return f"{site} {verb} `{written}`, which runs {runs}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_collective_names_the_public_call_the_users_line_made(traced_world, world_size):
    """Each call's first collective on every rank carries the user's line (``call_site``), the public
    name of the call made there (``call``: ``Trainer.callback_metrics``, ``MeanMetric.compute``,
    ``DDPStrategy.reduce`` ...), its kind (a property is read, a method called) and no loop step; and
    ``describe_call`` words it as "line N of call_modules.py (hook) reads/calls `X`, which runs ..."."""
    ranks = traced_world(call_modules.traced, world_size, live=world_size == 2, calls=list(EXPECTED), n=4 * world_size)
    records = [split_trace(rank["events"]) for rank in ranks]
    for rank, record in enumerate(records):
        for call, (name, kind, source, _) in EXPECTED.items():
            at_line = [c for c in record["collectives"] if c["call_site"] == line_of(call)]
            assert at_line, f"rank {rank}: no collective at {line_of(call)} ({call})"
            first = at_line[0]
            got = (first["call"], first["call_kind"], first["source"], first["loop_step"])
            assert got == (name, kind, source, None), f"rank {rank} {call}: {got}"
            if _sentence(call) is not None:
                assert describe_call(first) == _sentence(call), f"rank {rank} {call}"
        metric = next(c for c in record["collectives"] if c["call_site"] == line_of("metric"))
        assert describe_call(metric).startswith(
            f"line {line_of('metric').split(':')[1].split(' ')[0]} of call_modules.py (on_train_epoch_end) "
            "calls `MeanMetric.compute()`, which runs MeanMetric's state sync ("
        ), describe_call(metric)


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_sync_lightning_makes_on_its_own_names_its_loop_step_not_a_users_call(traced_world, world_size):
    """Without a read, the epoch value of ``train_v`` is synced by Lightning at the fit loop's epoch end:
    its collectives have no ``call`` and a ``loop_step`` that is a method of one of Lightning's loop
    classes (pytorch_lightning/loops/), keep the line that logged the key as ``call_site``, and
    ``describe_call`` says Lightning's loop step runs the epoch sync, for the value logged there."""
    records = [
        split_trace(rank["events"])
        for rank in traced_world(call_modules.traced, world_size, calls=[], n=4 * world_size)
    ]
    logged_at = call_modules.log_line("train_v")
    for rank, record in enumerate(records):
        syncs = [c for c in record["collectives"] if c.get("key") == "train_v"]
        assert syncs and all(c["call"] is None and c["loop_step"] for c in syncs), f"rank {rank}: {syncs}"
        loop_class, _, method = syncs[0]["loop_step"].partition(".")
        assert callable(getattr(getattr(pl.loops, loop_class, None), method, None)), syncs[0]["loop_step"]
        assert syncs[0]["call_site"] == logged_at, syncs[0]
        running = f" (in {syncs[0]['running']})" if syncs[0]["running"] else ""  # no hook runs between hooks
        assert describe_call(syncs[0]) == (
            f"Lightning's `{syncs[0]['loop_step']}`{running} runs the epoch sync of 'train_v' "
            f"(barrier), for the value logged at {logged_at}"
        ), describe_call(syncs[0])


def test_the_audits_trace_names_the_call_in_a_module_it_did_not_write():
    """``ddpprobe.audit`` of examples/reported_cases.py ``ComputeOnRankZeroModule`` (``self.acc.compute()``
    under ``if self.global_rank == 0``): in the audit's trace, rank 0's collectives at that line carry
    ``call`` ``BinaryAccuracy.compute`` (a method), and rank 1 made none there."""
    import inspect

    from examples import reported_cases
    from tests.support.audit_runs import audited

    lines, start = inspect.getsourcelines(reported_cases.ComputeOnRankZeroModule.on_validation_epoch_end)
    line = start + next(i for i, text in enumerate(lines) if "self.acc.compute()" in text)
    site = f"reported_cases.py:{line} in on_validation_epoch_end"
    result = audited(
        "examples.reported_cases:make_compute_on_rank_zero_model",
        "examples.reported_cases:make_ids_12",
        world_size=2,
        timeout=60,
    )
    at_line = [[c for c in rank["collectives"] if c.get("call_site") == site] for rank in result.trace["ranks"]]
    assert at_line[0] and all((c["call"], c["call_kind"]) == ("BinaryAccuracy.compute", "method") for c in at_line[0])
    assert at_line[1] == [], at_line[1]

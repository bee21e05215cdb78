"""The audit diagnoses from evidence recorded in the ranks: per-rank counts, the collective trace, and
causes proven by recomputing the logged values.

Each test runs ``ddpprobe audit`` on one of the modules of ``examples/reported_cases.py`` (small
modules modelled on public bug reports) and checks its verdict and cause against numbers computed
here from the data (``tests/support/oracle.py``): the value every rank should hold, the value a
competing explanation would give, and which samples each rank ran.
"""

import os
import resource
import subprocess
import sys

import pytest

from ddpprobe import audit as ddp_audit
from ddpprobe.audit import AuditInputError, audit
from ddpprobe.plugin.runif import run_if
from tests.support import oracle
from tests.support.audit_runs import audited

pytestmark = pytest.mark.not_a_fact("tests the audit command, not a fact about DDP")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CASES = "examples.reported_cases"

#: Seconds a world of these small modules may run; a collective that never completes fails after half.
TIMEOUT = 40.0
#: The same for a world that is expected to hang in a collective: it ends at the process-group timeout.
HANG_TIMEOUT = 12.0


def _audit(model: str, data: str, world_size: int, backend: str, stage: str = "validate", timeout: float = TIMEOUT):
    return audited(
        f"{CASES}:{model}", f"{CASES}:{data}", world_size=world_size, backend=backend, stage=stage, timeout=timeout
    )


def _synced_means(per_rank_batches: list, world_size: int) -> tuple:
    """(correct, floored): the batch-size-weighted mean of the batch means over every rank's batches,
    and what Lightning gives when it averages the int64 count in integers (issue #21859)."""
    total = sum(oracle.mean(oracle.values(b)) * len(b) for batches in per_rank_batches for b in batches)
    count = sum(len(b) for batches in per_rank_batches for b in batches)
    return total / count, (total / world_size) / (count // world_size)


# --- 1. a sampler that does not pad ---------------------------------------------------------------


def test_a_sampler_that_does_not_pad_is_named_by_the_counts_and_the_floored_count_bug_is_the_cause(backend):
    """Issue-14 input 1: ``val_loss`` with ``sync_dist=True``, 11 samples through a sampler that does not
    pad (W=2: ranks hold 6 and 5). The counts the ranks recorded show no repeated sample (so no
    padding is claimed), and the measured value is the synced mean with a floored count:
    (sum / 2) / floor(11 / 2), 11/10 of the true mean; the audit names upstream issue #21859."""
    n, world_size, batch_size = 11, 2, 2
    result = _audit("make_unpadded_mean_model", "make_unpadded_11", world_size, backend)

    shards = [oracle.batches(list(range(r, n, world_size)), batch_size) for r in range(world_size)]
    correct, floored = _synced_means(shards, world_size)
    padded = oracle.mean(oracle.values(oracle.padded_indices(n, world_size)))
    oracle.assert_distinct(correct=correct, floored_count=floored, padded_mean=padded)
    row = result.row("val_loss")
    assert row.per_rank == pytest.approx([floored] * world_size, rel=1e-6), (
        oracle.side_by_side("val_loss", row.per_rank) + f"  expected floored {floored}, correct {correct}"
    )
    assert row.single == pytest.approx(correct, rel=1e-6)
    assert row.verdict == ddp_audit.SYNCED_DIFFERS and row.problem
    assert ddp_audit.FLOORED_COUNT_ISSUE in row.cause, row.cause
    assert "non-decomposable" not in row.cause and "repeat" not in row.cause, row.cause
    assert result.counts["val"]["samples"] == [len(range(r, n, world_size)) for r in range(world_size)]
    assert result.counts["val"]["duplicates"] == 0
    assert "pads" not in result.format()


# --- 2. a world of one rank -----------------------------------------------------------------------


def test_world_size_1_is_refused_because_nothing_would_be_compared(monkeypatch):
    """Issue-14 input 2: ``world_size=1`` runs the single-process world twice; the audit refuses it
    (``AuditInputError``, exit code 2) before any world starts."""
    import ddpprobe.launch

    monkeypatch.setattr(ddpprobe.launch, "run_world", _no_world)
    with pytest.raises(AuditInputError, match=r"world_size=1 .*compare nothing.*--world-size 2"):
        audit(f"{CASES}:make_epoch_mean_model", f"{CASES}:make_sharded_iterable_5", world_size=1)


def _no_world(*args, **kwargs):
    raise AssertionError("a world was started for bad input")


# --- 3. a metric object logged on_step and on_epoch -----------------------------------------------


def _accuracy(ids) -> float:
    return sum(1 for i in ids if i % 2 == 0) / len(ids)  # RightWrongDataset: even ids right, odd ids wrong


def test_a_metric_objects_step_values_are_each_ranks_own_although_its_epoch_value_is_synced(backend):
    """Issue-14 input 3: ``BinaryAccuracy`` logged ``on_step=True, on_epoch=True, sync_dist=True``;
    rank 0's samples are all right, rank 1's all wrong. The epoch value is the accuracy of all 8
    samples on every rank (synced, equals single-process), but the step values are each rank's own
    batch's (1.0 on rank 0, 0.0 on rank 1): a problem, since sync_dist=True asked for synced values."""
    n, world_size, batch_size = 8, 2, 2
    result = _audit("make_step_and_epoch_accuracy_model", "make_right_wrong_8", world_size, backend)

    whole = _accuracy(range(n))
    last_batches = [oracle.batches(oracle.shard(n, world_size, r), batch_size)[-1] for r in range(world_size)]
    steps = [_accuracy(b) for b in last_batches]
    oracle.assert_distinct(epoch=whole, rank0_step=steps[0], rank1_step=steps[1])
    epoch = result.row("val_acc", level="epoch")
    assert (epoch.verdict, epoch.single, epoch.per_rank) == (ddp_audit.SYNCED_EQUAL, whole, [whole] * world_size)
    step = result.row("val_acc", level="step")
    assert step.per_rank == pytest.approx(steps), oracle.side_by_side("val_acc step", step.per_rank) + f"  {steps}"
    assert step.verdict == ddp_audit.STEP_RANK_LOCAL and step.problem and result.exit_code == 1
    text = " ".join(result.format().split())
    assert f"(shown by {ddp_audit.FIXES['metric_step_local'][1]})" in text, text


def test_a_step_only_metric_shows_each_ranks_step_values_not_dashes_and_no_callback_metrics_claim(backend):
    """Issue-14 input 3 with ``on_step=True`` only: the table shows each rank's last step value (not
    "-") and the note does not claim ``callback_metrics`` keeps the last step's value (outside
    training it does not: tests/facts/test_log_reductions.py
    ``test_on_step_and_on_epoch_fork_the_name_and_only_training_puts_the_step_key_in_callback_metrics``)."""
    n, world_size, batch_size = 8, 2, 2
    result = _audit("make_step_only_accuracy_model", "make_right_wrong_8", world_size, backend)

    steps = [_accuracy(oracle.batches(oracle.shard(n, world_size, r), batch_size)[-1]) for r in range(world_size)]
    assert [row.level for row in result.rows] == ["step"]
    row = result.rows[0]
    assert row.per_rank == pytest.approx(steps) and row.verdict == ddp_audit.STEP_RANK_LOCAL
    assert "callback_metrics" not in row.cause, row.cause


# --- 4. an iterable dataset the user shards by i % W ----------------------------------------------


def test_uneven_user_shards_an_epoch_mean_is_floored_not_non_decomposable(backend):
    """Issue-14 input 4, epoch-only synced mean: 5 samples sharded ``i % 2`` (ranks run 3 and 2 batches
    of 1). The value is a per-sample mean, so the synced mean is exact except for the floored count:
    (30 / 2) / floor(5 / 2) = 7.5 instead of 6; the audit names issue #21859, not a non-decomposable metric."""
    n, world_size = 5, 2
    result = _audit("make_epoch_mean_model", "make_sharded_iterable_5", world_size, backend)

    shards = [oracle.batches(list(range(r, n, world_size)), 1) for r in range(world_size)]
    correct, floored = _synced_means(shards, world_size)
    oracle.assert_distinct(correct=correct, floored=floored)
    row = result.row("val_mean")
    assert row.per_rank == pytest.approx([floored] * world_size) and row.single == pytest.approx(correct)
    assert ddp_audit.FLOORED_COUNT_ISSUE in row.cause and "non-decomposable" not in row.cause, row.cause
    assert result.counts["val"]["batches"] == [len(range(r, n, world_size)) for r in range(world_size)]


def test_uneven_user_shards_a_synced_step_value_leaves_rank_0_alone_in_its_last_collective(backend):
    """Issue-14 input 4 with ``on_step=True, sync_dist=True``: rank 0 runs a third batch and enters the
    step value's sync; rank 1 has finished. The trace names the key, the hook and the line, says which
    rank never entered, and the audit fails (exit code 1)."""
    n, world_size = 5, 2
    result = _audit("make_step_synced_model", "make_sharded_iterable_5", world_size, backend)

    divergence = result.trace["first_divergence"]
    assert divergence is not None, result.format()
    assert (divergence["kind"], divergence["ranks"], divergence["absent"]) == ("missing", [0], [1])
    entry = divergence["entries"][0]
    assert (entry["key"], entry["hook"], entry["source"]) == ("val_step_mean", "validation_step", "self.log")
    assert "reported_cases.py" in entry["call_site"], entry
    assert result.counts["val"]["batches"] == [len(range(r, n, world_size)) for r in range(world_size)]
    assert result.exit_code == 1 and any("diverge" in p for p in result.problems)


def test_uneven_user_shards_a_step_and_epoch_synced_value_aborts_a_rank_and_the_trace_still_names_the_key(backend):
    """Issue-14 input 4 with ``on_step=True, on_epoch=True, sync_dist=True``: rank 0's third step sync
    pairs with rank 1's epoch sync and gloo aborts rank 0 (tests/facts/test_uneven_shards.py shows the
    abort). The world fails, yet the traces the ranks wrote as they ran give the first divergence with
    the key, the hook and the line: the same float32 all_reduce serving rank 0's step sync and rank 1's
    epoch sync (a ``"purpose"`` divergence, found before the op mismatch it leads to); the steps both
    ranks ran are synced; the epoch value never came."""
    n, world_size = 5, 2
    result = _audit("make_step_and_epoch_synced_model", "make_sharded_iterable_5", world_size, backend)
    batches = [len(range(r, n, world_size)) for r in range(world_size)]  # batches of 1

    assert result.world_error is not None and result.world_error["type"] == "RankDied", result.world_error
    divergence = result.trace["first_divergence"]
    assert divergence is not None and divergence["kind"] == "purpose", result.format()
    assert {e["key"] for e in divergence["entries"]} == {"val_both"}
    assert all("reported_cases.py" in e["call_site"] for e in divergence["entries"])
    assert [e["sync"] for e in divergence["entries"]] == ["step", "epoch"], divergence["entries"]
    assert {(e["op"], e["dtype"]) for e in divergence["entries"]} == {("all_reduce", "float32")}
    message = divergence["message"]
    assert (
        "rank 0's all_reduce float32 [] (self.log step sync of 'val_both', logged in validation_step)" in message
        and "paired with rank 1's all_reduce float32 [] (self.log epoch sync of 'val_both'" in message
    ), message
    assert divergence["diagnosis"]["fixes"] == ["uneven_batches_step_sync"], divergence["diagnosis"]
    steps = result.row("val_both", level="step")
    assert steps.verdict == ddp_audit.STEP_SYNCED and steps.evidence["steps per rank"] == batches, steps
    assert result.row("val_both", level="epoch").verdict == ddp_audit.NO_VALUE
    assert result.counts["val"]["batches"] == batches and result.exit_code == 1


#: The first collective of a training step: from 2.5.2 the training loop's own per-step broadcast
#: (pytorch_lightning/loops/training_epoch_loop.py ``_broadcast_sigterm_tensor``, before the backward); before
#: it, the backward's gradient all_reduce (DDP's reducer: a bucket of the model's 3 parameters' values).
_FIRST_COLLECTIVE_OF_A_STEP = [
    pytest.param(
        ("broadcast", "library", "training_epoch_loop"),
        id="sigterm_broadcast",
        marks=run_if(lightning=">=2.5.2", feature="the training loop's per-step SIGTERM broadcast"),
    ),
    pytest.param(
        ("all_reduce", "internal", None),
        id="gradient_all_reduce",
        marks=run_if(lightning="<2.5.2", feature="no per-step SIGTERM broadcast in the training loop"),
    ),
]


@pytest.mark.waits_for_timeout
@pytest.mark.parametrize("first_collective", _FIRST_COLLECTIVE_OF_A_STEP)
def test_uneven_user_shards_in_fit_the_trace_shows_rank_0s_third_training_step_against_rank_1s_epoch_loss_sync(
    backend, first_collective
):
    """Issue-14 input 4, ``--stage fit``, epoch-level ``train_loss`` with ``sync_dist=True``: rank 0 runs a
    third training batch, whose first collective is the training loop's own per-step broadcast
    (pytorch_lightning/loops/training_epoch_loop.py ``_broadcast_sigterm_tensor``, from 2.5.2; before it, the
    backward's gradient all_reduce), while rank 1, done with its 2 batches, enters the epoch sync of
    ``train_loss``. The key without a value is not called "synced"; the first divergence pairs those two
    entries, and the diagnosis names the per-batch count and the equal-batches fix."""
    n, world_size = 5, 2
    result = _audit(
        "make_train_loss_model", "make_sharded_iterable_5_fit", world_size, backend, "fit", timeout=HANG_TIMEOUT
    )

    row = result.row("train_loss")
    assert row.verdict not in (ddp_audit.SYNCED_DIFFERS, ddp_audit.SYNCED_EQUAL), row
    divergence = result.trace["first_divergence"]
    assert divergence is not None, result.format()
    assert (divergence["kind"], divergence["ranks"]) == ("mismatch", list(range(world_size))), divergence
    step, epoch_sync = divergence["entries"]
    op, source, origin = first_collective
    assert (step["op"], step["source"]) == (op, source) and (origin is None or origin in step["origin"]), step
    assert (epoch_sync["source"], epoch_sync["key"], epoch_sync["sync"]) == ("self.log", "train_loss", "epoch")
    assert divergence["diagnosis"]["fixes"] == ["uneven_batches_fit"], divergence["diagnosis"]
    assert result.counts["train"]["batches"] == [len(range(r, n, world_size)) for r in range(world_size)]
    assert result.exit_code == 1


# --- 5. an iterable dataset every rank iterates in full -------------------------------------------


def test_unsharded_data_is_named_and_explains_a_synced_sum_of_w_times_the_single_process_sum(backend):
    """Issue-14 input 5: every rank iterates all 8 samples. A synced sum (``reduce_fx="sum"`` of the
    batch means) is W times the single-process sum, and the audit says the data is not sharded."""
    n, world_size, batch_size = 8, 2, 2
    result = _audit("make_synced_sum_model", "make_unsharded_iterable_8", world_size, backend)

    single = sum(oracle.mean(oracle.values(b)) for b in oracle.batches(list(range(n)), batch_size))
    oracle.assert_distinct(single=single, synced=world_size * single)
    row = result.row("val_sum")
    assert row.per_rank == pytest.approx([world_size * single] * world_size) and row.single == pytest.approx(single)
    assert row.verdict == ddp_audit.SYNCED_DIFFERS and row.cause.startswith("unsharded data"), row.cause
    assert result.counts["val"]["unsharded"] and result.counts["val"]["samples"] == [n] * world_size


def test_unsharded_data_fails_the_audit_even_when_the_synced_mean_equals_single_process(backend):
    """Issue-14 input 5, synced mean: the mean over W copies of the set equals the set's mean, so the key
    passes, but every rank repeating the others' work is reported as a problem (exit code 1)."""
    n, world_size = 8, 2
    result = _audit("make_synced_mean_model", "make_unsharded_iterable_8", world_size, backend)

    row = result.row("val_mean")
    assert row.verdict == ddp_audit.SYNCED_EQUAL and row.single == pytest.approx(oracle.mean(oracle.values(range(n))))
    assert result.exit_code == 1
    assert any("not sharded" in p for p in result.problems), result.problems


# --- 6. metric.compute() on rank 0 only -----------------------------------------------------------


def test_compute_under_if_global_rank_0_is_named_with_its_metric_and_line(backend):
    """Issue-14 input 6: ``if self.global_rank == 0: self.log("val_acc", self.acc.compute())``. The trace
    shows rank 0 entering ``BinaryAccuracy``'s state sync at ``compute()`` in
    ``on_validation_epoch_end`` and rank 1 never entering it; rank 0 waits there until the backend
    fails, so ``val_acc`` is never logged at W=2 (and the note says so, naming no empty rank list)."""
    world_size = 2
    result = _audit("make_compute_on_rank_zero_model", "make_ids_12", world_size, backend)

    divergence = result.trace["first_divergence"]
    assert divergence is not None, result.format()
    assert divergence["kind"] == "missing" and divergence["ranks"] == [0], divergence
    entry = divergence["entries"][0]
    assert (entry["source"], entry["metric"]) == ("torchmetrics", "BinaryAccuracy"), entry
    assert "on_validation_epoch_end" in entry["call_site"] and "compute()" in divergence["message"]
    assert entry["states"] == ["tp", "fp", "tn", "fn"] and divergence["absent"] == [1]
    assert divergence["diagnosis"]["fixes"] == ["metric_compute_on_some_ranks"], divergence["diagnosis"]
    row = result.row("val_acc")
    assert row.logged_on == [] and row.verdict == ddp_audit.NOT_IN_WORLD and row.problem
    assert "[]" not in row.cause and "sync_dist=True" not in row.cause, row.cause
    assert result.exit_code == 1


# --- 7. a different key on each rank --------------------------------------------------------------


def test_the_same_all_reduce_under_different_keys_is_found_although_the_run_finishes(backend):
    """``self.log(f"loss_rank{rank}", v, sync_dist=True)``: both ranks' all_reduces are float32 scalars,
    so gloo pairs them and the run ends normally (``TORCH_DISTRIBUTED_DEBUG=DETAIL`` compares op and
    shape only and would pass it); the trace shows the same collective carrying ``loss_rank0`` on rank 0
    and ``loss_rank1`` on rank 1. Each rank's value is the synced mean of both ranks' batches."""
    n, world_size = 12, 2
    result = _audit("make_key_per_rank_model", "make_ids_12", world_size, backend)

    divergence = result.trace["first_divergence"]
    assert divergence is not None and divergence["kind"] == "keys", result.format()
    assert [e["key"] for e in divergence["entries"]] == ["loss_rank0", "loss_rank1"]
    assert all(e["op"] == "all_reduce" and e["dtype"] == "float32" for e in divergence["entries"])
    assert divergence["diagnosis"]["fixes"] == ["keys_differ"], divergence["diagnosis"]
    assert result.world_error is None and all(t["stage"] == "end" for t in result.trace["ranks"])
    whole = oracle.mean(oracle.values(range(n)))
    own = [oracle.mean(oracle.values(oracle.shard(n, world_size, r))) for r in range(world_size)]
    oracle.assert_distinct(synced=whole, rank0_own=own[0], rank1_own=own[1])
    assert result.row("loss_rank0").per_rank[0] == pytest.approx(whole)
    assert result.row("loss_rank1").per_rank[1] == pytest.approx(whole)
    assert (
        result.row("loss_rank0").fixes == ["keys_differ"]
        and "averaged with another key's" in result.row("loss_rank0").cause
    )
    assert result.exit_code == 1


# --- predict --------------------------------------------------------------------------------------


def test_predict_is_audited_with_real_counts_each_sample_once_and_uneven_batches(backend):
    """``--stage predict`` on 5 samples at W=2: predict does not pad, so the ranks run 3 and 2 batches
    (``oracle.shard`` without padding), every sample once, and nothing diverges: exit code 0."""
    n, world_size = 5, 2
    result = _audit("make_predict_model", "make_ids_5", world_size, backend, "predict")

    expected = [len(range(r, n, world_size)) for r in range(world_size)]
    assert result.counts["predict"]["batches"] == expected and result.predictions == expected
    assert result.counts["predict"]["duplicates"] == 0 and result.counts["predict"]["missing_vs_single"] == 0
    assert result.trace["first_divergence"] is None and result.exit_code == 0, result.format()


def test_predict_with_all_gather_in_predict_step_leaves_the_rank_with_more_batches_waiting(backend):
    """``self.all_gather`` in ``predict_step`` on 5 samples at W=2: rank 0's third batch enters an
    all_gather rank 1 never enters (it ran 2 batches); the trace names the user's line."""
    result = _audit("make_predict_gather_model", "make_ids_5", 2, backend, "predict")

    divergence = result.trace["first_divergence"]
    assert divergence is not None and divergence["kind"] == "missing", result.format()
    assert divergence["ranks"] == [0] and divergence["absent"] == [1]
    entry = divergence["entries"][0]
    assert entry["source"] == "user" and "predict_step" in entry["call_site"], entry
    diagnosis = divergence["diagnosis"]  # one all_gather per batch: the count follows the batches
    assert diagnosis["culprit"]["counts"] == result.counts["predict"]["batches"], diagnosis
    assert diagnosis["fixes"] == ["predict_collective"], diagnosis
    assert result.exit_code == 1


# --- the trace in the JSON output, large worlds, bad input ----------------------------------------


def test_the_json_output_holds_every_ranks_collective_trace_with_keys_hooks_and_call_sites(backend):
    """``result.to_dict()["trace"]``: per rank, the collectives in order with op, dtype, shape, source,
    key, hook, call site and status; the ``val_loss`` syncs carry their key on every rank."""
    result = _audit("make_unpadded_mean_model", "make_unpadded_11", 2, backend)

    trace = result.to_dict()["trace"]
    assert trace["first_divergence"] is None and len(trace["ranks"]) == 2
    for rank in trace["ranks"]:
        synced = [c for c in rank["collectives"] if c["key"] == "val_loss"]
        assert [c["op"] for c in synced if c["op"] != "barrier"] == ["all_reduce", "all_reduce"], synced
        assert {c["dtype"] for c in synced if c["op"] == "all_reduce"} == {"float32", "int64"}
        assert all(c["status"] == "done" and c["hook"] == "validation_step" for c in synced)
        assert rank["stage"] == "end"


def test_a_large_world_shows_min_max_and_distinct_values_instead_of_one_column_per_rank(backend):
    """W=5 (more than 4 ranks): the table has ``min``, ``max`` and ``distinct`` columns."""
    result = _audit("make_synced_mean_model", "make_ids_12", 5, backend)

    header = next(line for line in result.format().splitlines() if line.startswith("key"))
    assert "min" in header and "distinct" in header and "rank 4" not in header, header


def test_bad_input_is_reported_before_any_world_starts(monkeypatch):
    """A factory that cannot be imported, one that raises, one that returns the wrong type, and a data
    factory returning the wrong type: each is an ``AuditInputError`` naming it, and no world is started."""
    import ddpprobe.launch

    monkeypatch.setattr(ddpprobe.launch, "run_world", _no_world)
    data = f"{CASES}:make_ids_12"
    with pytest.raises(AuditInputError, match=r"cannot import the model factory 'examples\.missing:make'"):
        audit("examples.missing:make", data)
    with pytest.raises(
        AuditInputError,
        match=r"model factory 'tests\.tooling\.audit\.test_audit_evidence:raising_factory' raised ZeroDivisionError",
    ):
        audit(raising_factory, data)
    with pytest.raises(AuditInputError, match=r"returned builtins\.dict .*not a LightningModule"):
        audit(dict, data)
    with pytest.raises(AuditInputError, match=r"the data factory returned builtins\.list"):
        audit(f"{CASES}:make_synced_mean_model", list)


def raising_factory():
    return 1 / 0


@pytest.mark.integration
def test_cli_reports_bad_input_in_seconds_with_exit_code_2():
    """``python -m ddpprobe audit`` with ``--world-size 1`` and with a factory that raises: exit code 2,
    nothing on stdout, in seconds of CPU time (one interpreter importing torch and Lightning once, about
    5 s; a world would add a forkserver and its ranks). CPU time, not wall time, so a loaded machine
    does not fail it."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for args, message in (
        ([f"{CASES}:make_synced_mean_model", "--data", f"{CASES}:make_ids_12", "--world-size", "1"], "compare nothing"),
        (
            ["tests.tooling.audit.test_audit_evidence:raising_factory", "--data", f"{CASES}:make_ids_12"],
            "raised ZeroDivisionError",
        ),
    ):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(
            [sys.executable, "-m", "ddpprobe", "audit", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert proc.returncode == 2 and message in proc.stderr and proc.stdout == "", proc.stderr
        assert "ddpprobe-world" not in proc.stderr
        assert cpu < 15, f"bad input took {cpu:.1f} s of CPU to report"

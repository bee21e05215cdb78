"""The audit explains what it found from the evidence the ranks recorded, and each fix fits the case.

Each test runs ``ddpprobe audit`` on a small module of tests/support/audit_modules.py that makes one kind
of mistake (or none), and checks the verdict, the cause and the fix against what the data say: which
samples each rank ran (``tests/support/oracle.py``), which collectives each rank made from which line,
and what each value should be.
"""

import inspect

import pytest

from ddpprobe import audit as ddp_audit
from ddpprobe.audit import audit
from ddpprobe.plugin.runif import run_if
from tests.support import audit_modules, oracle
from tests.support.audit_runs import audited
from tests.support.worlds import skip_unless_runnable

pytestmark = pytest.mark.not_a_fact("tests the audit's diagnoses, not a fact about DDP")

MODULES = "tests.support.audit_modules"

#: Seconds a world of these small modules may run; a collective that never completes fails after half.
TIMEOUT = 40.0
#: The same for a world that is expected to hang in a collective: it ends at the process-group timeout.
HANG_TIMEOUT = 12.0

#: Lightning's default ``num_sanity_val_steps``: validation batches each rank runs before ``fit`` trains.
SANITY_STEPS = 2


def _audit(model: str, data: str, stage: str = "validate", timeout: float = TIMEOUT, max_epochs: int = 1):
    return audited(
        f"{MODULES}:{model}",
        f"{MODULES}:{data}" if data else None,
        world_size=2,
        stage=stage,
        timeout=timeout,
        max_epochs=max_epochs,
    )


def _line_of(cls, method: str, text: str) -> str:
    """``"audit_modules.py:<line> in <method>"``: the line of ``cls.method`` that holds ``text``."""
    lines, start = inspect.getsourcelines(getattr(cls, method))
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"audit_modules.py:{start + offset} in {method}"


# --- 1. fit: the sanity check is counted apart ------------------------------------------------------


def test_fit_counts_the_sanity_check_apart_so_no_sample_is_called_repeated():
    """``--stage fit`` of 8 validation samples over 2 epochs at W=2: each validation epoch, each rank runs its
    ``DistributedSampler`` shard once (4 samples, no sample on two ranks); the sanity check's 2 batches per
    rank ran before training and are counted apart, so no sample is called repeated."""
    n, world_size, batch_size, epochs = 8, 2, 2, 2
    result = _audit("make_mean_model", "make_fit_8", "fit", max_epochs=epochs)

    shards = [oracle.shard(n, world_size, r) for r in range(world_size)]
    val = result.counts["val"]
    assert val["samples"] == [len(s) for s in shards] and val["duplicates"] == 0, val
    assert val["epochs"] == [epochs] * world_size
    sanity = [min(SANITY_STEPS, len(oracle.batches(s, batch_size))) for s in shards]
    assert val["sanity_batches"] == sanity, val
    text = " ".join(result.format().split())
    assert "repeated" not in text and "ran twice" in text and "counted apart" in text, text
    assert result.exit_code == 0, text


# --- 2. a collective some ranks make and the others do not, at one call site ------------------------


def _branch_culprit(result):
    divergence = result.trace["first_divergence"]
    assert divergence is not None, result.format()
    return divergence, divergence["diagnosis"]


@pytest.mark.parametrize("stage, data", [("validate", "make_ids_8"), ("fit", "make_fit_8")])
@pytest.mark.waits_for_timeout
def test_a_collective_made_under_a_branch_on_the_rank_is_named_with_its_line_and_per_rank_counts(stage, data):
    """``if self.global_rank == 0: self.all_gather(...)`` in ``on_validation_epoch_end``: rank 0 makes that
    all_gather once (the first validation epoch: the only one in ``validate``, the sanity check in ``fit``)
    and rank 1 never. Every rank ran the same number of batches, so the fix is to make the collective on
    every rank, not to even the batch counts (the fix once printed for ``fit``); in ``fit`` rank 1's
    entry at the divergence is the epoch sync of ``val_mean``, and the report says they paired."""
    result = _audit("make_rank_branch_gather_model", data, stage, timeout=HANG_TIMEOUT)

    divergence, diagnosis = _branch_culprit(result)
    culprit = diagnosis["culprit"]
    line = _line_of(audit_modules.RankBranchGatherModule, "on_validation_epoch_end", "self.all_gather")
    assert (culprit["entry"]["call_site"], culprit["entry"]["op"], culprit["entry"]["source"]) == (
        line,
        "all_gather",
        "user",
    ), culprit
    assert culprit["counts"] == [1, 0] and culprit["ranks"] == [0] and culprit["decided"], culprit
    assert diagnosis["fixes"] == ["collective_on_some_ranks"], diagnosis
    if stage == "validate":
        assert len(set(result.counts["val"]["batches"])) == 1, result.counts
    else:  # it diverged in the sanity check: no training batch ran
        assert "train" not in result.counts, result.counts
    text = " ".join(result.format().split())
    assert f"the culprit is all_gather float32 [] (your code) at {line}" in text, text
    assert "rank 0 1 time(s), rank 1 0 time(s)" in text and "same number of training batches" not in text, text
    if stage == "fit":
        assert divergence["kind"] == "mismatch", divergence
        other = divergence["entries"][1]
        assert (other["source"], other["key"], other["sync"]) == ("self.log", "val_mean", "epoch"), other
        assert "paired with rank 1's barrier (self.log epoch sync of 'val_mean'" in text, text


# --- 3. the same call site, a different number of collectives per rank -----------------------------

#: Collectives torchmetrics makes to gather one tensor: a barrier, the shapes' all_gather and the
#: tensors' all_gather (torchmetrics/utilities/distributed.py ``gather_all_tensors``).
PER_TENSOR = 3


@pytest.mark.waits_for_timeout
def test_a_list_state_synced_element_by_element_is_named_with_each_ranks_count_state_size_and_value():
    """``BigValues`` keeps one tensor per sample of value >= 9 in a list state without a ``"cat"``
    reduction, so ``compute()`` gathers the list one element at a time: rank 0 (ids 0, 2, 4, 6) kept 2,
    rank 1 (ids 1, 3, 5, 7) kept 3. Every rank calls ``compute()`` once; rank 0 finishes after its 2
    elements with the sum of the pairs it gathered (a wrong value), rank 1 waits for a third pair and
    fails. The audit names the call site with each rank's number of collectives, the state's size on
    each rank and each rank's value, and prints the registry's fix for it, a ``"cat"`` reduction
    (tests/facts/test_hidden_collectives_torchmetrics_list_states.py proves it), once, on the divergence: the
    key it took down is a consequence and gets none."""
    n, world_size = 8, 2
    result = _audit("make_list_state_model", "make_ids_8", timeout=HANG_TIMEOUT)

    kept = [[v for v in oracle.values(oracle.shard(n, world_size, r)) if v >= audit_modules.BIG] for r in range(2)]
    paired = sum(sum(pair) for pair in zip(*kept))
    whole = sum(v for v in oracle.values(range(n)) if v >= audit_modules.BIG)
    oracle.assert_distinct(whole=whole, paired=paired)
    row = result.row("val_big")
    assert row.single == pytest.approx(whole) and row.per_rank[0] == pytest.approx(paired), row
    diagnosis = result.trace["first_divergence"]["diagnosis"]
    culprit = diagnosis["culprit"]
    line = _line_of(audit_modules.ListStateModule, "on_validation_epoch_end", "compute()")
    assert (culprit["entry"]["call_site"], culprit["entry"]["metric"]) == (line, "BigValues"), culprit
    fewer = min(len(k) for k in kept)
    assert culprit["bursts"] == [[PER_TENSOR * len(kept[0])], [PER_TENSOR * fewer + 1]], culprit
    assert diagnosis["fixes"] == ["list_state_element_sync"] and row.fixes == [], (diagnosis, row)
    text = " ".join(result.format().split())
    assert f"BigValues state sync at compute() at {line}" in text, text
    assert text.count("Fix:") == 1 and "dist_reduce_fx='cat'" in text, text
    assert f"rank 0 big list of {len(kept[0])}; rank 1 big list of {len(kept[1])}" in text, text
    assert f"rank 0 val_big={paired:g}, rank 1 none" in text, text


# --- 4. causes only when proven ---------------------------------------------------------------------


def test_a_rank_local_per_sample_mean_without_padding_is_fixed_by_sync_dist():
    """``val_mean`` (each batch's mean ``value``, no ``sync_dist``), 8 samples at W=2: each rank keeps the mean
    of its shard; the two shards hold 4 samples each and no repeat, so the mean of the ranks' values is the
    single-process mean and ``sync_dist=True`` is the fix the audit gives."""
    n, world_size = 8, 2
    result = _audit("make_unsynced_mean_model", "make_ids_8")

    per_rank = [oracle.mean(oracle.values(oracle.shard(n, world_size, r))) for r in range(world_size)]
    single = oracle.mean(oracle.values(range(n)))
    oracle.assert_distinct(rank0=per_rank[0], single=single)
    row = result.row("val_mean")
    assert row.per_rank == pytest.approx(per_rank) and row.single == pytest.approx(single), row
    assert row.verdict == ddp_audit.RANK_DIVERGENT and row.fixes == ["rank_local_mean"], row
    assert "the mean of the ranks' values equals single-process, so sync_dist=True gives it" in row.cause, row.cause


def test_a_rank_local_per_sample_mean_with_padding_is_settled_by_one_process_on_the_padded_samples():
    """The same module on 9 samples at W=2: ``DistributedSampler`` pads rank 1's shard with a repeat of
    sample 0, so the ranks' values average to the padded set's mean, not the single process's. A per-sample
    mean synced over the ranks would count the repeat too, so one W=N run cannot tell "not a per-sample
    mean" from "the repeated sample"; one process running the ranks' 10 samples, repeats included, settles it:
    it gives the ranks' mean, so the audit says sync_dist=True gives that padded set's value and dropping the
    repeats gives single-process (never "sync_dist=True cannot fix it"), and gives the fix for the repeats and, as
    the key is logged with sync_dist=False from validation_step where no rank ran a collective, that entry's fix
    (sync_dist=True); no list of candidates with "nothing recorded" for or against them."""
    n, world_size = 9, 2
    result = _audit("make_unsynced_mean_model", "make_ids_9")

    shards = [oracle.shard(n, world_size, r) for r in range(world_size)]
    per_rank = [oracle.mean(oracle.values(s)) for s in shards]
    padded = oracle.mean(oracle.values(shards[0] + shards[1]))
    single = oracle.mean(oracle.values(range(n)))
    oracle.assert_distinct(padded=padded, single=single)
    assert sum(oracle.duplicates(n, world_size).values()) == 1
    row = result.row("val_mean")
    assert row.per_rank == pytest.approx(per_rank) and row.single == pytest.approx(single), row
    assert oracle.mean(row.per_rank) == pytest.approx(padded)
    assert row.verdict == ddp_audit.RANK_DIVERGENT, row
    assert row.fixes == ["repeated_samples", "step_mean_rank_local"], row
    cause = " ".join(row.cause.split())
    assert f"gives {padded:.6g}, the mean of the ranks' values: sync_dist=True gives that padded set's value" in cause
    assert f"dropping the repeats gives single-process {single:.6g}" in cause, cause
    assert "unknown whether" not in cause, cause
    assert "'val_mean' is logged from validation_step with sync_dist=False" in cause, cause
    assert "Candidates" not in cause and "nothing recorded" not in cause, cause
    assert "sync_dist=True cannot fix it" not in cause, cause


def test_a_value_that_adds_the_rank_is_not_called_non_decomposable_the_cause_is_unknown_with_candidates():
    """``val_mean`` = batch mean of ``value`` + ``self.global_rank`` (``sync_dist=True``), 8 samples at W=2:
    every rank holds the synced mean, the mean of ``value`` plus the mean of the ranks (0.5), not the
    single process's mean. The ranks ran the single process's samples, so the old rule called the metric
    non-decomposable; the logging function reads ``global_rank``, so the audit says unknown and lists both
    candidates with the evidence for and against each, and prints no fix."""
    n, world_size = 8, 2
    result = _audit("make_rank_offset_model", "make_ids_8")

    single = oracle.mean(oracle.values(range(n)))
    synced = single + oracle.mean(range(world_size))  # every rank's batches carry their rank, equal counts
    oracle.assert_distinct(single=single, synced=synced)
    row = result.row("val_mean")
    assert row.per_rank == pytest.approx([synced] * world_size) and row.single == pytest.approx(single), row
    assert row.verdict == ddp_audit.SYNCED_DIFFERS, row
    assert row.cause.startswith("unknown") and "non-decomposable:" not in row.cause, row.cause
    line = _line_of(audit_modules.RankOffsetModule, "validation_step", "self.log")
    assert f"the value depends on the rank: for: {line} reads global_rank" in row.cause, row.cause
    assert "(2) non-decomposable" in row.cause and row.fixes == [], row


def _wrapped_shard(n: int, world_size: int, rank: int) -> list:
    """What rank ``rank`` runs when ``DistributedSamplerWrapper`` shards :class:`RankStrideSampler`'s indices
    for that rank again (padding them like ``DistributedSampler``, torch/utils/data/distributed.py)."""
    inner = list(range(rank, n, world_size))
    padded = inner + inner[: (-len(inner)) % world_size]
    return padded[rank::world_size]


def test_samples_no_rank_ran_are_named_as_the_cause_when_recomputing_without_them_gives_the_measured_value():
    """A rank-aware user sampler over 11 samples that Lightning wraps in ``DistributedSamplerWrapper``: each
    rank's own indices are sharded again, so the ranks run 3 + 3 samples and 5 samples of W=1 run on no rank.
    The single-process value without those samples (batches of 1) is the measured synced mean, so the audit
    names the missing samples as the cause instead of "unknown"."""
    n, world_size = 11, 2
    result = _audit("make_mean_model", "make_rank_stride_11")

    ran = [_wrapped_shard(n, world_size, r) for r in range(world_size)]
    missing = sorted(set(range(n)) - {i for shard in ran for i in shard})
    measured = oracle.mean(oracle.values([i for shard in ran for i in shard]))
    oracle.assert_distinct(measured=measured, single=oracle.mean(oracle.values(range(n))))
    assert result.counts["val"]["samples"] == [len(s) for s in ran] and result.counts["val"]["duplicates"] == 0
    row = result.row("val_mean")
    assert row.per_rank == pytest.approx([measured] * world_size), row
    assert row.cause.startswith(f"missing samples: {len(missing)} sample(s) of W=1 ran on no rank"), row.cause
    assert f"({', '.join(str(i) for i in missing)})" in row.cause and "unknown" not in row.cause, row.cause
    assert row.evidence["single-process without the missing samples"] == pytest.approx(measured)


# --- 7. fit: compare like with like -------------------------------------------------------------------


def test_fit_compares_validation_values_on_the_same_weights_and_does_not_blame_logging_for_training():
    """A newcomer's classifier, ``--stage fit`` at W=2: 26 training samples in batches of 2 are 13 optimizer
    steps at W=1 and 7 on each rank at W=2, so the weights differ. ``val_acc`` (each batch's accuracy, no
    ``sync_dist``) is compared with a single process validating the W=2 weights: each rank ran 5 of the
    10 validation samples, so the mean of the ranks' accuracies is that single-process value and
    ``sync_dist=True`` is the fix, as ``--stage validate`` says (not "not a per-sample mean"). The synced
    ``train_loss`` agrees on every rank and, trained apart, is not compared and not a problem."""
    import math

    world_size = 2
    result = _audit("make_newcomer_classifier", "make_newcomer_data", "fit")

    per_rank_train = math.ceil(audit_modules.NEWCOMER_TRAIN / world_size)
    steps = [
        math.ceil(audit_modules.NEWCOMER_TRAIN / audit_modules.NEWCOMER_BATCH),
        math.ceil(per_rank_train / audit_modules.NEWCOMER_BATCH),
    ]
    assert result.weights == {"trained_apart": True, "steps": steps, "same_weights": True}, result.weights
    shards = [len(oracle.shard(audit_modules.NEWCOMER_VAL, world_size, r)) for r in range(world_size)]
    assert result.counts["val"]["samples"] == shards and len(set(shards)) == 1
    row = result.row("val_acc")
    assert row.verdict == ddp_audit.RANK_DIVERGENT and len(set(row.per_rank)) == world_size, row
    assert row.single == pytest.approx(sum(row.per_rank) / world_size), row
    assert row.fixes == ["rank_local_mean"] and "not a per-sample mean" not in row.cause, row
    train = result.row("train_loss")
    assert train.verdict == ddp_audit.TRAINED_APART and not train.problem and train.single is None, train
    assert len(set(train.per_rank)) == 1, train
    text = " ".join(result.format().split())
    assert f"the weights trained apart (W=1 made {steps[0]} optimizer steps, W=2 {steps[1]} on each rank)" in text


# --- 8. modules that bring their own data; hints that do not lead into a failure ----------------------


def test_a_module_with_its_own_dataloaders_is_audited_without_a_data_factory():
    """Lightning's own ``BoringModel`` (pytorch_lightning/demos/boring_classes.py, written out in
    tests/support/boring.py so that it imports on every release) defines ``val_dataloader``: ``audit(model)``
    without a data factory validates it on that loader, each rank running its ``DistributedSampler`` shard
    of the 64 samples. Its ``RandomDataset`` draws its samples when built, and the audit's ranks draw as the
    processes of a real launch do, each from its own state: the one problem is the DDP contract's, each rank
    holding its own validation set (``loader.val[0].dataset``), as an unseeded launch of ``BoringModel`` gives."""
    from torch.utils.data import DistributedSampler

    skip_unless_runnable("gloo", 2)
    world_size = 2
    result = audited("tests.support.boring:BoringModel", None, world_size, timeout=TIMEOUT)

    from tests.support.boring import BoringModel

    loader = BoringModel().val_dataloader()
    shards = [len(DistributedSampler(loader.dataset, world_size, r, shuffle=False)) for r in range(world_size)]
    assert result.counts["val"]["samples"] == shards and result.counts["val"]["duplicates"] == 0, result.counts
    assert result.counts["val"]["batches"] == [-(-s // loader.batch_size) for s in shards]
    assert "own *_dataloader methods" in result.format(), result.format()
    roots = [b["field"] for b in result.contract["breaks"] if not b["root"]]
    assert roots == ["loader.val[0].dataset"] and len(result.findings) == 1, result.format()


def test_a_refused_stage_suggests_only_stages_the_module_and_its_data_can_run():
    """``--stage test`` on the newcomer's classifier (no ``test_step``): the refusal suggests ``validate``
    and ``fit``, not ``predict``, although the data has a ``"predict"`` loader and the module a ``forward``:
    without ``predict_step`` Lightning calls ``forward`` on the (x, y) batch, which fails; no world starts."""
    with pytest.raises(ddp_audit.AuditInputError) as refused:
        audit(f"{MODULES}:make_newcomer_classifier", f"{MODULES}:make_newcomer_data_with_predict", stage="test")

    message = str(refused.value)
    assert "without test_step" in message and "--stage validate, --stage fit" in message, message
    assert "--stage predict" not in message, message


# --- 5. what callbacks did comes from their recorded state ---------------------------------------------


@pytest.mark.parametrize(
    "stopping_reason",
    [
        pytest.param(
            True, id="stopping_reason", marks=run_if(lightning=">=2.6", feature="EarlyStopping.stopping_reason")
        ),
        pytest.param(
            False, id="no_stopping_reason", marks=run_if(lightning="<2.6", feature="no EarlyStopping.stopping_reason")
        ),
    ],
)
def test_callbacks_are_reported_from_each_ranks_recorded_state_compared_across_ranks(stopping_reason):
    """``ModelCheckpoint`` and ``EarlyStopping`` (``mode="max"``, ``patience=1``) monitor an unsynced
    ``val_score`` that rises on rank 0 and falls on rank 1 (W=2, 8 samples, up to 3 epochs). From each
    rank's own values the oracle gives: the first epoch's checkpoint is the only one (rank 1 vetoes every
    later save), so each rank keeps its own epoch-0 score under one file name; rank 1 alone runs out of
    patience at epoch 1 and stops every rank, and only rank 1 records why (``EarlyStopping.stopping_reason``,
    new in 2.6; on earlier releases no rank has one to record). The audit prints each rank's recorded state
    and no fixed sentence about ModelCheckpoint."""
    n, world_size, batch_size, epochs = 8, 2, 2, 3
    result = _audit("make_monitored_model", "make_fit_8", "fit", max_epochs=epochs)

    shards = [oracle.shard(n, world_size, r) for r in range(world_size)]
    means = [oracle.mean(oracle.values(s)) for s in shards]
    signs = [1 if s[0] % 2 == 0 else -1 for s in shards]
    values = [[m + sign * e for e in range(epochs)] for m, sign in zip(means, signs)]
    decisions = [oracle.early_stopping_local_decisions(v, "max", patience=audit_modules.PATIENCE) for v in values]
    stopped = oracle.first_epoch_where(decisions, any)
    saved = oracle.top1_checkpoint_epochs([v[: stopped + 1] for v in values], all, mode="max")
    oracle.assert_distinct(
        last_saved_all=saved[-1], last_saved_any=oracle.top1_checkpoint_epochs(values, any, "max")[-1]
    )
    steps = -(-len(shards[0]) // batch_size)
    name = f"epoch={saved[-1]}-step={(saved[-1] + 1) * steps}.ckpt"
    found = {row["callback"]: row for row in result.callbacks}
    checkpoint, early = found["ModelCheckpoint"]["fields"], found["EarlyStopping"]["fields"]
    assert checkpoint["best_model_score"] == pytest.approx([v[saved[-1]] for v in values]), checkpoint
    assert checkpoint["best_model_path"] == [name] * world_size and checkpoint["files"] == [[name]] * world_size
    assert early["stopped_epoch"] == [stopped] * world_size, early
    reasons = ["PATIENCE_EXHAUSTED" if d[stopped] else "NOT_STOPPED" for d in decisions]
    assert early["stopping_reason"] == (reasons if stopping_reason else [None] * world_size), early
    assert found["ModelCheckpoint"]["differs"] == ["best_model_score", "best_k_models"], found
    text = " ".join(result.format().split())
    assert "names files and keeps best_model_score from rank 0" not in text, text
    assert f"best_model_path {name!r} on every rank" in text and "(ranks differ)" in text, text


# --- 6. what self.all_gather cannot move ----------------------------------------------------------------


def test_strings_self_all_gather_returns_unchanged_are_named_and_no_all_gather_fix_is_given():
    """``self.all_gather({"names": [str, ...], "count": tensor})``: Lightning gathers tensors only, so each
    rank gets its own list of names back (rank 0 kept 2 names of value >= 9, rank 1 kept 3). The trace
    records which leaves came back unchanged, the audit names them for the values computed from them,
    and recommends no all_gather for those values."""
    n, world_size = 8, 2
    result = _audit("make_gathered_names_model", "make_ids_8")

    kept = [sum(1 for v in oracle.values(oracle.shard(n, world_size, r)) if v >= audit_modules.BIG) for r in range(2)]
    assert result.row("val_names").per_rank == pytest.approx(kept), result.row("val_names")
    (entry,) = result.unmoved
    line = _line_of(audit_modules.GatheredNamesModule, "on_validation_epoch_end", "self.all_gather")
    assert (entry["call_site"], entry["ranks"]) == (line, list(range(world_size))), entry
    assert entry["leaves"] == [f"['names'][{i}] (str)" for i in range(max(kept))], entry
    assert "['count']" not in " ".join(entry["leaves"]), entry
    row = result.row("val_names")
    assert f"self.all_gather at {line} returned ['names'][0] (str)" in row.cause, row.cause
    (written,) = result.experiment_rows
    assert written["per_rank"] == pytest.approx(kept) and "experiment_rank_local" not in written["fixes"], written
    assert "all_gather moves tensors only" in written["cause"], written


# --- 9. a world that times out, a rank that raises -------------------------------------------------------


@pytest.mark.waits_for_timeout
def test_a_rank_that_finished_shows_its_value_when_another_rank_hangs_and_the_world_times_out():
    """Rank 1 sleeps after its validation epoch until the world is killed (``WorldTimeout``); rank 0
    finished. Rank 0's value (the synced mean of the 8 samples) comes from its trace, not ``-``, and the
    row says which ranks never finished instead of calling the key rank-divergent."""
    n = 8
    result = _audit("make_sleeping_rank_model", "make_ids_8", timeout=HANG_TIMEOUT)

    assert result.world_error is not None and result.world_error["type"] == "WorldTimeout", result.world_error
    row = result.row("val_mean")
    assert row.per_rank[0] == pytest.approx(oracle.mean(oracle.values(range(n)))) and row.per_rank[1] is None, row
    assert row.verdict == ddp_audit.NO_VALUE_ON_SOME and row.problem and "rank(s) [1] never finished" in row.cause


@pytest.mark.waits_for_timeout
def test_a_divergence_that_follows_a_rank_raising_names_the_error_and_gives_no_logging_fix():
    """Rank 1 raises ``ValueError`` in its second ``validation_step``; rank 0 goes on and enters the epoch
    sync of ``val_mean`` alone. The divergence is explained by rank 1's error, and no fix about logging
    (``rank_zero_only`` or another) is printed for it."""
    result = _audit("make_raising_rank_model", "make_ids_8", timeout=HANG_TIMEOUT)

    divergence = result.trace["first_divergence"]
    assert (divergence["kind"], divergence["ranks"], divergence["absent"]) == ("missing", [0], [1]), divergence
    diagnosis = divergence["diagnosis"]
    assert "rank 1's stage raised 'ValueError: a bad batch on rank 1'" in diagnosis["explanation"], diagnosis
    assert diagnosis["fixes"] == [] and all(not row.fixes for row in result.rows), (diagnosis, result.rows)
    assert "rank_zero_only" not in result.format()

"""The audit compares with the user's single process and proves its equalities (ddpprobe/audit/_pipeline.py,
ddpprobe/audit/causes/_proven.py, ddpprobe/audit/worlds/_partitions.py).

- The reference is ``Trainer(devices=1)`` with Lightning's default strategy (no process group, no DDP wrap). Where
  it raises and a one-rank DDP world does not, the values are compared with that world and the report says so;
  where the W=N run raises, the one-rank DDP world tells DDP's strategy from a second rank.
- "Equals single-process" stands only where a second split of the same samples gives the same value: a mean of
  per-rank F1 equal to the whole set's F1 by chance (the seed question's bug, on data where it happens) is named.
- What DistributedSampler's repeats explain is told apart: a value one process gives on the ranks' samples with
  the repeats is "padding only" (exit code 3); a value it does not give keeps its own cause.

Expected values come from the data (``tests/support/fidelity_modules.py``: each sample carries its prediction and
target, and ``f1_of`` computes F1 from its definition).
"""

from __future__ import annotations

import pytest
from torch.utils.data import DistributedSampler, SequentialSampler

from ddpprobe.audit import RANK_DIVERGENT, SYNCED_DIFFERS, SYNCED_EQUAL
from ddpprobe.audit.worlds._partitions import padded_indices, sampler_order
from tests.support.audit_runs import audited
from tests.support.fidelity_modules import F1_7, F1_8, RATES_8, f1_of

M = "tests.support.fidelity_modules:"


def _text(result) -> str:
    """The report with its line wrapping undone."""
    return " ".join(result.format().split())


def test_the_second_split_gives_each_rank_a_contiguous_block_of_the_same_padded_list_and_restores_the_sampler():
    """Under ``"blocks"`` DistributedSampler's ranks together run the same multiset as Lightning's split (the same
    repeats), each a contiguous block; under ``"padded:W"`` one process's SequentialSampler yields that multiset;
    both classes are as before afterwards."""
    data = list(range(7))
    strided = [list(DistributedSampler(data, num_replicas=2, rank=r, shuffle=False)) for r in range(2)]
    with sampler_order("blocks"):
        blocks = [list(DistributedSampler(data, num_replicas=2, rank=r, shuffle=False)) for r in range(2)]
    with sampler_order("padded:2"):
        padded = list(SequentialSampler(data))
        assert len(SequentialSampler(data)) == 8
    assert strided == [[0, 2, 4, 6], [1, 3, 5, 0]]
    assert blocks == [[0, 1, 2, 3], [4, 5, 6, 0]]
    assert sorted(padded) == sorted(strided[0] + strided[1]) == sorted(padded_indices(7, 2))
    assert list(DistributedSampler(data, num_replicas=2, rank=1, shuffle=False)) == strided[1]
    assert list(SequentialSampler(data)) == data
    with pytest.raises(ValueError, match="'sideways'"):
        with sampler_order("sideways"):
            pass


def test_a_synced_mean_of_per_rank_f1_that_equals_the_whole_set_by_chance_is_named_non_decomposable():
    """The seed question's bug with ``sync_dist=True``: on this data the ranks' F1 (0 and 1/2) average to the whole
    set's 1/4, so one split cannot tell it from a correct value; under the second split (contiguous blocks: 0 and
    2/5) it moves, so the row says non-decomposable and gives the Metric-object fix, not "equals"."""
    result = audited(M + "make_synced_per_rank_f1", M + "make_f1_8")
    row = result.row("val_f1")
    whole = f1_of(F1_8)
    ranks = [f1_of(F1_8[0::2]), f1_of(F1_8[1::2])]
    blocks = (f1_of(F1_8[:4]) + f1_of(F1_8[4:])) / 2
    assert (whole, ranks, blocks) == (0.25, [0.0, 0.5], 0.2)
    assert row.single == pytest.approx(whole) and row.per_rank == pytest.approx([sum(ranks) / 2] * 2)
    assert row.verdict == SYNCED_DIFFERS and row.problem
    assert row.hazards == ["non_decomposable"] and row.fixes == ["non_decomposable"]
    assert row.evidence["under another split"] == pytest.approx(blocks)
    assert "moves with how the samples are split" in row.cause
    assert result.exit_code == 1


def test_an_unsynced_per_rank_f1_whose_mean_equals_the_whole_set_by_chance_is_not_told_sync_dist_fixes_it():
    """Without ``sync_dist`` the ranks keep 0 and 1/2; their mean is the whole set's 1/4 on this split only, so the
    audit must not claim "sync_dist=True gives it": the second split's mean 1/5 names a whole-set metric computed
    per rank, with the Metric-object fix."""
    result = audited(M + "make_unsynced_per_rank_f1", M + "make_f1_8")
    row = result.row("val_f1")
    assert row.verdict == RANK_DIVERGENT
    assert row.per_rank == pytest.approx([f1_of(F1_8[0::2]), f1_of(F1_8[1::2])])
    assert row.hazards == ["rank_local_metric"] and row.fixes == ["rank_local_metric"]
    assert "sync_dist=True gives it" not in row.cause and "sync_dist=True cannot fix it" in row.cause
    assert row.evidence["mean of the ranks' values under another split"] == pytest.approx(
        (f1_of(F1_8[:4]) + f1_of(F1_8[4:])) / 2
    )


def test_a_per_sample_mean_synced_stays_equal_under_the_second_split():
    """Silent where it must be: a per-sample mean logged with its batch size and ``sync_dist=True`` is the whole
    set's under both splits, so the row stays "synced, equals single-process" and says it was checked twice."""
    result = audited("tests.support.audit_modules:make_mean_model", "tests.support.audit_modules:make_ids_8")
    row = result.row("val_mean")
    assert row.verdict == SYNCED_EQUAL and not row.problem
    assert row.single == pytest.approx(sum(i * i for i in range(8)) / 8)
    assert "equal under a second split of the same samples too" in row.cause
    assert result.references["proving"] == ["another split"] and result.exit_code == 0


def test_a_torchmetrics_f1_that_differs_by_the_repeated_samples_alone_is_padding_only_with_exit_code_3():
    """The README's recipe (a torchmetrics F1 object) on 7 samples at W=2: the ranks' synced F1 counts the repeated
    sample 0 (an FP): 4/8 against the whole set's 4/7. One process running the same 8 samples gives 4/8 too, so the
    repeats are the whole difference: ``padding_only``, exit code 3 (documented DDP semantics a CI run may accept),
    not the exit code 1 of a bug."""
    result = audited(M + "make_metric_f1", M + "make_f1_7")
    row = result.row("val_f1")
    padded = [F1_7[i] for i in padded_indices(len(F1_7), 2)]
    assert row.single == pytest.approx(f1_of(F1_7)) and row.per_rank == pytest.approx([f1_of(padded)] * 2)
    assert f1_of(F1_7) != pytest.approx(f1_of(padded))
    assert row.verdict == SYNCED_DIFFERS and row.padding_only and row.hazards == ["repeated_samples"]
    assert result.padding_only and result.exit_code == 3
    assert "exit code 3" in result.format()


def test_a_per_batch_f1_with_repeats_keeps_its_own_cause_apart_from_the_repeats():
    """Per-batch F1 synced as a mean, on the same 7 samples: the repeats are there, but one process running the
    ranks' 8 samples (in other batches) gives another average, so the row names the repeats *and* the
    non-decomposable average, exit code 1."""
    result = audited(M + "make_batch_f1", M + "make_f1_7")
    row = result.row("val_f1")
    assert row.verdict == SYNCED_DIFFERS and not row.padding_only
    assert "repeated_samples" in row.hazards and "non_decomposable" in row.hazards
    assert "not the whole difference" in row.cause
    assert result.exit_code == 1


def test_code_that_needs_a_process_group_is_compared_with_a_one_rank_ddp_world_and_the_note_says_why():
    """``torch.distributed.all_reduce`` without a process group raises in the user's single process
    (``Trainer(devices=1)``); a one-rank DDP world runs it. The values are compared with that world, the report
    says so with the single process's error, and the single process's error is no DDP problem."""
    result = audited(M + "make_own_all_reduce", M + "make_f1_8")
    refs = result.references
    assert refs["compared_with"] == "one-rank DDP world"
    assert refs["single_process_raised"]["type"] == "ValueError"
    assert refs["one_rank_ddp"] == {"raised": None}
    assert result.row("val_positives").single == pytest.approx(sum(t for _, t in F1_8))
    assert 'a one-rank DDP world (strategy="ddp", W=1) ran the stage' in _text(result)
    assert result.exit_code == 0


def test_an_error_raised_under_ddps_strategy_at_one_rank_too_is_not_blamed_on_a_second_rank():
    """Reading ``trainer.model.hparams`` in a ``fit``: the W=2 ranks raise AttributeError (``trainer.model`` is the
    DDP wrap), the single process does not, and a one-rank DDP world raises it too: the report says DDP's
    strategy, not a second rank, makes the stage raise."""
    result = audited(M + "make_reads_the_wrapped_model", M + "make_f1_8_fit", stage="fit")
    refs = result.references
    assert refs["compared_with"] == "single process" and refs["single_process_raised"] is None
    assert refs["one_rank_ddp"]["raised"]["type"] == "AttributeError"
    assert {r["type"] for r in result.raised["world"] if r} == {"AttributeError"}
    assert "not a second rank, makes the stage raise" in _text(result)


def test_a_module_that_runs_everywhere_gets_no_second_reference_and_no_note():
    """Silent where it must be: nothing raised, so no one-rank DDP world ran and the report has no note."""
    result = audited(M + "make_metric_f1", M + "make_f1_8")
    assert result.references["one_rank_ddp"] is None
    assert result.references["compared_with"] == "single process"
    assert "note:" not in result.format()
    assert result.exit_code == 0


def test_a_sync_that_rank_zero_only_turned_off_is_named_and_sync_dist_is_not_offered_as_the_fix():
    """``sync_dist=True, rank_zero_only=True``: the flags ask for a sync the trace lacks. The row names
    ``rank_zero_only=True`` as what turned it off and never prints "Fix: sync_dist=True", which the call already
    passes. The ranks keep their shards' positive rates (samples 0, 2, 4, 6: 3/4 and 1, 3, 5, 7: 1/4)."""
    result = audited(M + "make_rank_zero_only_synced", M + "make_rates_8")
    row = result.row("val_rate")
    shards = [[t for _, t in RATES_8[r::2]] for r in range(2)]
    assert row.per_rank == pytest.approx([sum(s) / len(s) for s in shards]) == [0.75, 0.25]
    assert row.verdict == RANK_DIVERGENT
    assert "rank_zero_only=True turns the sync off" in row.cause
    assert "rank_local_mean" not in row.fixes and "so sync_dist=True gives it" not in row.cause


def test_the_audits_ranks_each_have_their_own_string_hash_secret_as_a_launchs_processes_do():
    """Ranks forked from one server would share its string-hash secret; the audit's ranks each start from a server of
    their own seed (``PYTHONHASHSEED`` 1 + rank, ddpprobe/audit/_pipeline.py ``hash_seeds``), so a ``set`` of strings
    iterates in each rank's own order, that of a fresh interpreter with that seed. Without the option, the ranks
    share one."""
    from ddpprobe.audit._pipeline import hash_seeds
    from ddpprobe.launch import run_world
    from tests.support.process_traits import process_traits, set_order_under

    seeds = hash_seeds(2)
    assert seeds == ["1", "2"]
    own = [r.record for r in run_world(process_traits, 2, hash_seeds=seeds)]
    shared = [r.record for r in run_world(process_traits, 2)]
    assert [r["set_order"] for r in own] == [set_order_under(s) for s in seeds]
    assert own[0]["hash"] != own[1]["hash"] and own[0]["pid"] != own[1]["pid"]
    assert shared[0]["hash"] == shared[1]["hash"]


def test_a_hash_seed_list_that_does_not_fit_the_world_is_refused_before_any_rank_starts():
    """One seed per rank, each 1 to 4294967295 (0 turns randomization off, which no launcher does)."""
    from ddpprobe.launch import run_world
    from tests.support.process_traits import process_traits

    with pytest.raises(ValueError, match=r"hash_seeds=\['1'\].*one PYTHONHASHSEED per rank \(2\)"):
        run_world(process_traits, 2, hash_seeds=["1"])
    with pytest.raises(ValueError, match=r"hash_seeds=\['0', '1'\]"):
        run_world(process_traits, 2, hash_seeds=["0", "1"])


@pytest.mark.integration
def test_under_real_torchrun_the_ranks_string_hash_secrets_differ_too(tmp_path):
    """The other side of the fidelity test: ``torchrun`` (no ``PYTHONHASHSEED`` set) starts each rank as an
    interpreter of its own, so the ranks' string hashes and ``set`` orders differ, as the audit's ranks' do."""
    import json
    import os
    import subprocess
    import sys

    from tests.support.torchrun import ROOT

    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED" and not k.startswith(("PYTEST_", "DDPPROBE_"))}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += ["tests/support/process_traits.py", str(tmp_path)]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=120)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == ["0", "1"]
    assert ranks[0]["hash"] != ranks[1]["hash"] and ranks[0]["pid"] != ranks[1]["pid"]


def test_buffers_registered_in_a_sets_order_are_named_as_differing_between_the_ranks():
    """A module registers one buffer per name of a ``set`` of strings, each holding its position: under a launch each
    rank's secret gives another order, so the buffers differ between the ranks and the DDP contract names them, with
    each rank's value as a fresh interpreter of that rank's seed orders the set."""
    from tests.support.process_traits import HASHED_NAMES, set_order_under

    result = audited(M + "make_set_order_buffers", M + "make_f1_8")
    orders = [set_order_under(s) for s in ("1", "2")]
    expected = {
        f"buffer.slot_{name}": [float(order.index(name)) for order in orders]
        for name in HASHED_NAMES
        if orders[0].index(name) != orders[1].index(name)
    }
    assert expected, "the two seeds order the set alike: choose other names"
    found = {b["field"]: b["per_rank"] for b in result.contract["breaks"]}
    for field, values in expected.items():
        assert field in found, (field, sorted(found))
        assert [v["values"] for v in found[field]] == [[value] for value in values], (field, found[field])


def test_ranks_holding_shares_of_one_whole_set_value_are_named_by_their_sum_not_called_non_decomposable():
    """Each rank divides its own targets' sum by the whole set's length: the ranks' values (3/8 and 1/8 of
    :data:`RATES_8`) add up to the single process's 4/8, and the mean sync gives 2/8. The row says the values are
    shares of one sum (arithmetic on the recorded values), not "non-decomposable", and prints no registry fix."""
    result = audited(M + "make_sum_over_whole_count", M + "make_rates_8")
    row = result.row("val_rate")
    shares = [sum(t for _, t in RATES_8[r::2]) / len(RATES_8) for r in range(2)]
    assert shares == [0.375, 0.125]
    assert row.single == pytest.approx(sum(shares)) and row.per_rank == pytest.approx([sum(shares) / 2] * 2)
    assert row.verdict == SYNCED_DIFFERS
    assert "add up to the single-process 0.5" in " ".join(row.cause.split())
    assert "non-decomposable" not in row.cause and not row.hazards and not row.fixes


def test_a_lazy_layer_is_read_as_unreadable_and_the_error_ddps_strategy_raises_on_it_is_told_apart():
    """A ``LazyLinear`` with no shape yet. Reading its weights raises in torch, so an audit record that read them
    would fail the audit (exit 2, blamed on the user): the single process's records read it as unreadable and its
    value (the targets' rate of :data:`RATES_8`, 1/2) is reported. Under DDP's strategy Lightning itself reads the
    parameters (``DDPStrategy.setup`` -> ``_sync_module_states``, pytorch_lightning/strategies/ddp.py) and raises,
    at one rank as at two: the report says DDP's strategy, not a second rank, makes the stage raise."""
    result = audited(M + "make_lazy_layer", M + "make_rates_8")
    assert result.row("val_rate").single == pytest.approx(sum(t for _, t in RATES_8) / len(RATES_8))
    raised = [r for r in result.raised["world"] if r]
    assert raised and {r["type"] for r in raised} == {"ValueError"}
    assert "_sync_module_states" in "".join(raised[0]["traceback"])
    assert result.references["single_process_raised"] is None
    assert result.references["one_rank_ddp"]["raised"]["type"] == "ValueError"
    assert "not a second rank, makes the stage raise" in _text(result)
    assert result.exit_code == 1


def test_a_per_step_schedule_sized_by_the_dataset_is_noted_where_the_ranks_end_short_of_one_process():
    """``LambdaLR`` decaying 0.1 to 0 over the 4 steps one process takes on 8 samples in batches of 2: at W=2 each rank
    takes 2 steps and ends at 0.1 * (1 - 2/4) = 0.05, the lr one process had after 2 steps, while one process ends
    at 0. The contract notes the scheduler with both runs' steps and last rates. A note, not a problem: the same
    evidence comes from a schedule with no planned end (a StepLR stepped per step), which is no bug."""
    result = audited(M + "make_decay_sized_by_the_dataset", M + "make_f1_8_train", stage="fit")
    found = [s for s in result.contract["schedules"] if s.get("kind") == "steps"]
    assert found == [
        {
            "field": "scheduler[0]._last_lr",
            "kind": "steps",
            "single": [[pytest.approx(0.0)], 4],
            "world": [[pytest.approx(0.05)], 2],
            "single_at": [pytest.approx(0.05)],
        }
    ]
    assert "note: scheduler[0]._last_lr ends each of the 2 ranks' runs at [0.05]" in _text(result)
    assert result.exit_code == 0


def test_a_per_step_schedule_sized_by_estimated_stepping_batches_ends_where_one_process_ends_and_is_silent():
    """Silent where it must be: sized by ``trainer.estimated_stepping_batches`` (each rank's own steps), the ranks'
    schedule ends at 0 as one process's does."""
    result = audited(M + "make_decay_sized_by_the_trainer", M + "make_f1_8_train", stage="fit")
    assert [s for s in result.contract["schedules"] if s.get("kind") == "steps"] == []


def test_relative_paths_land_in_the_audits_working_folder_and_a_path_outside_it_is_named(tmp_path, monkeypatch):
    """The ranks of a world share one working folder of the audit's own, as a launch's processes share theirs:
    ``preds.csv`` is one file for both ranks (the contract names every rank writing its share to it, key
    ``./preds.csv``, never a temporary path of the machine). The absolute path the module also writes is outside that
    folder: the report says the runs wrote the real file there, and they did."""
    from tests.support.fidelity_modules import OUTSIDE_FILE

    outside = tmp_path / "real.csv"
    outside.write_text("the user's own\n")
    monkeypatch.setenv(OUTSIDE_FILE, str(outside))
    result = audited(M + "make_writes_outside", M + "make_f1_8", live=True)  # the claim: the real file was written
    files = {item["key"]: item for item in result.contract["files"]}
    assert "./preds.csv" in files and files["./preds.csv"]["ranks"] == [0, 1]
    assert str(outside) in files
    assert not any("ddpprobe-audit-" in key for key in files)
    text = _text(result)
    assert f"{outside}" in text and "outside the audit's working folder" in text
    assert outside.read_text() != "the user's own\n"


def test_an_attribute_set_in_prepare_data_is_named_with_the_ranks_lightning_runs_prepare_data_on():
    """``self.num_classes = 2`` in ``prepare_data``: Lightning runs it on local rank 0 only, so rank 1 keeps the
    ``__init__`` value 0. The contract's break names the attribute, both values, the line on rank 0 and
    ``prepare_data``'s participation with the fact that shows it; the synced key the attribute feeds (mean of 2 and
    0) follows from it."""
    result = audited(M + "make_sets_in_prepare_data", M + "make_f1_8")
    found = {b["field"]: b for b in result.contract["breaks"]}
    assert found["module.attr.num_classes"]["per_rank"] == [2, 0]
    text = _text(result)
    assert "it is set in prepare_data, and Lightning runs prepare_data on local rank 0 of each node" in text
    assert "test_prepare_data_runs_on_local_rank_zero_of_every_node_or_on_global_rank_zero_only" in text
    assert result.row("val_classes").per_rank == pytest.approx([1.0, 1.0])


def test_a_scheduler_monitoring_a_rank_local_key_is_named_with_that_key_where_its_state_parts():
    """``ReduceLROnPlateau`` on ``val_score``, which each rank logs for itself: rank 0's score never improves (its
    rate halves after the second epoch), rank 1's does. The contract's break on the scheduler's state names the
    monitored key as what feeds it; the key's row is rank-divergent, and the per-sample-mean conclusion it cannot
    draw once the ranks' weights parted is not drawn."""
    result = audited(M + "make_plateau_on_a_rank_local_key", M + "make_f1_8_fit", stage="fit", max_epochs=3)
    fed = [b for b in result.contract["breaks"] if b.get("fed_by")]
    assert fed and all(b["fed_by"]["key"] == "val_score" and b["fed_by"]["scheduler"] == "scheduler[0]" for b in fed)
    assert {b["field"] for b in fed} >= {"optimizer[0].group[0].lr"}
    row = result.row("val_score")
    assert row.verdict == RANK_DIVERGENT and "not a per-sample mean" not in row.cause
    assert "scheduler[0] monitors 'val_score'" in _text(result)


def test_an_error_only_the_ranks_raise_names_the_batch_size_sharding_left_them():
    """``BatchNorm1d`` raises on a batch of one sample. One process runs 10 samples as batches of 4, 4 and 2; at W=2
    each rank's shard of 5 ends in a batch of 1: the ranks raise, one process and a one-rank DDP world do not, and the
    report names that batch's size against one process's sizes."""
    result = audited(M + "make_batch_norm_on_the_remainder", M + "make_ten_in_fours", stage="fit")
    assert {r["type"] for r in result.raised["world"] if r} == {"ValueError"}
    assert result.references["one_rank_ddp"] == {"raised": None}
    raised = result.references["raised_batches"]
    assert raised and {(b["stage"], b["size"]) for b in raised} == {("train", 1)}
    assert all(b["single_sizes"] == [2, 4] for b in raised)
    assert "a train batch of 1 sample(s), a size no train batch of the single process had (its: 2, 4)" in _text(result)


@pytest.mark.integration
def test_spawned_ranks_get_their_own_string_hash_secret_too():
    """With ``start_method="spawn"`` (fresh interpreters, nccl's default) each rank starts with its seed's
    ``PYTHONHASHSEED`` in its environment, so its ``set`` order is that of a fresh interpreter with that seed."""
    from ddpprobe.launch import run_world
    from tests.support.process_traits import process_traits, set_order_under

    ranks = [r.record for r in run_world(process_traits, 2, hash_seeds=["1", "2"], start_method="spawn")]
    assert [r["set_order"] for r in ranks] == [set_order_under("1"), set_order_under("2")]
    assert ranks[0]["hash"] != ranks[1]["hash"]


def test_an_attribute_prepare_data_sets_and_setup_sets_again_on_every_rank_is_no_break():
    """Silent where it must be: the contract's ``setup`` record is taken in the callbacks' ``setup``, before the
    module's own ``setup`` sets ``num_classes`` on every rank, so the difference there is no break; the key is the
    same 2 everywhere."""
    result = audited(M + "make_sets_in_prepare_data_and_setup", M + "make_f1_8")
    assert [b["field"] for b in result.contract["breaks"]] == []
    assert result.row("val_classes").per_rank == pytest.approx([2.0, 2.0]) and result.exit_code == 0

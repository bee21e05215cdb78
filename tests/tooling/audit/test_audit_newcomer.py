"""The audit on a module a new user wrote from the README (tests/support/newcomer_modules.py), at W=2: each
cause it prints is proven by the run's records and each fix is a registry entry's (ddpprobe/hazards/) whose
preconditions hold.

The module logs ``val_acc_batch`` with ``sync_dist=False`` from ``validation_step``, computes ``val_f1`` by
hand in ``on_validation_epoch_end`` from lists each rank filled with its own outputs, runs 101 validation
samples (``DistributedSampler`` repeats one at W=2), and in ``on_train_epoch_end`` reads
``trainer.callback_metrics`` and calls ``trainer.strategy.reduce`` on rank 0 only. Its variants move the reduce
out of the branch (fix1: the read stays on rank 0) or use torchmetrics objects, reading and reducing on every
rank (fix2). The facts: tests/facts/test_epoch_end_outputs.py (values collected in a step hook are rank-local
at epoch end), tests/facts/test_hidden_collectives_metrics_properties.py (a read on rank 0 only runs the epoch
sync there, and the other ranks' next collective pairs with it; reading on every rank first keeps them paired),
tests/facts/test_sharding.py (the sampler's padding).
"""

import pytest

from ddpprobe import hazards
from ddpprobe.audit import RANK_DIVERGENT
from ddpprobe.audit.causes._kinds import TRAINED_APART_LOCAL
from tests.support.audit_runs import audited

pytestmark = pytest.mark.not_a_fact("tests the audit's explanations, not a fact about DDP")

M = "tests.support.newcomer_modules"
TIMEOUT = 60.0


def _audit(model: str, data: str, stage: str):
    return audited(f"{M}:{model}", f"{M}:{data}", world_size=2, stage=stage, timeout=TIMEOUT)


def _text(result) -> str:
    return " ".join(result.format().split())


def _fix(name: str) -> str:
    return " ".join(hazards.fix_line(name).split())


def test_a_key_logged_without_sync_and_no_collective_is_never_called_synced_when_the_ranks_agree():
    """fit of ``MyClassifier``: ``val_acc_batch`` (``sync_dist=False``, no collective of the module's own in
    ``validation_step``) holds the same value on both ranks of this run; the audit calls it rank-local, equal
    by chance, and the word "synced" is not its verdict."""
    result = _audit("make_model", "make_data", "fit")
    row = result.row("val_acc_batch")
    assert row.per_rank[0] == row.per_rank[1], row
    assert row.verdict == TRAINED_APART_LOCAL and not row.verdict.startswith("synced"), row
    assert "equal by chance" in row.cause and "every rank holds the same value" not in row.cause, row.cause


def test_a_value_computed_at_validation_epoch_end_from_rank_local_lists_gets_its_fix_in_fit():
    """fit of ``MyClassifier`` (no single-process run on the W=2 weights: the fit did not finish):
    ``val_f1`` is named ``epoch_end_rank_local`` (computed in ``on_validation_epoch_end``, in which no rank ran
    a collective) and its fix line, the torchmetrics Metric, is printed; "No proven fix applies" is not printed
    for it."""
    result = _audit("make_model", "make_data", "fit")
    row = result.row("val_f1")
    assert row.verdict == RANK_DIVERGENT and row.hazards == ["epoch_end_rank_local"], row
    assert row.fixes == ["epoch_end_rank_local"], row
    text = _text(result)
    assert _fix("epoch_end_rank_local") in text, text
    assert "no registry entry's evidence holds for this key" not in text, text


def test_padding_and_a_rank_local_value_print_both_causes_and_both_fixes_without_the_candidates_noise():
    """validate of ``MyClassifier`` at N=101: ``val_f1`` is named both ``repeated_samples`` (one sample ran
    twice) and ``epoch_end_rank_local``, ``val_acc_batch`` both ``repeated_samples`` and
    ``step_mean_rank_local`` (``sync_dist=False`` in ``validation_step``, no collective there), each with both
    fix lines; the report holds no "Candidates" and no "nothing recorded"."""
    result = _audit("make_model", "make_data", "validate")
    for key, local in (("val_f1", "epoch_end_rank_local"), ("val_acc_batch", "step_mean_rank_local")):
        row = result.row(key)
        assert row.hazards == ["repeated_samples", local] and row.fixes == ["repeated_samples", local], row
    text = _text(result)
    for name in ("repeated_samples", "epoch_end_rank_local", "step_mean_rank_local"):
        assert _fix(name) in text, (name, text)
    assert "Candidates" not in text and "nothing recorded" not in text, text


def test_a_read_on_rank_zero_paired_with_the_other_ranks_reduce_names_the_read_and_its_fix():
    """fit of fix1 (``strategy.reduce`` on every rank, the read of ``trainer.callback_metrics`` on rank 0
    only): the divergence is diagnosed as ``metrics_read_on_some_ranks`` with the read-on-every-rank fix, not
    "No proven fix applies"; fix2, which applies that fix, finishes on every rank with no divergence."""
    fix1 = _audit("make_model_fix1", "make_data", "fit")
    diagnosis = fix1.trace["first_divergence"]["diagnosis"]
    assert diagnosis["hazard"] == "metrics_read_on_some_ranks", diagnosis
    assert diagnosis["fixes"] == ["metrics_read_on_some_ranks"], diagnosis
    text = _text(fix1)
    assert "no registry entry's evidence holds for this divergence" not in text, text
    assert _fix("metrics_read_on_some_ranks") in text, text
    fix2 = _audit("make_model_fix2", "make_data", "fit")
    assert fix2.world_error is None and fix2.trace.get("first_divergence") is None, _text(fix2)
    assert all(r is None for r in fix2.raised["world"]), fix2.raised

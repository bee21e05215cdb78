"""The audit on the original question's own metric (issue 20): per-label F1, precision and recall at the
threshold that gives the best F1, computed in ``on_validation_epoch_end`` from rank-local outputs and
written to ``self.logger.experiment`` (examples/multilabel_original_module.py), and its correction
(examples/multilabel_corrected_module.py: all_gather with sample ids, duplicates dropped, ``self.log``).
Expected numbers come from scikit-learn's ``precision_recall_curve`` on each rank's shard and on the
whole set (the facts behind them: tests/facts/test_multilabel_best_threshold_f1.py)."""

import pytest

from ddpprobe import audit as ddp_audit
from ddpprobe.probes.multilabel import NUM_LABELS
from examples import multilabel_original_module as original
from tests.support import oracle
from tests.support.audit_runs import audited

pytestmark = pytest.mark.not_a_fact("tests the audit command, not a fact about DDP")


def _audit(module: str, backend: str):
    return audited(f"examples.{module}:make_model", f"examples.{module}:make_data", world_size=2, backend=backend)


def _metrics(ids) -> dict:
    """``{"val_<name>_<k>": value}``: best-threshold F1/precision/recall per label on the samples ``ids``, from
    the independent oracle (``oracle.best_threshold_scores``), not from the module under audit."""
    out = {}
    for k in range(NUM_LABELS):
        best = oracle.best_threshold_scores(list(ids), k)
        out.update({f"val_{name}_{k}": best[name] for name in ("f1", "precision", "recall")})
    return out


def test_the_original_multilabel_module_is_flagged_each_rank_writing_its_own_shards_best_threshold_scores(backend):
    """Each rank's ``add_scalar`` values are scikit-learn's best-threshold scores on that rank's padded shard
    (W=2, N=11), the single process writes those of the whole set; every value is flagged (rank-divergent,
    or rank-local where the two shards happen to agree), the cause says no rank ran a collective in
    ``on_validation_epoch_end``, and the fix names the gather-and-de-duplicate fact."""
    n, world_size = original.N_SAMPLES, 2
    result = _audit("multilabel_original_module", backend)

    shards = [_metrics(oracle.shard(n, world_size, r)) for r in range(world_size)]
    whole = _metrics(range(n))
    oracle.assert_distinct(
        rank0_f1_0=shards[0]["val_f1_0"], rank1_f1_0=shards[1]["val_f1_0"], whole_f1_0=whole["val_f1_0"]
    )
    rows = {row["tag"]: row for row in result.experiment_rows}
    assert sorted(rows) == sorted(whole)
    assert any(abs(shards[0][tag] - shards[1][tag]) > 1e-6 for tag in whole), "some shards must disagree"
    for tag, row in rows.items():
        assert row["per_rank"] == pytest.approx([s[tag] for s in shards], abs=1e-6), (
            oracle.side_by_side(tag, row["per_rank"]) + f"  expected {[s[tag] for s in shards]}"
        )
        assert row["single"] == pytest.approx(whole[tag], abs=1e-6)
        assert row["hook"] == "on_validation_epoch_end" and row["problem"]
        if abs(shards[0][tag] - shards[1][tag]) > 1e-6:  # the shards' values differ: each rank wrote its own
            assert row["verdict"] == ddp_audit.EXPERIMENT_DIVERGENT, row
            assert "no rank ran a collective in on_validation_epoch_end" in row["cause"], row
        else:  # the shards happen to agree: still rank-local, written from the same outputs
            assert row["verdict"] == ddp_audit.EXPERIMENT_LOCAL, row
            assert "from the same rank-local outputs" in row["cause"], row
        assert "experiment_rank_local" in row["fixes"], row
    assert result.stdout_lines["world"] == [NUM_LABELS] * world_size and result.exit_code == 1


def test_the_corrected_multilabel_module_passes_with_the_whole_sets_scores_on_every_rank(backend):
    """The corrected module gathers scores, labels and ids, drops the padding duplicate and logs with
    ``self.log``: every key equals scikit-learn on the 11 samples on both ranks and at W=1, the note
    names its all_gather, it prints once, and the audit passes (exit code 0)."""
    n, world_size = original.N_SAMPLES, 2
    result = _audit("multilabel_corrected_module", backend)

    whole = _metrics(range(n))
    padded = _metrics(oracle.padded_indices(n, world_size))
    assert any(abs(whole[k] - padded[k]) > 1e-6 for k in whole), "the padding must change some score"
    assert sorted(row.key for row in result.rows) == sorted(whole)
    for row in result.rows:
        assert row.verdict == ddp_audit.SYNCED_EQUAL, row
        assert [row.single, *row.per_rank] == pytest.approx([whole[row.key]] * (world_size + 1), abs=1e-6)
        assert "all_gather" in row.cause, row.cause
    assert result.stdout_lines["world"] == [NUM_LABELS, 0] and result.exit_code == 0, result.format()

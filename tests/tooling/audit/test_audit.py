"""Auditing your own LightningModule: ``ddpprobe audit`` runs it at W=1 and W=N and says which logged
values are rank-local, padded or wrong.

The audit (ddpprobe/audit/) records every ``self.log`` call in each rank with its hook and options,
the final ``callback_metrics``, the stdout lines, the removed 1.x hooks the module defines and the
dataset size, and gives each logged key a verdict. These facts run it on the two example modules of
``examples/`` (the seed question's F1 module and its correction) and on small modules defined here,
and check each verdict against values computed from the data with scikit-learn and ``tests/support/oracle.py``:
the seed's F1 differs between ranks *because* each rank's shard has a different F1.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from sklearn.metrics import f1_score, precision_score, recall_score
from torch.utils.data import DataLoader

from ddpprobe import audit as ddp_audit
from ddpprobe._lightning import pl
from ddpprobe.audit import AuditInputError, audit
from ddpprobe.probes.data import IdDataset
from examples import corrected_f1_module as corrected, seed_f1_module as seed
from tests.support import oracle
from tests.support.audit_runs import audited
from tests.support.worlds import skip_unless_runnable

pytestmark = pytest.mark.not_a_fact("tests the audit command, not a fact about DDP")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _f1(ids) -> float:
    return f1_score(oracle.targets(ids), oracle.preds(ids), zero_division=0)


def _batch_weighted_mean_f1(n: int, world_size: int, batch_size: int) -> float:
    """Each batch's F1 weighted by its size, averaged over every batch of every rank: what a per-batch
    F1 logged with ``sync_dist=True`` gives (pytorch_lightning ``_ResultMetric.compute``)."""
    scores = [
        (_f1(b), len(b)) for r in range(world_size) for b in oracle.batches(oracle.shard(n, world_size, r), batch_size)
    ]
    return sum(s * w for s, w in scores) / sum(w for _, w in scores)


def _audit(model_ref: str, data_ref: str, world_size: int, backend: str):
    """One audit per (module, data, W, backend) for the whole test process: each costs two worlds."""
    return audited(model_ref, data_ref, world_size=world_size, backend=backend)


def _seed_audit(world_size, backend):
    skip_unless_runnable(backend, world_size)
    return _audit("examples.seed_f1_module:make_model", "examples.seed_f1_module:make_data", world_size, backend)


def _corrected_audit(world_size, backend, data="examples.corrected_f1_module:make_data"):
    skip_unless_runnable(backend, world_size)
    return _audit("examples.corrected_f1_module:make_model", data, world_size, backend)


# --- small modules and data for the facts below (imported by name in the ranks) --------------------


def make_data_11() -> DataLoader:
    """``IdDataset(11)`` in batches of 3: 11 does not divide by 2, so DistributedSampler pads."""
    return DataLoader(IdDataset(11), batch_size=3)


class _WithValidationEpochEnd(corrected.CorrectedF1Module):
    def validation_epoch_end(self, outputs):  # removed in Lightning 2.0
        pass


def make_model_with_validation_epoch_end():
    return _WithValidationEpochEnd()


class _LogsOnRankZeroOnly(pl.LightningModule):
    """Logs ``everywhere`` on every rank and ``only_rank_0`` under ``if self.global_rank == 0``."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def validation_step(self, batch, batch_idx):
        value = batch["value"].mean()
        self.log("everywhere", value, sync_dist=True, batch_size=len(batch["id"]))
        if self.global_rank == 0:
            self.log("only_rank_0", value, batch_size=len(batch["id"]))


class _IdDataModule(pl.LightningDataModule):
    def val_dataloader(self):
        return DataLoader(IdDataset(8), batch_size=2)


def make_model_logging_on_rank_zero_only():
    return _LogsOnRankZeroOnly()


def make_datamodule_8():
    return _IdDataModule()


def make_not_a_module():
    return torch.nn.Linear(2, 1)


# --- the seed question's module --------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_seed_module_f1_logged_without_sync_dist_is_rank_divergent_each_rank_holding_its_shards_f1(backend, world_size):
    """``self.log("val_f1", f1)`` in ``on_validation_epoch_end``, f1 computed from the rank's own
    outputs: each rank's value is scikit-learn's F1 on that rank's shard, the single-process value is
    the F1 of the whole set, and the audit calls it rank-divergent (a problem: exit code 1)."""
    n = seed.N_SAMPLES
    result = _seed_audit(world_size, backend)

    local = [_f1(oracle.shard(n, world_size, r)) for r in range(world_size)]
    oracle.assert_distinct(**{f"rank{r}_shard": v for r, v in enumerate(local)})
    row = result.row("val_f1")
    assert row.per_rank == pytest.approx(local, abs=1e-6), (
        oracle.side_by_side("val_f1", row.per_rank) + f"  expected per-shard F1 {local}"
    )
    assert row.single == pytest.approx(_f1(range(n)), abs=1e-6)
    assert (row.verdict, row.sync_dist, row.on_epoch, row.hooks) == (
        ddp_audit.RANK_DIVERGENT,
        False,
        True,
        ["on_validation_epoch_end"],
    )
    assert row.problem and result.exit_code == 1


@pytest.mark.parametrize("world_size", [2, 3])
def test_seed_module_batch_f1_with_sync_dist_is_synced_but_differs_from_single_process_non_decomposable(
    backend, world_size
):
    """``val_f1_batch`` (F1 of each batch, ``sync_dist=True``): every rank holds the batch-size-weighted
    mean of all ranks' batch F1s, the single process the mean of its own batches' F1s; N=12 divides by
    W, so there is no padding and the audit names the non-decomposable average as the cause."""
    n, batch_size = seed.N_SAMPLES, seed.BATCH_SIZE
    result = _seed_audit(world_size, backend)

    distributed, single = (
        _batch_weighted_mean_f1(n, world_size, batch_size),
        _batch_weighted_mean_f1(n, 1, batch_size),
    )
    oracle.assert_distinct(mean_of_batch_f1_at_w=distributed, mean_of_batch_f1_at_1=single, f1_of_set=_f1(range(n)))
    row = result.row("val_f1_batch")
    assert row.per_rank == pytest.approx([distributed] * world_size, abs=1e-6), (
        oracle.side_by_side("val_f1_batch", row.per_rank) + f"  expected {distributed}"
    )
    assert row.single == pytest.approx(single, abs=1e-6)
    assert row.verdict == ddp_audit.SYNCED_DIFFERS and row.sync_dist and row.problem
    assert "non-decomposable" in row.cause and "repeated samples" not in row.cause, row.cause
    assert result.loaders["val"] == {
        "dataset_size": n,
        "per_rank": n // world_size,
        "padding_duplicates": 0,
        "sampler": "DistributedSampler",
    }
    assert result.counts["val"]["samples"] == [n // world_size] * world_size and result.counts["val"]["duplicates"] == 0


@pytest.mark.parametrize("world_size", [2, 3])
def test_seed_module_prints_once_per_rank_and_its_experiment_writes_reach_the_logger_from_rank_0_only(
    backend, world_size
):
    """The seed's ``print`` in ``on_validation_epoch_end`` writes one stdout line on every rank (one
    epoch); its ``self.logger.experiment.add_scalar`` is recorded once, with rank 0's shard F1, because
    every other rank's experiment is a no-op; Lightning's logger also gets rank 0's ``val_f1``."""
    n = seed.N_SAMPLES
    result = _seed_audit(world_size, backend)

    assert result.stdout_lines == {"single": [1], "world": [1] * world_size}, result.stdout_lines
    rank0 = _f1(oracle.shard(n, world_size, 0))
    assert [(c["method"], c["args"][0]) for c in result.experiment_calls] == [("add_scalar", "val_f1_epoch")]
    assert result.experiment_calls[0]["args"][1] == pytest.approx(rank0, abs=1e-6)
    logged = [m["metrics"]["val_f1"] for m in result.logger_metrics if "val_f1" in m["metrics"]]
    assert logged == pytest.approx([rank0], abs=1e-6)


def test_seed_module_defines_validation_step_end_which_is_listed_as_silently_ignored(backend):
    """``validation_step_end`` (removed in Lightning 2.0, PR #16791) is listed; the stage still runs."""
    result = _seed_audit(2, backend)

    assert [h["hook"] for h in result.removed_hooks] == ["validation_step_end"]
    assert "silently never called" in result.removed_hooks[0]["effect"]
    assert result.raised == {"single": None, "world": [None, None]}


# --- the corrected module --------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_corrected_module_with_metric_objects_passes_every_rank_holding_the_f1_of_the_whole_set(backend, world_size):
    """torchmetrics ``BinaryF1Score``/``BinaryPrecision``/``BinaryRecall`` passed to ``self.log``:
    every key is "synced, equals single-process" with scikit-learn's value on the N=12 samples, no
    problem (exit code 0), and ``self.print`` writes on rank 0 only."""
    n = corrected.N_SAMPLES
    result = _corrected_audit(world_size, backend)

    ids = range(n)
    expected = {
        "val_f1": _f1(ids),
        "val_precision": precision_score(oracle.targets(ids), oracle.preds(ids), zero_division=0),
        "val_recall": recall_score(oracle.targets(ids), oracle.preds(ids), zero_division=0),
    }
    oracle.assert_distinct(**expected)
    assert [row.key for row in result.rows] == list(expected)
    for row in result.rows:
        assert row.verdict == ddp_audit.SYNCED_EQUAL and row.metric_object, row
        assert [row.single, *row.per_rank] == pytest.approx([expected[row.key]] * (world_size + 1), abs=1e-6), (
            oracle.side_by_side(row.key, row.per_rank) + f"  W=1 {row.single}  expected {expected[row.key]}"
        )
    assert result.exit_code == 0 and result.problems == []
    assert result.stdout_lines == {"single": [1], "world": [1] + [0] * (world_size - 1)}
    assert result.removed_hooks == [] and result.experiment_calls == []


def test_corrected_module_on_a_set_that_does_not_divide_by_w_is_flagged_for_sampler_padding(backend):
    """The same metric objects on N=11 at W=2: ``DistributedSampler`` repeats ceil(11/2)*2 - 11 = 1
    sample, the summed counts include it, so every rank holds scikit-learn's score on the padded list,
    not on the 11 samples; the audit says "differs from single-process" for each key and names the padding, and as one
    process running the padded list gives the same scores, the repeats are the whole difference: exit code 3
    (documented DDP semantics), not the exit code 1 of a bug."""
    n, world_size = 11, 2
    result = _corrected_audit(world_size, backend, data="tests.tooling.audit.test_audit:make_data_11")

    duplicates = sum(oracle.duplicates(n, world_size).values())
    padded_ids, ids = oracle.padded_indices(n, world_size), range(n)
    for key, score in (("val_f1", f1_score), ("val_precision", precision_score), ("val_recall", recall_score)):
        padded = score(oracle.targets(padded_ids), oracle.preds(padded_ids), zero_division=0)
        single = score(oracle.targets(ids), oracle.preds(ids), zero_division=0)
        oracle.assert_distinct(**{f"{key}_padded": padded, f"{key}_single_process": single})
        row = result.row(key)
        assert row.per_rank == pytest.approx([padded] * world_size, abs=1e-6), (
            oracle.side_by_side(key, row.per_rank) + f"  expected padded {padded}, single-process {single}"
        )
        assert row.single == pytest.approx(single, abs=1e-6)
        assert row.verdict == ddp_audit.SYNCED_DIFFERS and row.problem
        assert row.cause.startswith(
            f"repeated samples: the ranks ran {n + duplicates} samples, {duplicates} of them repeats"
        ), row.cause
        assert "non-decomposable" not in row.cause and "DistributedSampler pads" in row.cause, row.cause
    assert result.loaders["val"]["padding_duplicates"] == duplicates
    assert result.counts["val"]["duplicated"] == {str(i): c + 1 for i, c in oracle.duplicates(n, world_size).items()}
    assert all(result.row(key).padding_only for key in ("val_f1", "val_precision", "val_recall"))
    assert result.exit_code == 3


# --- other hazards -------------------------------------------------------------------------------


def test_a_module_defining_validation_epoch_end_is_listed_and_the_stage_raises_on_every_rank(backend):
    """``validation_epoch_end`` (removed in Lightning 2.0, PR #16520): listed as raising, and
    ``trainer.validate`` raised ``NotImplementedError`` on every rank and at W=1, so the audit fails."""
    skip_unless_runnable(backend, 2)
    result = audited(
        f"{__name__}:make_model_with_validation_epoch_end", "examples.corrected_f1_module:make_data", backend=backend
    )

    assert [h["hook"] for h in result.removed_hooks] == ["validation_epoch_end"]
    assert "raises NotImplementedError" in result.removed_hooks[0]["effect"]
    raised = [result.raised["single"], *result.raised["world"]]
    assert [r and r["type"] for r in raised] == ["NotImplementedError"] * 3, raised
    assert result.rows == [] and result.exit_code == 1


def test_a_key_logged_on_rank_0_only_is_flagged_as_a_collective_mismatch_hazard(backend):
    """``if self.global_rank == 0: self.log("only_rank_0", ...)`` (data from a LightningDataModule):
    the audit sees the call on rank 0 only and flags it; ``everywhere`` (sync_dist) is fine: 8 samples
    divide by 2, and a batch-size-weighted mean of per-sample values does not depend on the batching."""
    skip_unless_runnable(backend, 2)
    result = audited(
        f"{__name__}:make_model_logging_on_rank_zero_only", f"{__name__}:make_datamodule_8", 2, backend=backend
    )

    row = result.row("only_rank_0")
    assert (row.verdict, row.logged_on, row.problem) == (ddp_audit.SOME_RANKS_ONLY, [0], True)
    everywhere = result.row("everywhere")
    assert everywhere.verdict == ddp_audit.SYNCED_EQUAL
    assert everywhere.single == pytest.approx(oracle.mean(oracle.values(range(8))))


def test_bad_input_is_reported_before_or_instead_of_running_with_the_bad_value_named():
    """A factory that cannot be imported, a lambda, and a factory returning a ``torch.nn.Linear``
    each raise ``AuditInputError`` naming the value and the fix."""
    with pytest.raises(AuditInputError, match=r"cannot import the model factory 'examples\.missing:make_model'"):
        audit("examples.missing:make_model", "examples.seed_f1_module:make_data")
    with pytest.raises(AuditInputError, match=r"cannot be imported by name.*top level"):
        audit(lambda: None, "examples.seed_f1_module:make_data")
    with pytest.raises(
        AuditInputError,
        match=r"returned torch\.nn\.modules\.linear\.Linear.*not a "
        r"LightningModule",
    ):
        audit(make_not_a_module, "examples.seed_f1_module:make_data")  # gloo: runs on any machine


# --- the command line: in this process through ddpprobe.__main__.main, and once as a real -----------
# --- `python -m ddpprobe` subprocess (a fresh interpreter costs a few seconds) ------------------------


def _main(capsys, *args):
    """Run the command line's ``main`` here; return (exit code, stdout, stderr)."""
    from ddpprobe.__main__ import main

    code = main(["audit", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "ddpprobe", "audit", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.integration
def test_cli_exits_1_on_the_seed_module_and_its_json_holds_the_verdicts(backend, capsys):
    """``ddpprobe audit examples.seed_f1_module:make_model --data ... --json`` exits 1 and its JSON lists
    val_f1 as rank-divergent and val_f1_batch as differing from single-process."""
    skip_unless_runnable(backend, 2)
    code, out, err = _main(
        capsys,
        "examples.seed_f1_module:make_model",
        "--data",
        "examples.seed_f1_module:make_data",
        "--world-size",
        "2",
        "--backend",
        backend,
        "--json",
    )

    assert code == 1, err
    report = json.loads(out)
    verdicts = {row["key"]: row["verdict"] for row in report["rows"]}
    assert verdicts == {"val_f1_batch": ddp_audit.SYNCED_DIFFERS, "val_f1": ddp_audit.RANK_DIVERGENT}
    assert report["exit_code"] == 1 and report["stdout_lines"]["world"] == [1, 1]


@pytest.mark.integration
def test_cli_exits_0_on_the_corrected_module(backend, capsys):
    """The corrected module (N=12, W=2): exit code 0 and the table says so."""
    skip_unless_runnable(backend, 2)
    code, out, err = _main(
        capsys,
        "examples.corrected_f1_module:make_model",
        "--data",
        "examples.corrected_f1_module:make_data",
        "--backend",
        backend,
    )

    assert code == 0, out + err
    assert "synced, equals single-process" in out and "no problems found, exit code 0" in out


@pytest.mark.integration
def test_cli_exits_2_on_an_unimportable_factory_naming_it():
    """``python -m ddpprobe audit`` with a factory that does not exist: exit code 2 and a message naming
    it, on stderr."""
    proc = _cli("examples.seed_f1_module:no_such_factory", "--data", "examples.seed_f1_module:make_data")

    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot import the model factory 'examples.seed_f1_module:no_such_factory'" in proc.stderr
    assert "AttributeError" in proc.stderr and proc.stdout == ""

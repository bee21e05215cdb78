"""A key nothing synced (no ``sync_dist=True``, not a Metric, no collective of the module's own in its hook)
is never called "synced", whatever its values, at W=2 in validate: the same constant in every batch is said
to be rank-local and the same on every rank (not equal by chance); a per-batch value whose ranks happen to
agree is rank-local and agrees by chance, equal to single-process or not. A key logged with
``sync_dist=True`` keeps its synced verdict. The module is this file's own (8 samples, batches of 2: W=1
runs 4 batches, each rank of W=2 runs 2).
"""

import functools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ddpprobe._lightning import pl
from ddpprobe.audit import SYNCED_EQUAL
from ddpprobe.audit.causes._kinds import PROBLEMS, RANK_LOCAL_AGREE, RANK_LOCAL_DIFFERS, RANK_LOCAL_SAME
from tests.support.audit_runs import audited

pytestmark = pytest.mark.not_a_fact("tests the audit's verdicts, not a fact about DDP")

HERE = "tests.tooling.audit.test_audit_rank_local_verdicts"


class Unsynced(pl.LightningModule):
    """``const``: 0.5 in every batch; ``alt``: +1, -1 by batch (epoch mean 0 at W=1 and on each rank);
    ``batch``: the batch index (mean 1.5 at W=1, 0.5 on each rank); ``maxx``: the largest sample, synced
    with ``reduce_fx="max"`` (7 at W=1 and on every rank)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        self.log("const", 0.5)
        self.log("alt", float((-1) ** batch_idx))
        self.log("batch", float(batch_idx))
        self.log("maxx", x.max(), reduce_fx="max", sync_dist=True)


def make_model():
    return Unsynced()


def make_data():
    return DataLoader(TensorDataset(torch.arange(8.0).unsqueeze(1)), batch_size=2)


@functools.lru_cache(maxsize=None)
def _rows():
    result = audited(f"{HERE}:make_model", f"{HERE}:make_data", world_size=2, stage="validate", timeout=60.0)
    return {row.key: row for row in result.rows if row.level == "epoch"}


def test_an_unsynced_constant_is_rank_local_and_the_same_on_every_rank_not_synced_nor_by_chance():
    row = _rows()["const"]
    assert (row.single, row.per_rank) == (0.5, [0.5, 0.5]), row
    assert row.verdict == RANK_LOCAL_SAME and "synced" not in row.verdict, row
    assert "chance" not in row.cause and "0.5 in every batch" in row.cause, row.cause
    assert not row.problem, row


def test_an_unsynced_per_batch_value_whose_ranks_agree_with_single_process_is_rank_local_by_chance():
    row = _rows()["alt"]
    assert (row.single, row.per_rank) == (0.0, [0.0, 0.0]), row
    assert row.verdict == RANK_LOCAL_AGREE and not row.verdict.startswith("synced"), row


def test_an_unsynced_value_whose_ranks_agree_but_differ_from_single_process_is_a_rank_local_problem():
    row = _rows()["batch"]
    assert (row.single, row.per_rank) == (1.5, [0.5, 0.5]), row
    assert row.verdict == RANK_LOCAL_DIFFERS and RANK_LOCAL_DIFFERS in PROBLEMS and row.problem, row
    assert not row.verdict.startswith("synced"), row


def test_a_key_logged_with_sync_dist_keeps_its_synced_verdict():
    row = _rows()["maxx"]
    assert (row.single, row.per_rank, row.verdict) == (7.0, [7.0, 7.0], SYNCED_EQUAL), row

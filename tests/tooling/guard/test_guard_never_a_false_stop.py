"""``CollectiveGuard()`` with every check on never stops a correct run, even one that looks suspicious to a guard
comparing the ranks: a random augmentation drawn from the global generators after ``seed_everything``, one drawn
from generators seeded per rank, a file name holding the rank, values logged without ``sync_dist`` (each rank its
own), logging from rank 0 only (``rank_zero_only=True``, ``@rank_zero_only``), and ``EarlyStopping`` and
``ModelCheckpoint`` on a synced key.

Each scenario runs at W = 2 without the guard and with it, and gives the same record with it: every augmented
sample the steps saw, the global generators' states after the fit (and the dataset's own), every logged value
(``callback_metrics``, ``logged_metrics``, the CSV logger's file), the file each rank wrote, the weights and how far
the default process group's sequence number moved (``pg_seq``). So the guard raised nothing, drew no random
number, read no item of a dataset (an item read draws the augmentation's noise: the samples would move), and added
no collective. Each test also checks that the scenario did the suspicious thing its name says, so a scenario that
stopped early or drew nothing cannot pass. Scenarios: tests/support/guard_suspicious.py.

Each is a live claim (a real world, unchanged by the guard), two worlds a test: in the integration run
(``pytest -m integration``); test_guard_twins.py keeps one such pair in the default run.
"""

import pytest

from tests.support import guard_suspicious, oracle
from tests.tooling.guard.test_guard_breaking import _twins

W = 2
#: Batches of 2 per rank and epoch: 8 samples per rank.
BATCHES = 8 // 2


def _augmented(seen: list) -> bool:
    """Every sample is its index plus noise (a draw happened): none is a whole number."""
    return bool(seen) and all(v != int(v) for v in seen)


@pytest.mark.integration
def test_an_augmentation_from_the_global_generators_after_seed_everything_runs_the_same_with_every_check(run_world):
    """``seed_everything(0)``, then noise from torch's, NumPy's and ``random``'s global generators at every read:
    the same samples, the same generator states after the fit, with the guard as without it."""
    without = _twins(run_world, guard_suspicious.run, W, kind="global_augmentation")
    assert all(_augmented(r["seen"]) and len(r["seen"]) == 2 * 8 for r in without), [r["seen"] for r in without]


@pytest.mark.integration
def test_an_augmentation_from_generators_seeded_per_rank_runs_the_same_with_every_check(run_world):
    """The dataset holds a ``torch.Generator``, a NumPy ``Generator`` and a ``random.Random`` seeded with the rank:
    the datasets' state differs between the ranks only in those generators, which the state check leaves out."""
    without = _twins(run_world, guard_suspicious.run, W, kind="rank_generator")
    assert all(_augmented(r["seen"]) for r in without), [r["seen"] for r in without]
    assert without[0]["random_after"] != without[1]["random_after"], oracle.side_by_side(
        "random_after", [r["random_after"] for r in without]
    )


@pytest.mark.integration
def test_a_file_name_holding_the_rank_runs_the_same_with_every_check(run_world):
    """``self.predictions_path = f".../predictions_rank{self.global_rank}.csv"`` in ``setup`` (a module attribute
    that differs between the ranks only by the rank's number in it), each rank writing its own file."""
    without = _twins(run_world, guard_suspicious.run, W, kind="rank_files")
    files = [r["own_file"] for r in without]
    assert [name for name, _ in files] == ["predictions_rank0.csv", "predictions_rank1.csv"], files
    assert files[0][1] != files[1][1], files
    assert all(len(text.splitlines()) == 2 * 4 for _, text in files), files  # 2 epochs of 4 samples a rank


@pytest.mark.integration
def test_values_logged_without_sync_dist_run_the_same_with_every_check(run_world):
    """The rank's own loss (step and epoch) and its rank, logged without ``sync_dist``: each rank keeps its own
    value, as without the guard."""
    without = _twins(run_world, guard_suspicious.run, W, kind="rank_local_logs")
    metrics = [r["callback_metrics"] for r in without]
    assert [m["rank"] for m in metrics] == [0.0, 1.0], oracle.side_by_side("rank", metrics)
    assert metrics[0]["rank_train_loss_epoch"] != metrics[1]["rank_train_loss_epoch"], oracle.side_by_side(
        "rank_train_loss_epoch", metrics
    )


@pytest.mark.integration
def test_logging_from_rank_0_only_runs_the_same_with_every_check(run_world):
    """``self.log("rank_0_val_loss", ..., rank_zero_only=True)`` under ``if self.global_rank == 0`` and a
    ``@rank_zero_only`` function logging to the CSV logger's experiment: rank 0 alone holds the key, the logger's
    file holds the noted epochs."""
    without = _twins(run_world, guard_suspicious.run, W, kind="rank_zero_only_logging")
    assert ["rank_0_val_loss" in r["callback_metrics"] for r in without] == [True, False], without
    assert "noted_epoch" in without[0]["csv"], without[0]["csv"]


@pytest.mark.integration
def test_early_stopping_and_model_checkpoint_on_a_synced_key_run_the_same_with_every_check(run_world):
    """``val_loss`` (synced) grows every epoch: ``EarlyStopping(patience=0)`` stops after epoch 1 on every rank
    (2 epochs of 4 batches: 8 steps, not the 12 of ``max_epochs=3``), ``ModelCheckpoint(save_top_k=1)`` keeps
    epoch 0's checkpoint, the same path on every rank."""
    without = _twins(run_world, guard_suspicious.run, W, kind="synced_callbacks")
    assert [r["global_step"] for r in without] == [2 * BATCHES] * W, [r["global_step"] for r in without]
    expected = f"ckpt/epoch=0-step={BATCHES}.ckpt"
    assert [r["best_model"] for r in without] == [expected] * W, [r["best_model"] for r in without]


@pytest.mark.parametrize("kind", guard_suspicious.KINDS)
def test_every_scenario_is_one_of_the_kinds_above(kind):
    """The scenarios' kinds and this file's tests are the same list: a kind added without its test fails here."""
    import inspect
    import sys

    sources = inspect.getsource(sys.modules[__name__])
    assert f'kind="{kind}"' in sources, kind

"""Where a value given to ``self.log`` lands on each rank: ``trainer.callback_metrics``,
``trainer.logged_metrics``, ``trainer.progress_bar_metrics``, the list ``trainer.validate()`` /
``trainer.test()`` return, and the results table printed at the end.

The options route it (``_ResultCollection.metrics``): every epoch-level value goes to
``callback_metrics`` (what callbacks such as ``ModelCheckpoint`` and ``EarlyStopping`` read);
``logger=True`` (the default) also puts it in ``logged_metrics``, which is also what ``validate()`` /
``test()`` return, one dict per dataloader (``_EvaluationLoop.on_run_end``); ``prog_bar=True`` also puts
it in ``progress_bar_metrics``. These dicts exist on every rank, each with that rank's own number
(identical only with ``sync_dist=True``), while the results table is printed by global rank 0 only
(``_EvaluationLoop.on_run_end``: ``if self.verbose and self.trainer.is_global_zero``).
Sources: pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultCollection.metrics``,
logger_connector.py ``update_eval_epoch_metrics``, pytorch_lightning/loops/evaluation_loop.py.
"""

import pytest

from ddpprobe.probes import log_spec, reductions
from tests.support import oracle

N, BATCH, WORLD_SIZE = 7, 2, 2

#: The keys logged, all with ``sync_dist=True`` except ``local``.
PLAN = [
    log_spec("plain", sync_dist=True),
    log_spec("bar", sync_dist=True, prog_bar=True),
    log_spec("hidden", sync_dist=True, logger=False),
    log_spec("bar_hidden", sync_dist=True, prog_bar=True, logger=False),
    log_spec("forked", sync_dist=True, on_step=True, on_epoch=True),
    log_spec("local"),
]

#: Which keys each place holds after ``validate()``/``test()`` (the facts below assert exactly these).
EXPECTED_KEYS = {
    "callback_metrics": {"plain", "bar", "hidden", "bar_hidden", "forked", "forked_epoch", "local"},
    "logged_metrics": {"plain", "bar", "forked_step", "forked_epoch", "local"},
    "progress_bar_metrics": {"bar", "bar_hidden"},
    "returned": {"plain", "bar", "forked_epoch", "local"},
}


def _expected_values():
    """``{key: [value on rank r, ...]}`` for every key of ``PLAN`` and its forks."""
    shards = oracle.rank_batches(N, WORLD_SIZE, BATCH)
    synced = oracle.mean(oracle.values(oracle.padded_indices(N, WORLD_SIZE)))
    local = [oracle.mean(oracle.values(i for b in rank for i in b)) for rank in shards]
    last_step = oracle.mean(oracle.mean(oracle.values(rank[-1])) for rank in shards)
    oracle.assert_distinct(synced=synced, last_step=last_step, rank0=local[0], rank1=local[1])
    values = {key: [synced] * WORLD_SIZE for key in ("plain", "bar", "hidden", "bar_hidden", "forked", "forked_epoch")}
    values["forked_step"] = [last_step] * WORLD_SIZE
    values["local"] = local
    return values


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_each_metrics_dict_holds_the_keys_its_log_options_route_there_on_every_rank(run_world, semantics, stage):
    """After ``trainer.validate()`` (and likewise ``trainer.test()``) on every rank:
    ``callback_metrics`` holds every epoch-level key (``logger=False`` ones too; for ``on_step=True,
    on_epoch=True`` the bare name and ``_epoch``, no ``_step`` outside training); ``logged_metrics`` holds
    the ``logger=True`` keys, with ``forked_step`` (the last step) and ``forked_epoch``;
    ``progress_bar_metrics`` holds the ``prog_bar=True`` keys (``logger=False`` or not); the returned list
    has one dict with the ``logger=True`` epoch-level keys. Each rank holds its own numbers: the
    ``sync_dist=False`` key ``local`` is that rank's mean, in every place, including what ``validate()``
    returns on that rank."""
    world = run_world(reductions.validate_then_test, WORLD_SIZE, n=N, batch_size=BATCH, plan=PLAN)

    expected = _expected_values()
    semantics.number(
        "rank 1's local in callback_metrics",
        world.records[1][stage]["callback_metrics"].get("local"),
        vs=("rank 0's", world.records[0][stage]["callback_metrics"].get("local")),
    )
    for rec in world.records:
        got = rec[stage]
        assert len(got["returned"]) == 1, got["returned"]
        places = {
            **{k: got[k] for k in ("callback_metrics", "logged_metrics", "progress_bar_metrics")},
            "returned": got["returned"][0],
        }
        rank = world.records.index(rec)
        for place, keys in EXPECTED_KEYS.items():
            assert set(places[place]) == keys, f"rank {rank} after {stage}(): {place} = {sorted(places[place])}"
            for key in keys:
                assert places[place][key] == pytest.approx(expected[key][rank], rel=1e-6), (
                    f"rank {rank} after {stage}(): {place}[{key!r}] = {places[place][key]}; "
                    + oracle.side_by_side("expected", expected[key])
                )


def test_the_results_table_is_printed_by_rank_0_only_with_rank_0s_numbers(run_world, semantics):
    """``verbose=True`` (the default of ``validate``/``test``) prints the "Validate metric" and "Test
    metric" tables to stdout on global rank 0 only; other ranks print nothing. The table lists the
    returned (``logger=True``, epoch-level) keys with rank 0's numbers, so a ``sync_dist=False`` value
    in it is rank 0's alone. Source: evaluation_loop.py ``on_run_end`` / ``_print_results``."""
    world = run_world(reductions.validate_then_test, WORLD_SIZE, n=N, batch_size=BATCH, plan=PLAN)

    expected = _expected_values()
    semantics.number(
        "ranks printing the tables",
        sum("Validate metric" in rank.stdout for rank in world),
        vs=("world size", WORLD_SIZE),
    )
    for header in ("Validate metric", "Test metric"):
        shown = [header in rank.stdout for rank in world]
        assert shown == [True] + [False] * (WORLD_SIZE - 1), oracle.side_by_side(f"prints {header!r}", shown)
    table = world[0].stdout
    for stage in ("validate", "test"):
        returned = world.records[0][stage]["returned"][0]
        assert returned["local"] == pytest.approx(expected["local"][0], rel=1e-6)
        for key, value in returned.items():
            assert key in table and str(value) in table, f"{key} = {value} missing from rank 0's table:\n{table}"
    for key in ("hidden", "bar_hidden", "forked_step"):
        assert key not in table, f"{key} (not a returned key) appears in the table:\n{table}"
    assert all(rank.stdout.strip() == "" for rank in world[1:]), [rank.stdout for rank in world[1:]]

"""``rank_zero_only`` before the Trainer exists: in processes whose launcher does not set ``RANK`` or
``LOCAL_RANK`` (a custom ``ClusterEnvironment`` that reads its own variables), ``rank_zero_only.rank`` is 0 in
*every* process until ``Trainer(...)`` is built, so a ``@rank_zero_only`` function or a logger call made before
it runs on every rank. ``Trainer(...)`` sets the true rank.

Why: lightning_fabric/utilities/rank_zero.py sets ``rank_zero_only.rank = _get_rank() or 0`` at import, and
``_get_rank`` reads only ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID`` and ``JSM_NAMESPACE_RANK``.
``Trainer.__init__`` asks the strategy for its ranks (pytorch_lightning/trainer/connectors/
accelerator_connector.py ``_lazy_init_strategy`` -> ``DDPStrategy.set_world_ranks``, pytorch_lightning/
strategies/ddp.py), which sets ``rank_zero_only.rank = self.global_rank`` from the ``ClusterEnvironment``.
``CSVLogger.log_metrics`` and ``save`` are ``@rank_zero_only`` (lightning_fabric/loggers/csv_logs.py).

The probe (ddpprobe/probes/rank_state.py ``rank_zero_only_before_the_trainer``) moves the launcher's rank
variables to ``PROBE_*`` names, runs Lightning's import-time lookup again in that environment, and builds the
Trainer with ``ProbeEnvironment``, a ``ClusterEnvironment`` that reads ``PROBE_RANK`` & co.
"""

import pytest

from ddpprobe.probes import rank_state
from tests.support import oracle

METRICS_CSV = "lightning_logs/version_0/metrics.csv"


@pytest.mark.parametrize("world_size", [2, 3])
def test_without_rank_in_the_environment_rank_zero_only_code_runs_on_every_rank_until_the_trainer_is_built(
    run_world, semantics, world_size
):
    """Before ``Trainer(...)``: ``rank_zero_only.rank == 0`` in every process, the ``@rank_zero_only``
    function runs in every process, and every rank's ``CSVLogger`` writes its own ``metrics.csv`` (holding
    that rank's ``x``). After ``Trainer(..., plugins=[ProbeEnvironment()])``: ``rank_zero_only.rank`` is the
    global rank and the function runs on rank 0 only. The Trainer joins the world (``trainer.global_rank``
    and ``world_size`` from the custom environment)."""
    world = run_world(rank_state.rank_zero_only_before_the_trainer, world_size)

    records = world.records
    ranks = list(range(world_size))
    oracle.assert_distinct(ranks_running_before=world_size, ranks_running_after=1)
    ran_before = [rec["ran_before"] for rec in records]
    semantics.number("ranks running @rank_zero_only before the Trainer", sum(ran_before), vs=("after", 1))
    assert [rec["env_rank"] for rec in records] == [None] * world_size
    assert [rec["rank_before"] for rec in records] == [0] * world_size, oracle.side_by_side("before", records)
    assert ran_before == [True] * world_size, oracle.side_by_side("ran before the Trainer", ran_before)
    assert [rec["rank_after"] for rec in records] == ranks, oracle.side_by_side("after", records)
    assert [rec["ran_after"] for rec in records] == [r == 0 for r in ranks], oracle.side_by_side("ran after", records)
    assert [(rec["global_rank"], rec["world_size"]) for rec in records] == [(r, world_size) for r in ranks]
    csv_x = [rank.files.get(METRICS_CSV, "").splitlines()[1:] for rank in world]
    assert csv_x == [[f"0,{float(r)}"] for r in ranks], oracle.side_by_side("metrics.csv rows", csv_x)


@pytest.mark.parametrize("world_size", [2, 3])
def test_setting_rank_zero_only_rank_from_the_launchers_variable_first_keeps_rank_zero_code_on_rank_0(
    run_world, semantics, world_size
):
    """The fix: set ``rank_zero_only.rank = int(os.environ[<your launcher's rank variable>])`` at the top of
    the script (or build the Trainer before anything rank-zero-only runs). Then before the Trainer too the
    function runs on rank 0 only and only rank 0 writes a ``metrics.csv``."""
    world = run_world(rank_state.rank_zero_only_before_the_trainer, world_size, set_rank_first=True)

    records = world.records
    ranks = list(range(world_size))
    ran_before = [rec["ran_before"] for rec in records]
    semantics.number(
        "ranks running @rank_zero_only before the Trainer", sum(ran_before), vs=("without the fix", world_size)
    )
    assert [rec["rank_before"] for rec in records] == ranks, oracle.side_by_side("before", records)
    assert ran_before == [r == 0 for r in ranks], oracle.side_by_side("ran before the Trainer", ran_before)
    files = [sorted(rank.files) for rank in world]
    assert files == [[METRICS_CSV]] + [[]] * (world_size - 1), oracle.side_by_side("files", files)

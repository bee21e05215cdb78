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
Trainer with ``ProbeEnvironment``, a ``ClusterEnvironment`` that reads ``PROBE_RANK`` & co. The last fact
starts fresh interpreters inside a launched world of two nodes (ddpprobe/probes/ddp_spawn.py
``rank_zero_at_import``) to read the rank ``rank_zero_only`` takes at import when ``RANK`` is set, and when it
is not.
"""

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import ddp_spawn, rank_state
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


#: Environments (the four rank variables only) and the rank ``rank_zero_only`` must read from each.
RANK_VARIANTS = {
    "LOCAL_RANK over SLURM_PROCID": ({"LOCAL_RANK": "1", "SLURM_PROCID": "3", "JSM_NAMESPACE_RANK": "2"}, 1),
    "SLURM_PROCID over JSM_NAMESPACE_RANK": ({"SLURM_PROCID": "3", "JSM_NAMESPACE_RANK": "2"}, 3),
    "JSM_NAMESPACE_RANK alone": ({"JSM_NAMESPACE_RANK": "2"}, 2),
    "none set": ({}, 0),
}


#: A CPU fact (gloo whatever the run's backend) that starts fresh interpreters inside a launched world, seconds
#: each: left out of the default run, run by ``pytest -m integration``.
@run_if(backend="gloo")
@pytest.mark.integration
@pytest.mark.mirrors(
    "tests_fabric/utilities/test_rank_zero.py::test_rank_zero_known_environment_variables",
    "tests_fabric/utilities/test_rank_zero.py::test_rank_zero_priority",
)
def test_at_import_rank_zero_only_takes_rank_before_local_rank_slurm_procid_and_jsm_namespace_rank(
    run_world, semantics
):
    """In a world of two nodes of two ranks, a fresh interpreter started with rank 2's environment
    (``RANK=2`` and ``LOCAL_RANK=0`` both set, as torchrun sets them on node 1) reads ``rank_zero_only.rank``
    as the global rank, 2, not the local rank 0, so ``rank_zero_only`` code stays off it before
    any Trainer exists. Without ``RANK`` the order is ``LOCAL_RANK``, ``SLURM_PROCID``,
    ``JSM_NAMESPACE_RANK``, and 0 when none is set. Mirrors Lightning's tests_fabric/utilities/
    test_rank_zero.py::test_rank_zero_known_environment_variables and ::test_rank_zero_priority (mocked
    environment). Source: lightning_fabric/utilities/rank_zero.py ``_get_rank`` (``rank_keys``)."""
    world_size, nodes, on_rank = 4, 2, 2
    variants = {name: env for name, (env, _) in RANK_VARIANTS.items()}
    world = run_world(
        ddp_spawn.rank_zero_at_import,
        world_size,
        num_nodes=nodes,
        variants=variants,
        variants_on_rank=on_rank,
        timeout=480,
    )

    records = world.records
    local = [int(rec["variables"]["LOCAL_RANK"]) for rec in records]
    assert local[on_rank] == 0 and on_rank != 0, "the rank checked must be a node's local rank 0 but not rank 0"
    own = records[on_rank]["own"]
    assert records[on_rank]["variables"]["RANK"] == str(on_rank), records[on_rank]["variables"]
    assert own == on_rank, f"rank_zero_only.rank on rank {on_rank} (LOCAL_RANK {local[on_rank]}): {own}"
    got = records[on_rank]["variants"]
    want = {name: rank for name, (_, rank) in RANK_VARIANTS.items()}
    assert got == want, f"rank read per environment: {got}, expected {want}"
    semantics.number("rank_zero_only.rank on node 1's local rank 0", own, vs=("its LOCAL_RANK", local[on_rank]))

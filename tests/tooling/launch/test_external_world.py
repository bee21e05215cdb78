"""Running inside a world someone else launched (torchrun, srun): ddpprobe recognises it, launches
nothing, and runs each scenario in the current process, exchanging records between the ranks.
(ddpprobe/launch/_external.py.)"""

import os

import pytest

from ddpprobe.launch import external_world
from tests.support.torchrun import pytest_under_torchrun

pytestmark = pytest.mark.not_a_fact("tests how the launcher joins external worlds, not a fact about DDP")

TORCHRUN_RANK_3_OF_4 = {
    "TORCHELASTIC_RUN_ID": "job",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "GROUP_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
SRUN_TASK_5_OF_8 = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
}
#: What an ``sbatch --ntasks=2`` batch script itself sees: its own step has one task.
SBATCH_SCRIPT = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "1"}


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, None),
        ({"RANK": "0", "WORLD_SIZE": "2"}, None),  # no launcher marker: a stray RANK is not a world
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, None),  # one task: nothing to exchange
        (SBATCH_SCRIPT, None),  # the batch script is not a world; its sruns are
        (TORCHRUN_RANK_3_OF_4, ("torchrun", 3, 4, 1, 1, 2)),
        (SRUN_TASK_5_OF_8, ("srun", 5, 8, 1, 1, 4)),
        ({**TORCHRUN_RANK_3_OF_4, "DDPPROBE_NO_EXTERNAL_WORLD": "1"}, None),
    ],
)
def test_an_external_world_is_recognised_from_the_launchers_environment(environ, expected):
    world = external_world(environ)
    got = (
        None
        if world is None
        else (world.launcher, world.rank, world.world_size, world.local_rank, world.node_rank, world.local_world_size)
    )
    assert got == expected


def test_a_garbage_launcher_variable_is_named_with_the_way_out():
    with pytest.raises(ValueError, match=r"WORLD_SIZE='abc'.*DDPPROBE_NO_EXTERNAL_WORLD=1"):
        external_world({**TORCHRUN_RANK_3_OF_4, "WORLD_SIZE": "abc"})


@pytest.mark.integration
def test_pytest_under_torchrun_runs_facts_in_lockstep_and_skips_other_world_sizes_on_every_rank(tmp_path):
    """``torchrun --nproc-per-node 2 -m pytest``: on both ranks the W=2 facts pass (their records came
    from both ranks) and the facts written for other world sizes skip with the reason."""
    proc, outputs = pytest_under_torchrun(
        tmp_path / "logs",
        ["tests/facts/test_sharding.py::test_each_rank_sees_a_disjoint_strided_shard_when_n_divides_by_world_size"],
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + "".join(o[-2000:] for o in outputs)
    assert len(outputs) == 2
    for out in outputs:
        assert "1 passed, 2 skipped" in out, out[-2000:]
        assert "this torchrun world has 2 ranks" in out


def raise_here(info):
    """Scenario: raise at once, naming this rank."""
    raise ValueError(f"deliberate failure on rank {info.rank} of {info.world_size}")


@pytest.mark.integration
def test_in_a_one_rank_torchrun_world_records_and_failures_come_back_as_from_a_launched_world(monkeypatch):
    """The external path runs the scenario in this process and builds the result with the same builder
    as a launched world: a ``WorldResult`` of ``RankResult`` s, or ``RankFailed`` with ``rank_errors``
    (a one-rank world, so it runs inside this test process; the process group is left at the end)."""
    import socket

    from ddpprobe.launch import RankFailed, leave_external_world, run_world

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {
        "TORCHELASTIC_RUN_ID": "job",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DDPPROBE_NO_EXTERNAL_WORLD", raising=False)
    try:
        world = run_world(environment_of, 1, names=["LOCAL_WORLD_SIZE"])
        with pytest.raises(RankFailed) as failure:
            run_world(raise_here, 1)
    finally:
        leave_external_world()

    assert world.records == [{"LOCAL_WORLD_SIZE": "1"}] and world[0].pid == os.getpid()
    assert failure.value.rank_errors == {0: "ValueError: deliberate failure on rank 0 of 1"}
    assert str(failure.value).startswith(
        "external world of 1 rank(s) running tests.tooling.launch.test_external_world:raise_here (backend=gloo): "
        "rank(s) [0]"
    )


def environment_of(info, names):
    """Scenario: the value of each environment variable in ``names`` in this rank (None when unset)."""
    return {name: os.environ.get(name) for name in names}

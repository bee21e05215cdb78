"""The launcher itself: worlds run, failures are reported with the rank and its traceback or stack, and
no rank process outlives its world. (ddpprobe/launch/_world.py ``run_world``.)"""

import functools
import os
import time

import pytest

from ddpprobe import RankDied, RankFailed, WorldTimeout, run_world as api_run_world
from tests.support import scenarios

pytestmark = pytest.mark.not_a_fact("tests the launcher itself, not a fact about DDP")


def _gone(pids) -> bool:
    """True when none of ``pids`` is running. A killed process whose parent is gone stays a zombie
    until PID 1 reaps it, which some container inits never do; a zombie runs nothing, so it counts."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state not in ("Z", "X"):
            return False
    return True


#: W=2 is the launcher's one fresh forkserver world in the default run; W=1 and W=3 run in the integration run.
@pytest.mark.parametrize(
    "world_size", [pytest.param(1, marks=pytest.mark.integration), 2, pytest.param(3, marks=pytest.mark.integration)]
)
def test_records_come_back_ordered_by_rank_from_a_real_process_group(run_world, world_size):
    """Each rank is its own process in one gloo process group (an all_reduce of the ranks gives
    0+1+...+(W-1) on every rank); records come back ordered by rank and every process is gone."""
    world = run_world(scenarios.identity, world_size, tag="t")

    assert [rec["rank"] for rec in world.records] == list(range(world_size))
    assert {rec["rank_sum"] for rec in world.records} == {float(sum(range(world_size)))}
    assert len({rec["pid"] for rec in world.records}) == world_size
    assert [rec["env"]["LOCAL_RANK"] for rec in world.records] == [str(r) for r in range(world_size)]
    assert {rec["env"]["WORLD_SIZE"] for rec in world.records} == {str(world_size)}
    assert _gone(world.pids)


def test_a_rank_that_raises_is_reported_with_its_traceback_and_the_others_are_killed(run_world):
    """Rank 1 raises while rank 0 waits in an all_reduce: the failure names rank 1, its exception and
    traceback, arrives long before any timeout, and no rank survives."""
    with pytest.raises(RankFailed) as failure:
        run_world(scenarios.raise_on, 2, rank=1, timeout=60)

    err = failure.value
    assert err.ranks == [1]
    assert err.exc_types == {1: "ValueError"}
    assert "deliberate failure on rank 1" in str(err) and "raise_on" in err.tracebacks[1]
    assert _gone(err.pids)


@pytest.mark.waits_for_timeout
def test_a_world_that_hangs_is_killed_at_its_timeout_naming_the_stuck_ranks_with_their_stacks(run_world):
    """Rank 1 never enters the all_reduce that rank 0 waits in: at the world timeout both are killed and
    the error names them, with each one's Python stack (rank 1 in ``hang_on``'s sleep)."""
    with pytest.raises(WorldTimeout) as failure:
        run_world(scenarios.hang_on, 2, rank=1, timeout=2.5, pg_timeout=2)

    err = failure.value
    assert 1 in err.ranks
    assert "hang_on" in err.stacks[1] and "time.sleep" in open(scenarios.__file__).read()
    assert "did not finish" in str(err)
    assert _gone(err.pids)


@pytest.mark.integration
@pytest.mark.parametrize("how, code", [("exit3", 3), ("sigkill", -9), ("segfault", -11)])
def test_a_rank_that_dies_without_an_exception_is_reported_with_its_exit_code(run_world, how, code):
    """``os._exit(3)``, SIGKILL and a segfault on rank 1 are each reported as ``RankDied`` with the rank
    and its exit code (negative: the signal)."""
    with pytest.raises(RankDied) as failure:
        run_world(scenarios.exit_on, 2, rank=1, how=how, timeout=60)

    err = failure.value
    assert err.exitcodes[1] == code
    assert "rank 1" in str(err)
    assert _gone(err.pids)


@pytest.mark.integration
def test_a_record_json_cannot_hold_is_reported_with_the_key_and_type(run_world):
    with pytest.raises(TypeError, match=r"record\['nested'\]\['value'\] is a Tensor"):
        run_world(scenarios.unserialisable, 1)


@pytest.mark.integration
def test_the_next_world_in_the_same_process_runs_after_failures(run_world):
    with pytest.raises(RankFailed):
        run_world(scenarios.raise_on, 2, rank=0)
    assert [rec["rank"] for rec in run_world(scenarios.identity, 2).records] == [0, 1]


@pytest.mark.parametrize(
    "kwargs, error, names",
    [
        ({"world_size": 0}, ValueError, "world_size=0"),
        ({"world_size": -2}, ValueError, "world_size=-2"),
        ({"world_size": 2.0}, TypeError, "2.0"),
        ({"world_size": 10_000}, ValueError, "world_size=10000"),
        ({"backend": "mpi"}, ValueError, "'mpi'"),
        ({"timeout": 0}, ValueError, "timeout=0"),
        ({"timeout": -1}, ValueError, "timeout=-1"),
        ({"timeout": 5, "pg_timeout": 5}, ValueError, "pg_timeout=5"),
        ({"start_method": "fork"}, ValueError, "'fork'"),
        ({"no_such_param": 1}, TypeError, "no_such_param"),
    ],
)
def test_bad_arguments_raise_a_clear_error_before_any_process_starts(kwargs, error, names):
    args = {"world_size": 2, **kwargs}
    with pytest.raises(error, match=names.replace("(", r"\(").replace(".", r"\.").replace("[", r"\[")):
        api_run_world(scenarios.identity, **args)


def test_a_lambda_or_closure_is_rejected_as_a_scenario():
    def local(info):
        return {}

    for bad in (lambda info: {}, local):
        with pytest.raises(TypeError, match="not an importable top-level function"):
            api_run_world(bad, 2)


# ---------------------------------------------------------------------------------------------
# Environment hygiene and what is left behind
# ---------------------------------------------------------------------------------------------

#: Variables a cluster manager or torchrun sets; each makes Lightning pick another cluster environment
#: (lightning_fabric/plugins/environments/slurm.py and torchelastic.py ``detect()``).
STRAY_CLUSTER_ENV = {"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "train", "TORCHELASTIC_RUN_ID": "stray"}


def environment_of(info, names):
    """Scenario: the value of each environment variable in ``names`` in this rank (None when unset)."""
    return {name: os.environ.get(name) for name in names}


def port_then_hang(info):
    """Scenario: print the rendezvous port, join the process group, then rank 1 sleeps forever while
    rank 0 waits for it in an all_reduce (so the store has live clients when the world is killed)."""
    import time

    import torch
    import torch.distributed as dist

    print(f"MASTER_PORT={os.environ['MASTER_PORT']}", flush=True)
    dist.init_process_group(info.backend, rank=info.rank, world_size=info.world_size)
    if info.rank == 1:
        while True:
            time.sleep(0.05)
    dist.all_reduce(torch.zeros(1))
    return {}


def raise_then_die(info, delay_s=0.05):
    """Scenario: rank 0 raises at once; rank 1 ends with ``os._exit(3)`` ``delay_s`` seconds later."""
    import time

    import torch.distributed as dist

    dist.init_process_group(info.backend, rank=info.rank, world_size=info.world_size)
    if info.rank == 0:
        raise ValueError("rank 0 fails first")
    time.sleep(delay_s)
    os._exit(3)


@pytest.mark.integration
def test_a_death_that_arrives_just_after_a_peers_exception_is_still_reported_as_the_death(run_world):
    """When a rank dies, its peers' collectives fail with "connection closed by peer", and that error can
    reach the launcher a moment before the death does. After an exception the launcher keeps listening
    while a rank still running is at work (up to ``FAILURE_SETTLE_S``), so a death close behind it is
    reported as ``RankDied``, with the exception still in the message."""
    with pytest.raises(RankDied) as failure:
        run_world(raise_then_die, 2, timeout=60)

    err = failure.value
    assert err.exitcodes == {1: 3}
    assert "rank 0 raised ValueError: rank 0 fails first" in str(err)
    assert err.rank_errors == {
        0: "ValueError: rank 0 fails first",
        1: "ended with exit code 3 without reporting a result",
    }
    assert _gone(err.pids)


@pytest.mark.integration
def test_stray_cluster_variables_in_the_parent_do_not_change_what_lightning_does(run_world, monkeypatch):
    """``SLURM_NTASKS=4`` left in the shell would make Lightning's ``SLURMEnvironment`` claim a world of
    4; the launcher removes such variables in every rank, so a 2-rank ``trainer.validate`` sees world
    size 2, ranks 0 and 1, and each rank its own ``DistributedSampler`` shard."""
    from ddpprobe.probes import validation
    from tests.support import oracle

    for name, value in STRAY_CLUSTER_ENV.items():
        monkeypatch.setenv(name, value)
    n, batch_size = 7, 2

    world = run_world(validation.validate, 2, n=n, batch_size=batch_size)
    env = run_world(environment_of, 2, names=sorted(STRAY_CLUSTER_ENV)).records

    assert [rec["global_rank"] for rec in world.records] == [0, 1]
    assert {rec["world_size"] for rec in world.records} == {2}
    for rank, rec in enumerate(world.records):
        expected = oracle.batches(oracle.distributed_sampler_ids(n, 2, rank, shuffle=False), batch_size)
        assert rec["seen_ids"] == expected, oracle.side_by_side("seen_ids", [r["seen_ids"] for r in world.records])
    assert env == [dict.fromkeys(sorted(STRAY_CLUSTER_ENV))] * 2


@pytest.mark.integration
def test_keep_cluster_env_passes_the_cluster_variables_through_to_every_rank(run_world, monkeypatch):
    """With ``keep_cluster_env=True`` the same variables reach every rank unchanged (set in the parent
    after the forkserver started, so this also shows each rank gets the parent's *current* environment)."""
    for name, value in STRAY_CLUSTER_ENV.items():
        monkeypatch.setenv(name, value)

    env = run_world(environment_of, 2, names=sorted(STRAY_CLUSTER_ENV), keep_cluster_env=True).records

    assert env == [STRAY_CLUSTER_ENV] * 2


@pytest.mark.integration
def test_after_a_world_timeout_no_rank_survives_and_the_rendezvous_port_is_released(run_world):
    """A world killed at its timeout leaves nothing behind: every rank process is gone and the TCPStore
    the launcher hosted no longer listens on its port (binding it succeeds)."""
    import re
    import socket

    with pytest.raises(WorldTimeout) as failure:
        run_world(port_then_hang, 2, timeout=2.5, pg_timeout=2)

    err = failure.value
    ports = {int(p) for out, _ in err.outputs.values() for p in re.findall(r"MASTER_PORT=(\d+)", out)}
    assert len(ports) == 1, err.outputs
    assert _gone(err.pids)
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", ports.pop()))  # raises OSError (address in use) while a listener holds it


@pytest.mark.integration
def test_the_forkserver_is_gone_as_soon_as_the_process_that_started_it_exits():
    """The forkserver would end by itself a moment after its parent exits (EOF on a pipe), late enough
    for a leftover-process check run right after ``pytest`` to see it. The launcher ends and reaps it
    at interpreter exit, so it is gone when the parent's exit status is available."""
    import subprocess
    import sys

    code = (
        "import multiprocessing.forkserver as fs\n"
        "from ddpprobe import run_world\n"
        "from tests.support import scenarios\n"
        "run_world(scenarios.identity, 1, start_method='forkserver')\n"
        "print(fs._forkserver._forkserver_pid)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr
    server_pid = int(done.stdout.split()[-1])
    assert _gone([server_pid]), f"forkserver {server_pid} still exists after its parent exited"


@pytest.mark.integration
def test_odd_files_left_in_a_rank_folder_are_listed_by_kind_not_opened(run_world):
    """A FIFO (opening it would block), a link to /dev/zero (reading it would never end) and a dangling
    link are listed by what they are; the regular file's text comes back."""
    world = run_world(scenarios.odd_files, 1)

    assert world[0].files == {
        "dangling": "<symlink -> /nonexistent>",
        "fifo": "<fifo>",
        "plain.txt": "text",
        "zero": "<symlink -> /dev/zero>",
    }


@pytest.mark.integration
def test_a_rank_can_start_dataloader_worker_processes(run_world):
    """Ranks are not daemonic processes, so a ``DataLoader(num_workers=2)`` in a rank works."""
    world = run_world(scenarios.dataloader_workers, 2)

    assert world.records == [{"batches": [[0, 1], [2, 3]]}] * 2


@pytest.mark.integration
def test_a_rank_that_returned_its_record_exits_with_code_0(run_world):
    world = run_world(scenarios.identity, 3)

    assert [rank.exitcode for rank in world] == [0, 0, 0]


@pytest.mark.integration
def test_children_a_rank_leaves_running_are_ended_with_the_world(run_world):
    """Each rank leads its own process group; the launcher ends the group, children included."""
    world = run_world(scenarios.leave_a_child, 2)

    # SIGKILL to the group is delivered asynchronously: allow a busy machine a moment.
    children = [rec["child_pid"] for rec in world.records]
    deadline = time.monotonic() + 5
    while not _gone(children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(children)


@pytest.mark.parametrize(
    "kwargs, error, names",
    [
        ({"env": {"A=B": "x"}}, ValueError, "'A=B'"),
        ({"env": {"": "x"}}, ValueError, "''"),
        ({"env": {"FOO": "a\0b"}}, ValueError, "'FOO'"),
        ({"timeout": float("inf")}, ValueError, "timeout=inf"),
        ({"timeout": 1e300}, ValueError, "timeout=1e\\+300"),
        ({"timeout": 10, "pg_timeout": 1e-9}, ValueError, "pg_timeout=1e-09"),
    ],
)
def test_more_bad_arguments_are_refused_before_any_process_starts(kwargs, error, names):
    with pytest.raises(error, match=names):
        api_run_world(scenarios.identity, 2, **kwargs)


@pytest.mark.parametrize(
    "bad, kind",
    [
        (scenarios.time.sleep, "a builtin"),
        (ValueError, "a class"),
        (functools.partial(scenarios.identity, tag="p"), "a partial"),
    ],
)
def test_a_scenario_that_is_not_a_plain_function_is_refused_naming_what_it_is(bad, kind):
    with pytest.raises(TypeError, match=f"got {kind}"):
        api_run_world(bad, 2)


SHARED_SERVER_CHECK = """
import os

import pytest


def parent_pid(info, test):
    with open(f"/proc/{os.getppid()}/stat") as fh:
        server_parent = fh.read().rsplit(")", 1)[1].split()[1]
    worker = os.environ["PYTEST_XDIST_WORKER"]
    return {"forkserver": os.getppid(), "server_parent": int(server_parent), "worker": worker}


@pytest.mark.parametrize("test", range(4))
def test_world(run_world, test):
    world = run_world(parent_pid, 2, test=test)
    with open(os.path.join(os.environ["OUT"], f"{test}.txt"), "w") as fh:
        fh.write(" ".join(str(world.records[r][k]) for r in (0, 1) for k in ("worker", "server_parent", "forkserver")))
"""


@pytest.mark.integration
def test_under_xdist_every_worker_forks_its_ranks_from_one_forkserver_the_controller_started(tmp_path):
    """One forkserver per run, not per worker (ddpprobe/plugin/pytest_plugin.py ``pytest_configure_node``): the
    ranks of both workers' worlds have the same parent, a child of the controller, gone when the run ends."""
    import subprocess
    import sys

    (tmp_path / "out").mkdir()
    (tmp_path / "test_shared.py").write_text(SHARED_SERVER_CHECK)
    code = (
        "import os, sys, pytest\n"
        "print('controller', os.getpid(), flush=True)\n"
        "sys.exit(pytest.main(['-p', 'ddpprobe.plugin.pytest_plugin', '-p', 'no:cacheprovider', '-q', '-n', '2']))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)  # this checkout's ddpprobe
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    controller = int(done.stdout.split()[1])
    seen = [(tmp_path / "out" / f"{t}.txt").read_text().split() for t in range(4)]
    workers = {row[0] for row in seen} | {row[3] for row in seen}
    servers = {(int(row[1]), int(row[2])) for row in seen} | {(int(row[4]), int(row[5])) for row in seen}
    assert len(workers) == 2, f"both workers should run a world: {seen}"
    assert len(servers) == 1, f"the ranks of one run forked from several servers (parent, server): {servers}"
    ((server_parent, server),) = servers
    assert server_parent == controller, f"forkserver {server} is a child of {server_parent}, not {controller}"
    assert _gone([server]), f"forkserver {server} outlived the run"

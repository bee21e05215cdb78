"""Several nodes: what "rank 0" means when a world spans nodes.

A world of 4 ranks on 2 "nodes" of 2 (``run_world(..., num_nodes=2)``: forked ranks that each get the
``NODE_RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` a launcher sets on its node; gloo on 127.0.0.1; the
Trainer gets ``devices=2, num_nodes=2``). Lightning's ``LightningEnvironment`` reads them
(lightning_fabric/plugins/environments/lightning.py), so global rank = node_rank * devices +
local_rank. Everything "rank zero" (``self.print``, the logger) happens once in the whole world, on
global rank 0; ``prepare_data`` runs once per node, on each node's local rank 0
(``prepare_data_per_node=True``, the default), or once in the world with ``prepare_data_per_node=False``;
``DistributedSampler`` shards by global rank over all nodes. Sources: pytorch_lightning/trainer/
connectors/data_connector.py ``_DataConnector.prepare_data``; lightning_fabric/loggers/logger.py
``rank_zero_experiment``; lightning_fabric/utilities/rank_zero.py.

The same layout under two real ``torchrun`` agents (``TorchElasticEnvironment``, which reads torchrun's
``RANK``/``LOCAL_RANK``/``GROUP_RANK``) is checked by the last test, an ``integration`` test (two agents
start fresh interpreters: seconds), run by ``pytest -m integration`` and by ``.ci/run``.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from ddpprobe.probes import multinode
from tests.support import oracle

NODES, PER_NODE = 2, 2
WORLD_SIZE = NODES * PER_NODE
#: 10 samples on 4 ranks: the DistributedSampler pads to 12 with samples 0 and 1 again, so the synced
#: mean (23.83) differs from the single-process mean (28.5) and from what a per-node shard would give.
N = 10

#: Worlds already run in this process, by (num_nodes, prepare_data_per_node): several facts read one world.
_WORLDS = {}


@pytest.fixture
def node_world(run_world):
    """``node_world(num_nodes, prepare_data_per_node=True)``: the records of a 4-rank world of
    ``node_layout`` over ``IdDataset(10)`` split into ``num_nodes`` nodes. Forked nodes share this host,
    so the world runs on gloo whatever ``--backend`` says."""

    def get(num_nodes: int = NODES, prepare_data_per_node: bool = True):
        key = (num_nodes, prepare_data_per_node)
        if key not in _WORLDS:
            _WORLDS[key] = run_world(
                multinode.node_layout,
                WORLD_SIZE,
                num_nodes=num_nodes,
                backend="gloo",
                n=N,
                prepare_data_per_node=prepare_data_per_node,
            )
        return _WORLDS[key]

    return get


def _layout(num_nodes: int) -> list:
    """``[(global_rank, node_rank, local_rank)]`` a launcher gives 4 ranks on ``num_nodes`` nodes."""
    per_node = WORLD_SIZE // num_nodes
    return [(g, g // per_node, g % per_node) for g in range(WORLD_SIZE)]


@pytest.mark.parametrize("num_nodes", [1, NODES])
def test_global_rank_is_node_rank_times_ranks_per_node_plus_local_rank(node_world, num_nodes, semantics):
    """On 2 nodes of 2 ranks the local ranks are 0, 1, 0, 1 and the node ranks 0, 0, 1, 1; on one node
    of 4 the local rank equals the global rank. ``trainer.num_nodes`` is the node count, and the cluster
    environment is ``LightningEnvironment`` (a launcher set the variables; Lightning spawns nothing)."""
    records = node_world(num_nodes).records

    got = [(r["global_rank"], r["node_rank"], r["local_rank"]) for r in records]
    assert got == _layout(num_nodes), oracle.side_by_side("(global, node, local) rank", got)
    assert [r["world_size"] for r in records] == [WORLD_SIZE] * WORLD_SIZE
    assert [r["num_nodes"] for r in records] == [num_nodes] * WORLD_SIZE
    assert [r["cluster_environment"] for r in records] == ["LightningEnvironment"] * WORLD_SIZE
    semantics.number(
        "ranks with local rank 0", sum(r["local_rank"] == 0 for r in records), vs=("ranks with global rank 0", 1)
    )


@pytest.mark.parametrize("per_node", [True, False], ids=["prepare_data_per_node", "not_per_node"])
def test_prepare_data_runs_on_local_rank_zero_of_every_node_or_on_global_rank_zero_only(
    node_world, per_node, semantics
):
    """``prepare_data`` (for downloads and other per-machine work) runs on local rank 0 of every node by
    default, so twice in a world of 2 nodes: on global ranks 0 and 2. With
    ``prepare_data_per_node=False`` it runs once in the world, on global rank 0 (node 0, local rank 0).
    Lightning decides it in ``_DataConnector.prepare_data`` from ``trainer.local_rank`` and
    ``trainer.node_rank``; the other ranks wait at a barrier meanwhile."""
    records = node_world(NODES, per_node).records

    layout = _layout(NODES)
    once_per_node = [1 if local == 0 else 0 for _, _, local in layout]
    once_per_world = [1 if g == 0 else 0 for g, _, _ in layout]
    oracle.assert_distinct(per_node=sum(once_per_node), per_world=sum(once_per_world))
    got = [r["prepare_data_calls"] for r in records]
    assert got == (once_per_node if per_node else once_per_world), oracle.side_by_side("prepare_data calls", got)
    semantics.number(
        "prepare_data calls in the world",
        sum(got),
        vs=("the other setting", sum(once_per_world if per_node else once_per_node)),
    )


def test_self_print_and_the_logger_act_on_global_rank_zero_only_not_on_every_nodes_local_rank_zero(node_world):
    """``self.print`` prints on global rank 0 only (not on global rank 2, local rank 0 of node 1), and
    only global rank 0 holds a real logger experiment (``CSVLogger``'s ``ExperimentWriter``); the
    others get ``_DummyExperiment``, a no-op (lightning_fabric/loggers/logger.py ``rank_zero_experiment``)."""
    world = node_world(NODES)

    printed = ["self.print from global rank" in rank.stdout for rank in world]
    assert printed == [True, False, False, False], oracle.side_by_side("printed", printed)
    kinds = [r["experiment_type"] for r in world.records]
    assert kinds == ["ExperimentWriter"] + ["_DummyExperiment"] * 3, oracle.side_by_side("experiment", kinds)
    assert [r["is_global_zero"] for r in world.records] == [True, False, False, False]


def test_the_distributed_sampler_shards_by_global_rank_across_nodes_and_sync_dist_averages_over_all_of_them(
    node_world, semantics
):
    """Every rank's validation shard is the ``DistributedSampler`` shard of its *global* rank among all 4
    (not of its local rank on its node, which would give both nodes the whole set): 10 samples padded to
    12 with samples 0 and 1 again. The ``sync_dist=True`` mean is then one number on every rank of both
    nodes: the mean over the 12 padded evaluations, not the dataset's mean."""
    records = node_world(NODES).records

    seen = [r["seen_ids"] for r in records]
    expected = [oracle.shard(N, WORLD_SIZE, g) for g in range(WORLD_SIZE)]
    per_node_shards = [oracle.shard(N, PER_NODE, local) for _, _, local in _layout(NODES)]
    assert expected != per_node_shards
    assert seen == expected, oracle.side_by_side("saw", seen) + "\n" + oracle.side_by_side("expected", expected)

    padded_mean = oracle.mean(oracle.values(oracle.padded_indices(N, WORLD_SIZE)))
    single_process = oracle.mean(oracle.values(range(N)))
    per_node_mean = oracle.mean(oracle.values(oracle.padded_indices(N, PER_NODE)))
    oracle.assert_distinct(padded=padded_mean, single_process=single_process)
    assert per_node_mean == pytest.approx(single_process)  # a per-node shard pads nothing at 10 / 2
    got = [r["callback_metrics"]["v"] for r in records]
    assert got == pytest.approx([padded_mean] * WORLD_SIZE), oracle.side_by_side("synced v", got)
    semantics.number("synced mean on 2 nodes", got[0], vs=("single-process mean", single_process))


# --- the same layout under two real torchrun agents (integration: fresh interpreters, seconds) -------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_nodes(tmp_path, scenario: str, params: dict, timeout: float = 120) -> list:
    """Start one torchrun agent per node, each running the scenario on its ranks; return rank 0's
    JSON list of every rank's message."""
    out = tmp_path / "records.json"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DDPPROBE_"))}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={NODES}",
                f"--nproc-per-node={PER_NODE}",
                f"--node-rank={node}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                # the agent's own log folder, else it makes a torchelastic_* folder in /tmp and leaves it there
                f"--log-dir={tmp_path / f'agent{node}-logs'}",
                "-m",
                "ddpprobe.launch",
                scenario,
                "--params",
                json.dumps(params),
                "--out",
                str(out),
            ],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for node in range(NODES)
    ]
    logs = []
    try:
        for agent in agents:
            logs.append(agent.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
        logs = [agent.communicate()[0] for agent in agents]
        pytest.fail(f"torchrun agents did not finish within {timeout}s\n" + "\n".join(log[-3000:] for log in logs))
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    codes = [a.returncode for a in agents]
    assert codes == [0] * NODES and out.exists(), f"agents exited {codes}\n" + "\n".join(log[-3000:] for log in logs)
    messages = json.loads(out.read_text())
    assert [m["status"] for m in messages] == ["ok"] * WORLD_SIZE, messages
    return messages


@pytest.mark.integration
def test_two_torchrun_agents_give_the_same_layout_rank_zero_and_shards_as_forked_nodes(tmp_path):
    """Under two ``torchrun --nnodes 2 --nproc-per-node 2`` agents (``TorchElasticEnvironment``) the facts
    above hold as they do for forked nodes: global rank = node_rank * 2 + local_rank; only global rank 0
    prints with ``self.print`` and has a real logger experiment; ``prepare_data`` ran once per node (on
    local rank 0 of each); every rank's validation shard is the DistributedSampler shard of its global
    rank, and the synced mean is the padded one."""
    ranks = _run_two_nodes(tmp_path, "ddpprobe.probes.multinode:node_layout", {"n": N})
    records = [m["record"] for m in ranks]

    layout = [(r["global_rank"], r["node_rank"], r["local_rank"]) for r in records]
    assert layout == _layout(NODES), oracle.side_by_side("(global, node, local) rank", layout)
    assert [r["cluster_environment"] for r in records] == ["TorchElasticEnvironment"] * WORLD_SIZE
    assert {r["world_size"] for r in records} == {WORLD_SIZE}
    assert [r["num_nodes"] for r in records] == [NODES] * WORLD_SIZE

    assert [("self.print from global rank" in m["stdout"]) for m in ranks] == [True, False, False, False]
    assert [r["experiment_type"] for r in records] == ["ExperimentWriter"] + ["_DummyExperiment"] * 3
    calls = [r["prepare_data_calls"] for r in records]
    assert calls == [1 if local == 0 else 0 for _, _, local in _layout(NODES)], oracle.side_by_side("calls", calls)

    seen = [r["seen_ids"] for r in records]
    expected = [oracle.shard(N, WORLD_SIZE, r["global_rank"]) for r in records]
    assert seen == expected, oracle.side_by_side("saw", seen)
    padded_mean = oracle.mean(oracle.values(oracle.padded_indices(N, WORLD_SIZE)))
    oracle.assert_distinct(padded=padded_mean, single_process=oracle.mean(oracle.values(range(N))))
    assert [r["callback_metrics"]["v"] for r in records] == pytest.approx([padded_mean] * WORLD_SIZE)

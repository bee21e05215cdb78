"""Several nodes: what "rank 0" means when a world spans nodes, shown with two torchrun agents on one host.

Two ``torchrun --nnodes 2 --nproc-per-node 2`` agents form a world of 4 ranks on two "nodes" (gloo on
127.0.0.1). Lightning's ``TorchElasticEnvironment`` reads ``RANK``/``LOCAL_RANK``/``GROUP_RANK`` from
torchrun, so global rank = node_rank * devices + local_rank. Everything "rank zero" (``self.print``, the
logger) happens once in the whole world, on global rank 0; ``prepare_data`` runs once per node, on each
node's local rank 0 (``prepare_data_per_node=True``); ``DistributedSampler`` shards by global rank.
Sources: lightning_fabric/plugins/environments/torchelastic.py; pytorch_lightning/trainer/connectors/
data_connector.py ``_DataConnector.prepare_data``; lightning_fabric/loggers/logger.py
``rank_zero_experiment``.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.support import oracle

NODES, PER_NODE = 2, 2


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
            [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", f"--nproc-per-node={PER_NODE}",
             f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}",
             "-m", "ddpprobe.launch", scenario, "--params", json.dumps(params), "--out", str(out)],
            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
        pytest.fail(f"torchrun agents did not finish within {timeout}s\n" + "\n".join(l[-3000:] for l in logs))
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    codes = [a.returncode for a in agents]
    assert codes == [0] * NODES and out.exists(), f"agents exited {codes}\n" + "\n".join(l[-3000:] for l in logs)
    messages = json.loads(out.read_text())
    assert [m["status"] for m in messages] == ["ok"] * NODES * PER_NODE, messages
    return messages


def test_two_nodes_under_torchrun_global_rank_zero_and_per_node_local_rank_zero(tmp_path):
    """In a 2-node x 2-rank world: global rank = node_rank * 2 + local_rank; only global rank 0 prints
    with ``self.print`` and has a real logger experiment; ``prepare_data`` ran once per node (on local
    rank 0 of each); every rank's validation shard is the DistributedSampler shard of its global rank."""
    n = 10
    ranks = _run_two_nodes(tmp_path, "ddpprobe.probes.multinode:node_layout", {"n": n})
    world_size = NODES * PER_NODE
    records = [m["record"] for m in ranks]

    layout = [(r["global_rank"], r["node_rank"], r["local_rank"]) for r in records]
    assert layout == [(node * PER_NODE + local, node, local) for node in range(NODES) for local in range(PER_NODE)]
    assert {r["world_size"] for r in records} == {world_size}
    assert [r["num_nodes"] for r in records] == [NODES] * world_size

    assert [("self.print from global rank" in m["stdout"]) for m in ranks] == [True, False, False, False]
    assert [r["experiment_type"] for r in records] == ["ExperimentWriter"] + ["_DummyExperiment"] * 3
    assert [r["prepare_data_calls"] for r in records] == [1 if local == 0 else 0
                                                          for node in range(NODES) for local in range(PER_NODE)]

    seen = [r["seen_ids"] for r in records]
    expected = [oracle.shard(n, world_size, r["global_rank"]) for r in records]
    assert seen == expected, oracle.side_by_side("saw", seen)
    padded_mean = oracle.mean(oracle.values(oracle.padded_indices(n, world_size)))
    oracle.assert_distinct(padded=padded_mean, single_process=oracle.mean(oracle.values(range(n))))
    assert [r["callback_metrics"]["v"] for r in records] == pytest.approx([padded_mean] * world_size)

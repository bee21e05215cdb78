"""Forked multi-node worlds: ``run_world(scenario, world_size, num_nodes=N)`` starts ranks on this host
that look to Lightning like N nodes of ``world_size // N`` ranks each, so facts about several nodes run
as fast as any world. Rank ``r`` of a world with ``d`` ranks per node is local rank ``r % d`` of node
``r // d`` (``NODE_RANK``/``GROUP_RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``), the layout torchrun
gives (torch/distributed/run.py); Lightning's ``LightningEnvironment`` reads it
(lightning_fabric/plugins/environments/lightning.py ``node_rank``, ``local_rank``) and the strategy sets
global rank = node_rank * devices + local_rank (lightning_fabric/strategies/ddp.py / pytorch_lightning
strategies ``set_world_ranks``). (ddpprobe/launch/_rank.py ``_set_environment``.)"""

import os

import pytest

from ddpprobe.launch import run_world as api_run_world
from ddpprobe.probes.common import ddp_trainer, id_loader
from tests.support import oracle, scenarios

pytestmark = pytest.mark.not_a_fact("tests the launcher's forked multi-node worlds, not a fact about DDP")

LAYOUT_ENV = ("RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def layout(info):
    """Scenario: what the environment, ``RankInfo`` and a DDP Trainer say about this rank's place."""
    from ddpprobe._lightning import pl

    class Probe(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.prepare_data_calls = 0

        def prepare_data(self):  # local rank 0 of every node (prepare_data_per_node=True, the default)
            self.prepare_data_calls += 1

        def validation_step(self, batch, batch_idx):
            pass

    env = {name: os.environ.get(name) for name in LAYOUT_ENV}
    model = Probe()
    trainer = ddp_trainer(info)
    trainer.validate(model, dataloaders=id_loader(8, 2), verbose=False)
    return {
        "env": env,
        "info": [info.rank, info.local_rank, info.node_rank, info.num_nodes, info.devices],
        "trainer": [
            trainer.global_rank,
            trainer.local_rank,
            trainer.node_rank,
            trainer.num_nodes,
            trainer.world_size,
            trainer.is_global_zero,
        ],
        "prepare_data_calls": model.prepare_data_calls,
    }


#: (4, 2) is the launcher's one multi-node world in the default run; the other layouts run in the integration run.
@pytest.mark.parametrize(
    "world_size, num_nodes",
    [(4, 2), *(pytest.param(*layout, marks=pytest.mark.integration) for layout in [(6, 3), (6, 2), (3, 1)])],
)
def test_a_forked_world_of_several_nodes_looks_like_several_nodes_to_lightning(run_world, world_size, num_nodes):
    """Every rank's environment, ``RankInfo`` and Trainer agree on the torchrun layout; global rank 0 is
    the only global zero, and ``prepare_data`` ran once per node, on each node's local rank 0."""
    world = run_world(layout, world_size, num_nodes=num_nodes)
    per_node = world_size // num_nodes

    expected_env = [
        {
            "RANK": str(r),
            "WORLD_SIZE": str(world_size),
            "NODE_RANK": str(r // per_node),
            "GROUP_RANK": str(r // per_node),
            "LOCAL_RANK": str(r % per_node),
            "LOCAL_WORLD_SIZE": str(per_node),
        }
        for r in range(world_size)
    ]
    got_env = [rec["env"] for rec in world.records]
    assert got_env == expected_env, oracle.side_by_side("env", got_env)
    infos = [rec["info"] for rec in world.records]
    assert infos == [[r, r % per_node, r // per_node, num_nodes, per_node] for r in range(world_size)], (
        oracle.side_by_side("RankInfo rank, local, node, nodes, devices", infos)
    )
    trainers = [rec["trainer"] for rec in world.records]
    assert trainers == [[r, r % per_node, r // per_node, num_nodes, world_size, r == 0] for r in range(world_size)], (
        oracle.side_by_side("Trainer global, local, node, nodes, world size, global zero", trainers)
    )
    calls = [rec["prepare_data_calls"] for rec in world.records]
    assert calls == [int(r % per_node == 0) for r in range(world_size)], oracle.side_by_side("prepare_data", calls)


@pytest.mark.parametrize(
    "kwargs, error, names",
    [
        ({"world_size": 4, "num_nodes": 3}, ValueError, r"num_nodes=3 does not divide world_size=4.*1, 2, 4"),
        ({"world_size": 4, "num_nodes": 0}, ValueError, r"num_nodes=0"),
        ({"world_size": 4, "num_nodes": "2"}, TypeError, r"num_nodes must be an int, got str '2'"),
        ({"world_size": 4, "num_nodes": 2, "backend": "nccl"}, ValueError, r"num_nodes=2 with backend='nccl'"),
    ],
)
def test_a_node_count_that_does_not_divide_the_world_is_refused_before_any_process_starts(kwargs, error, names):
    with pytest.raises(error, match=names):
        api_run_world(scenarios.identity, **kwargs)


def test_inside_a_torchrun_world_a_node_count_other_than_its_own_is_refused(monkeypatch):
    """Under torchrun the launcher has laid out the nodes; a scenario asking for another layout is
    refused before joining the world (one 4-rank node here, 2 nodes asked)."""
    for name, value in {
        "TORCHELASTIC_RUN_ID": "job",
        "RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "LOCAL_WORLD_SIZE": "4",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DDPPROBE_NO_EXTERNAL_WORLD", raising=False)

    with pytest.raises(ValueError, match=r"num_nodes=2 does not match the torchrun world .*1 node\(s\) of 4"):
        api_run_world(scenarios.identity, 4, num_nodes=2)

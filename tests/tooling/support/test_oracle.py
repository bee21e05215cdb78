"""The oracle the facts compare with is checked against the library it models, in this process."""

from tests.support import oracle


def test_the_oracles_sharding_rule_is_torchs_distributed_sampler():
    """The sharding rule the facts use (tests/support/oracle.py) is the one torch's ``DistributedSampler``
    implements, checked in this process without any process group."""
    from torch.utils.data.distributed import DistributedSampler

    for n in range(1, 12):
        for world_size in range(1, 5):
            for rank in range(world_size):
                sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False)
                assert list(sampler) == oracle.shard(n, world_size, rank), (n, world_size, rank)

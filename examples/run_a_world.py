"""A world of 2 ranks validating 5 samples, each rank logging ``v`` with ``sync_dist=True`` (docs/worlds.md).

``python -m examples.run_a_world`` prints, per rank, the sample ids it saw per batch and its
``callback_metrics``: sample 0 twice (``DistributedSampler``'s padding), and a synced mean over those 6
evaluations that is not the dataset's mean.
"""

from ddpprobe import run_world
from ddpprobe.probes import log_spec, validation

if __name__ == "__main__":  # ranks import this script's modules: keep the launch under the guard
    world = run_world(validation.validate, world_size=2, n=5, logs=[log_spec("v", sync_dist=True)])
    for rank in world:
        print(rank.rank, rank.record["seen_ids"], rank.record["callback_metrics"])

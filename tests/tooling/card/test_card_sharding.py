"""The card's sharding picture marks only the padding: the later copy of each repeated sample
(ddpprobe/card/sharding.py). The shards here come from the oracle, so no world runs; the picture drawn
from a real world is checked in test_report.py."""

import xml.etree.ElementTree as ET

import pytest

from ddpprobe.card.sharding import duplicated_ids, padding_cells, sharding_svg
from tests.support import oracle


def _seen(n: int, world_size: int, batch_size: int) -> list:
    """Per rank, per batch, the ids a non-shuffling ``DistributedSampler`` deals (the oracle's shards)."""
    return [oracle.batches(oracle.shard(n, world_size, r), batch_size) for r in range(world_size)]


@pytest.mark.parametrize("n, world_size, batch_size", [(5, 2, 2), (7, 3, 2), (10, 4, 2), (3, 4, 1), (8, 2, 3)])
def test_only_the_later_copy_of_each_padded_sample_is_marked(n, world_size, batch_size):
    """A cell is marked ``duplicate`` exactly when its position in the sampler's padded list,
    ``slot * W + rank``, is N or more (the repeats ``DistributedSampler`` appends); the original copy of
    a repeated sample stays unmarked, so the marked cells number ``ceil(N/W)*W - N``, one per extra
    evaluation, not two per repeated sample."""
    seen = _seen(n, world_size, batch_size)
    expected = sorted(
        [r, s] for r in range(world_size) for s in range(len(sum(seen[r], []))) if s * world_size + r >= n
    )

    assert sorted(padding_cells(seen)) == expected
    cells = [
        el
        for el in ET.fromstring(sharding_svg(seen, n=n)).iter("{http://www.w3.org/2000/svg}rect")
        if el.get("class", "").split()[:1] == ["cell"]
    ]
    marked = sorted(
        [int(c.get("data-rank")), int(c.get("data-slot"))] for c in cells if "duplicate" in c.get("class").split()
    )
    assert marked == expected
    assert len(marked) == sum(oracle.duplicates(n, world_size).values())
    originals = [c for c in cells if int(c.get("data-count")) > 1 and "duplicate" not in c.get("class").split()]
    assert len(originals) == len(duplicated_ids(seen)) == len(oracle.duplicates(n, world_size))

"""The guard's tests read a hazard's world from its recording (tests/support/guard_recordings.py): the fixture
``failed_world`` gives the world's failure, each rank's guard error computed again from what the ranks posted at the
check that differed, or the world live where nothing is recorded on this release (and inside torchrun or srun)."""

import pytest

from tests.support import guard_recordings


@pytest.fixture
def failed_world(run_world, backend):
    """``failed_world(scenario, world_size, **params)``: the ``RankFailed`` of ``run_world(scenario, world_size,
    **params)``, replayed from its recording where one is stored (tests/support/guard_recordings.py
    ``failed_world``); ``live=True``: the world run now, never recorded. Fails the test where the world finishes."""

    def failed(scenario, world_size: int = 2, live: bool = False, **params):
        return guard_recordings.failed_world(run_world, backend, scenario, world_size, live, **params)

    return failed

"""The trace's tests read a traced world from its recording (tests/tooling/trace/recorded_traces.py): the fixture
``traced_world`` gives each rank's record, the events its trace wrote among them, from the stored recording, or from
the world run live where nothing is recorded on this release (and inside torchrun or srun)."""

import pytest

from tests.tooling.trace import recorded_traces


@pytest.fixture
def traced_world(run_world, backend):
    """``traced_world(scenario, world_size, **params)``: the records of ``run_world(scenario, world_size,
    **params)``, read from its recording where one is stored (recorded_traces.py ``records_of``); ``live=True``: the
    world run now, never recorded."""

    def records(scenario, world_size: int = 2, live: bool = False, **params) -> list:
        return recorded_traces.records_of(run_world, backend, scenario, world_size, live, **params)

    return records

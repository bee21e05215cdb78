"""The trace's recorded worlds (tests/tooling/trace/recorded_traces.py) cannot go stale silently.

- ``test_trace_recordings_exist`` (default run): at least one trace recording is stored, so the trace's tests read
  recorded worlds and do not start their worlds live unnoticed.
- ``test_a_stored_trace_recording_is_what_its_scenario_records_now`` (integration, CI runs it): each stored trace
  recording is recorded again from its scenario, live, and compared with the stored file, field by field but the
  volatile ones (``recordings.VOLATILE``: each event's wall-clock time; temporary folders, ports); a difference fails
  with a unified diff of the two files, and pytest-regressions' ``--regen-all`` rewrites the file instead.

A recording made on another release is not compared (its tests run the world live on this release).
"""

import os

import pytest

from tests.support import recordings
from tests.tooling.trace import recorded_traces

pytestmark = pytest.mark.not_a_fact("a test of the recorded worlds the trace's tests read, not a fact about DDP")

TRACES = recordings.stored(recorded_traces.TOOL)


def _name(path: str) -> str:
    return os.path.basename(path)[: -len(".json")]


def test_trace_recordings_exist():
    """The trace's tests of grouping and wording are read from recordings: at least one is stored (an empty folder
    would make the test below collect nothing and every traced world run live in the default run unnoticed)."""
    folder = os.path.join(recordings.FOLDER, recorded_traces.TOOL)
    assert TRACES, f"no trace recording in {folder}; record them: python -m pytest -n 2 tests/tooling/trace --regen-all"


@pytest.mark.integration
@pytest.mark.parametrize("path", TRACES, ids=_name)
def test_a_stored_trace_recording_is_what_its_scenario_records_now(path, file_regression):
    """Recorded live again from its ``scenario`` (up to ``recordings.ATTEMPTS`` times: a hazard's world ends in
    one of a few ways), the recording equals the stored file but for the fields that differ run to run
    (pytest-regressions shows a diff where not; ``--regen-all`` rewrites it)."""
    recordings.check_rerecorded(path, recorded_traces.record, file_regression)

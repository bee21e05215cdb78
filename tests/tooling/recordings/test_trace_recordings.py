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


def _same_but_volatile(fresh_path, stored_path) -> None:
    """pytest-regressions' comparison of a fresh recording (``fresh_path``) with the stored one: equal but for the
    fields that differ run to run (tests/support/recordings.py ``stable``)."""
    diff = recordings.differences(str(stored_path), str(fresh_path))
    assert not diff, f"the fresh recording differs from the stored one beyond the volatile fields:\n{diff}"


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
    """Recorded live again from its ``scenario``, the recording equals the stored file (pytest-regressions shows a
    diff where not; ``--regen-all`` rewrites it)."""
    found = recordings.read(path)
    if found.get("recorded_on") != recordings.release():
        pytest.skip(
            f"recorded on {found.get('recorded_on')}, this run has {recordings.release()}: the tests that read it run "
            "the world live on this release"
        )
    fresh = recorded_traces.record(found["scenario"])
    file_regression.check(recordings.text_of(fresh), fullpath=path, check_fn=_same_but_volatile)

"""The guard's recorded worlds (tests/support/guard_recordings.py) cannot go stale silently.

- ``test_guard_recordings_exist`` (default run): at least one guard recording is stored, so the guard's tests read
  recorded worlds and do not start their worlds live unnoticed.
- ``test_a_stored_guard_recording_is_what_its_scenario_records_now`` (integration, CI runs it): each stored guard
  recording is recorded again from its scenario, live (which also checks that its replay gives every rank's error as
  the live rank raised it), and compared with the stored file, field by field but the volatile ones
  (``recordings.VOLATILE``); a difference fails with a unified diff of the two files, and pytest-regressions'
  ``--regen-all`` rewrites the file instead.

A recording made on another release is not compared (its tests run the world live on this release).
"""

import os

import pytest

from tests.support import guard_recordings, recordings

pytestmark = pytest.mark.not_a_fact("a test of the recorded worlds the guard's tests read, not a fact about DDP")

GUARDS = recordings.stored(guard_recordings.TOOL)


def _name(path: str) -> str:
    return os.path.basename(path)[: -len(".json")]


def test_guard_recordings_exist():
    """The guard's hazard tests are read from recordings: at least one is stored (an empty folder would make the
    test below collect nothing and every hazard's world run live in the default run unnoticed)."""
    folder = os.path.join(recordings.FOLDER, guard_recordings.TOOL)
    assert GUARDS, f"no guard recording in {folder}; record them: python -m pytest -n 2 tests/tooling/guard --regen-all"


@pytest.mark.integration
@pytest.mark.parametrize("path", GUARDS, ids=_name)
def test_a_stored_guard_recording_is_what_its_scenario_records_now(path, file_regression):
    """Recorded live again from its ``scenario`` (up to ``recordings.ATTEMPTS`` times: a hazard's world ends in
    one of a few ways), the recording equals the stored file but for the fields that differ run to run
    (pytest-regressions shows a diff where not; ``--regen-all`` rewrites it)."""
    recordings.check_rerecorded(path, guard_recordings.record, file_regression)

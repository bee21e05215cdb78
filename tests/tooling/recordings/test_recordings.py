"""The recorded worlds (tests/support/recordings.py) cannot go stale silently, and the audit's reports on them are
reviewed as snapshots.

- ``test_a_stored_audit_recording_is_what_its_scenario_records_now`` (integration, CI runs it): each stored audit
  recording is recorded again from its scenario, live, and compared with the stored file, field by field but the
  volatile ones (``recordings.VOLATILE``); a difference fails with a unified diff of the two files, and
  pytest-regressions' ``--regen-all`` rewrites the file instead.
- ``test_the_report_of_a_recorded_audit_is_its_snapshot`` (default run, pure): the text report
  (``AuditResult.format()``) of each recording, replayed in this process, equals the snapshot stored beside it
  (``<recording>.report.txt``): a change of the audit's wording or verdicts shows as a diff of every report it
  touches, and ``--regen-all`` rewrites them.

Both read only recordings made on this run's releases; one of another release is not compared (its tests run the
audit live in this release's default run: tests/support/audit_runs.py).
"""

import os

import pytest

from tests.support import recordings
from tests.support.audit_runs import record, replay

pytestmark = pytest.mark.not_a_fact("a test of the recorded worlds the tooling tests read, not a fact about DDP")

AUDITS = recordings.stored("audit")


def _this_release(found: dict) -> None:
    if found.get("recorded_on") != recordings.release():
        pytest.skip(
            f"recorded on {found.get('recorded_on')}, this run has {recordings.release()}: the tests that read it run "
            "the audit live on this release"
        )


def _same_but_volatile(fresh_path, stored_path) -> None:
    """pytest-regressions' comparison of a fresh recording (``fresh_path``) with the stored one: equal but for the
    fields that differ run to run (tests/support/recordings.py ``stable``)."""
    diff = recordings.differences(str(stored_path), str(fresh_path))
    assert not diff, f"the fresh recording differs from the stored one beyond the volatile fields:\n{diff}"


def _name(path: str) -> str:
    return os.path.basename(path)[: -len(".json")]


def test_audit_recordings_exist():
    """The audit's tests are read from recordings: at least one is stored (an empty folder would make the tests
    below collect nothing and the tooling run live unnoticed)."""
    assert AUDITS, f"no audit recording in {os.path.join(recordings.FOLDER, 'audit')}; record them: {__doc__}"


@pytest.mark.integration
@pytest.mark.parametrize("path", AUDITS, ids=_name)
def test_a_stored_audit_recording_is_what_its_scenario_records_now(path, file_regression):
    """Recorded live again from its ``scenario``, the recording equals the stored file (pytest-regressions shows a
    diff where not; ``--regen-all`` rewrites it)."""
    found = recordings.read(path)
    _this_release(found)
    fresh = record(found["scenario"])
    file_regression.check(recordings.text_of(fresh), fullpath=path, check_fn=_same_but_volatile)


@pytest.mark.parametrize("path", AUDITS, ids=_name)
def test_the_report_of_a_recorded_audit_is_its_snapshot(path, file_regression):
    """The audit's report on the recording, replayed here (evidence, causes, wording), equals its snapshot."""
    found = recordings.read(path)
    _this_release(found)
    file_regression.check(replay(found).format() + "\n", fullpath=path[: -len(".json")] + ".report.txt")

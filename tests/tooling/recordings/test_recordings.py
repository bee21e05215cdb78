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


def _verdict(recording: dict) -> tuple:
    """What the audit concludes from ``recording``: its exit code and the kind of each problem (a finding's words
    before its first colon)."""
    result = replay(recording)
    return result.exit_code, sorted(f["problem"].split(":")[0] for f in result.findings)


def _name(path: str) -> str:
    return os.path.basename(path)[: -len(".json")]


def test_audit_recordings_exist():
    """The audit's tests are read from recordings: at least one is stored (an empty folder would make the tests
    below collect nothing and the tooling run live unnoticed)."""
    assert AUDITS, f"no audit recording in {os.path.join(recordings.FOLDER, 'audit')}; record them: {__doc__}"


@pytest.mark.integration
@pytest.mark.parametrize("path", AUDITS, ids=_name)
def test_a_stored_audit_recording_is_what_its_scenario_records_now(path, file_regression):
    """Recorded live again from its ``scenario`` (up to ``recordings.ATTEMPTS`` times: a hazard's world ends in
    one of a few ways), the recording equals the stored file but for the fields that differ run to run
    (pytest-regressions shows a diff where not; ``--regen-all`` rewrites it)."""
    recordings.check_rerecorded(path, record, file_regression, outcome=_verdict)


@pytest.mark.parametrize("path", AUDITS, ids=_name)
def test_the_report_of_a_recorded_audit_is_its_snapshot(path, file_regression):
    """The audit's report on the recording, replayed here (evidence, causes, wording), equals its snapshot."""
    found = recordings.read(path)
    _this_release(found)
    file_regression.check(replay(found).format() + "\n", fullpath=path[: -len(".json")] + ".report.txt")

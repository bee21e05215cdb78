"""The recorded worlds (tests/support/recordings.py) cannot go stale silently, and the audit's reports on them are
reviewed as snapshots. One module for the three tools that record: the audit (tests/support/audit_runs.py), the
guard (tests/support/guard_recordings.py) and the trace (tests/tooling/trace/recorded_traces.py).

- ``test_each_tool_has_recordings`` (default run): at least one recording of each tool is stored, so its tests read
  recorded worlds and do not start their worlds live unnoticed.
- ``test_a_stored_recording_is_what_its_scenario_records_now`` (integration, CI runs it): each stored recording is
  recorded again from its scenario, live (for the guard, which also checks that its replay gives every rank's error
  as the live rank raised it), and compared with the stored file but for what differs run to run
  (``recordings.check_rerecorded``); a difference fails with a unified diff of the two files, and
  pytest-regressions' ``--regen-all`` rewrites the file instead.
- ``test_the_report_of_a_recorded_audit_is_its_snapshot`` (default run, pure): the text report
  (``AuditResult.format()``) of each audit recording, replayed in this process, equals the snapshot stored beside
  it (``<recording>.report.txt``): a change of the audit's wording or verdicts shows as a diff of every report it
  touches, and ``--regen-all`` rewrites them.

All read only recordings made on this run's releases; one of another release is not compared (its tests run the
tool live in this release's default run).
"""

import os

import pytest

from tests.support import audit_runs, guard_recordings, recordings
from tests.tooling.trace import recorded_traces

pytestmark = pytest.mark.not_a_fact("a test of the recorded worlds the tooling tests read, not a fact about DDP")


def _verdict(recording: dict) -> tuple:
    """What the audit concludes from ``recording``: its exit code and the kind of each problem (a finding's words
    before its first colon). Not each key's row: in a world that raised by design, whether a rank logged a key
    before the error reached it depends on which rank's error came first, so the rows differ from run to run."""
    result = audit_runs.replay(recording)
    return result.exit_code, sorted(f["problem"].split(":")[0] for f in result.findings)


#: Each tool that records: how a scenario is recorded live, what the tool concludes from a recording of a world
#: that raised by design (``recordings.check_rerecorded``'s ``outcome``; None: compared field by field only), and
#: the tests that record it (what ``--regen-all`` runs).
TOOLS = {
    "audit": (audit_runs.record, _verdict, "tests/tooling"),
    guard_recordings.TOOL: (guard_recordings.record, None, "tests/tooling/guard"),
    recorded_traces.TOOL: (recorded_traces.record, None, "tests/tooling/trace"),
}
STORED = [(tool, path) for tool in TOOLS for path in recordings.stored(tool)]
AUDITS = recordings.stored("audit")


def _name(path: str) -> str:
    return os.path.basename(path)[: -len(".json")]


@pytest.mark.parametrize("tool", TOOLS)
def test_each_tool_has_recordings(tool):
    """The tool's tests are read from recordings: at least one is stored (an empty folder would make the tests
    below collect nothing and the tool's worlds run live in the default run unnoticed)."""
    folder = os.path.join(recordings.FOLDER, tool)
    assert recordings.stored(tool), (
        f"no {tool} recording in {folder}; record them: python -m pytest -n 2 {TOOLS[tool][2]} -m '' --regen-all"
    )


@pytest.mark.integration
@pytest.mark.parametrize(("tool", "path"), STORED, ids=[f"{tool}-{_name(path)}" for tool, path in STORED])
def test_a_stored_recording_is_what_its_scenario_records_now(tool, path, file_regression):
    """Recorded live again from its ``scenario`` (up to ``recordings.ATTEMPTS`` times: a hazard's world ends in
    one of a few ways), the recording equals the stored file but for the fields that differ run to run
    (pytest-regressions shows a diff where not; ``--regen-all`` rewrites it)."""
    record, outcome, _ = TOOLS[tool]
    recordings.check_rerecorded(path, record, file_regression, outcome=outcome)


@pytest.mark.parametrize("path", AUDITS, ids=_name)
def test_the_report_of_a_recorded_audit_is_its_snapshot(path, file_regression):
    """The audit's report on the recording, replayed here (evidence, causes, wording), equals its snapshot."""
    found = recordings.read(path)
    if found.get("recorded_on") != recordings.release():
        pytest.skip(
            f"recorded on {found.get('recorded_on')}, this run has {recordings.release()}: the tests that read it run "
            "the audit live on this release"
        )
    file_regression.check(audit_runs.replay(found).format() + "\n", fullpath=path[: -len(".json")] + ".report.txt")

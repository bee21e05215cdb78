"""The world budget (ddpprobe/plugin/_budget.py): the default run fails when the tests under ``world_budget_paths``
start more live worlds than ``world_budget``, naming each test that started one; tests marked ``integration`` and
tests outside those folders never count, and ``--world-budget 0`` turns it off.

The inner runs' tests stand in for a world with one step of the launcher's own count (``world_usage``'s
``worlds``): the budget counts exactly what that count says, so no real world is needed to check the tally."""

import pytest

from ddpprobe.plugin import _budget

pytestmark = pytest.mark.not_a_fact("tests the plugin's world budget, not a fact about DDP")

pytest_plugins = ["pytester"]

INNER = """
import pytest

from ddpprobe.launch import _message


def _start(n):
    _message._USAGE["worlds"] += n


def test_starts_two():
    _start(2)


def test_starts_none():
    pass


@pytest.mark.integration
def test_live_by_design():
    _start(5)
"""


def _inner(pytester, *args):
    if not (pytester.path / "rooms").exists():
        _layout(pytester)
    return pytester.runpytest_inprocess("-p", "ddpprobe.plugin.pytest_plugin", "-p", "no:cacheprovider", *args)


def _layout(pytester):
    pytester.makeini(
        """
[pytest]
markers = integration: live by design
world_budget = 1
world_budget_paths = rooms/audit
"""
    )
    pytester.mkpydir("rooms")
    (pytester.mkpydir("rooms/audit") / "test_counted.py").write_text(INNER)
    (pytester.mkpydir("rooms/other") / "test_elsewhere.py").write_text(INNER)


def test_a_test_counts_only_under_the_budgets_folders_and_unmarked():
    paths = ["tests/tooling/audit", "tests/tooling/guard/"]
    assert _budget.counted("tests/tooling/audit/test_a.py::test_x[2]", ["test_x"], paths)
    assert _budget.counted("tests/tooling/guard/sub/test_b.py::test_y", [], paths)
    assert not _budget.counted("tests/tooling/auditing/test_a.py::test_x", [], paths)
    assert not _budget.counted("tests/facts/test_f1.py::test_z", [], paths)
    assert not _budget.counted("tests/tooling/audit/test_a.py::test_x", ["integration"], paths)


def test_over_the_budget_the_message_names_the_total_the_budget_and_each_starter_most_first():
    worlds = {"t.py::a": 1, "t.py::b": 3, "t.py::c": 0}
    assert _budget.over_budget(worlds, 4) is None
    assert _budget.over_budget(worlds, None) is None and _budget.over_budget(worlds, 0) is None
    message = _budget.over_budget(worlds, 3)
    assert "started 4 live worlds, over the budget of 3" in message
    assert message.index("3  t.py::b") < message.index("1  t.py::a") and "t.py::c" not in message


def test_a_run_whose_counted_tests_start_more_worlds_than_the_budget_fails_naming_them(pytester):
    """Budget 1, and the counted test starts 2: the run fails (exit code 1) though every test passed; the test
    under another folder and the integration-marked one (run here with ``-m ''``) are not counted."""
    result = _inner(pytester, "-m", "")
    result.assert_outcomes(passed=6)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*started 2 live worlds, over the budget of 1*", "*2  rooms/audit/test_counted.py::test_starts_two"]
    )
    named = result.stdout.str().split("Tests that started worlds:")[1]
    assert "test_elsewhere" not in named and "test_live_by_design" not in named


def test_a_folder_named_like_the_integration_marker_does_not_exempt_its_tests(pytester):
    """A test under ``rooms/audit/integration/`` is unmarked: its folder's name is one of its keywords, not a
    marker, so its 2 worlds count and the run fails naming it."""
    _layout(pytester)
    (pytester.mkpydir("rooms/audit/integration") / "test_named.py").write_text(INNER)
    result = _inner(pytester, "-k", "named and starts_two")
    result.assert_outcomes(passed=1, deselected=8)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*2  rooms/audit/integration/test_named.py::test_starts_two"])


def test_within_the_budget_or_with_it_turned_off_the_run_passes(pytester):
    assert _inner(pytester, "-m", "", "--world-budget", "2").ret == pytest.ExitCode.OK
    assert _inner(pytester, "-m", "", "--world-budget", "0").ret == pytest.ExitCode.OK


@pytest.mark.integration
def test_under_xdist_the_workers_counts_reach_the_controller_and_fail_the_run(pytester):
    """The same inner run on two xdist workers: each test's count travels with its report."""
    _layout(pytester)
    result = pytester.runpytest_subprocess("-p", "ddpprobe.plugin.pytest_plugin", "-p", "no:cacheprovider", "-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*started 2 live worlds, over the budget of 1*"])

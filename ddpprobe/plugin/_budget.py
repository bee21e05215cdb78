"""A budget of live worlds the run enforces: the tests under given folders may start at most so many worlds.

The tests of a tool's reasoning read recorded worlds (tests/support/recordings.py) and start none; the few that
check a live run start real ones. A count of worlds is deterministic where a time is not, so the budget is a count:
each test's worlds (``ddpprobe.launch.world_usage``: every world its process launched, through the ``run_world``
fixture, the audit, the guard's runs or the trace; a world answered by a completed identical one is no new world)
travel with its teardown report (``user_properties`` entries ``ddpprobe_worlds`` and ``ddpprobe_markers``, so
pytest-xdist brings them to the controller), and at the session's end the run fails when the tests under the
budget's folders started more than the budget, naming each test that started one.

Settings (pyproject.toml ``[tool.pytest.ini_options]``, or ``-o``): ``world_budget`` (worlds; empty or 0: no
budget) and ``world_budget_paths`` (the folders whose tests count, relative to the rootdir). ``--world-budget N``
overrides the number for one run (0: off). Tests marked ``integration`` are live by design and never count.
"""

from __future__ import annotations

from typing import Iterable, Optional

#: The ``user_properties`` name of a test's count of worlds.
PROPERTY = "ddpprobe_worlds"
#: The ``user_properties`` name of a test's marker names (a test's keywords also hold its folders' and module's
#: names, so a folder named ``integration`` would pass for the marker).
MARKERS = "ddpprobe_markers"
#: The marker of tests that are live by design (the integration run), never counted.
LIVE_BY_DESIGN = "integration"


def counted(nodeid: str, markers: Iterable[str], paths: Iterable[str]) -> bool:
    """Whether a test's worlds count against the budget: it lies under one of ``paths`` (``tests/tooling/audit``
    ...) and is not marked :data:`LIVE_BY_DESIGN` (``markers``: the names of the markers on the test)."""
    if LIVE_BY_DESIGN in markers:
        return False
    file = nodeid.split("::", 1)[0]
    return any(file == p or file.startswith(p.rstrip("/") + "/") for p in paths)


def over_budget(worlds: dict, budget: Optional[int]) -> Optional[str]:
    """The failure message where ``worlds`` (``{nodeid: worlds started}``, the counted tests) exceed ``budget``,
    else None (also for no budget: None or 0). The message names the total, the budget and each test that started
    a world, most first, and the two ways back under it."""
    total = sum(worlds.values())
    if not budget or total <= budget:
        return None
    starters = sorted(((n, t) for t, n in worlds.items() if n), key=lambda x: (-x[0], x[1]))
    lines = "\n".join(f"  {n:3d}  {test}" for n, test in starters)
    return (
        f"the tests under world_budget_paths started {total} live worlds, over the budget of {budget} "
        "(world_budget in pyproject.toml): a test of reasoning or wording reads a recorded world "
        "(tests/support/recordings.py; record it with `pytest tests/tooling -m '' --regen-all`), a test whose claim "
        "is the live run beyond the budget goes to the integration run (@pytest.mark.integration). "
        f"Tests that started worlds:\n{lines}"
    )

"""Project-wide pytest set-up: ddpprobe's options (--backend, --world-size, --world-timeout, ...),
the ``run_world`` fixture and the ``gpu`` marker come from ``ddpprobe.plugin.pytest_plugin``; the semantics card
(--semantics-report, the ``semantics`` fixture, the ``not_a_fact`` marker) from ``ddpprobe.card.plugin``."""

pytest_plugins = ["ddpprobe.plugin.pytest_plugin", "ddpprobe.card.plugin"]


def pytest_configure(config):
    """The world budget (pyproject.toml ``world_budget``) holds where every recorded world of the tooling (the
    audit's, the guard's and the trace's, tests/support/recordings.py) was made on this release: where one was not,
    its tests run live, and the budget is off for the run."""
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker's tally never decides the run (the controller receives every report and enforces the
        # budget), so a worker keeps none and does not read every recording (about 0.3 s of its start-up).
        config.option.world_budget = 0
        return
    from tests.support import recordings

    if not all(recordings.of_this_release(tool) for tool in ("audit", "guard", "trace")):
        config.option.world_budget = 0

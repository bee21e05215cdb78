"""Project-wide pytest set-up: ddpprobe's options (--backend, --world-size, --world-timeout, ...),
the ``run_world`` fixture and the ``gpu`` marker come from ``ddpprobe.plugin.pytest_plugin``; the semantics card
(--semantics-report, the ``semantics`` fixture, the ``not_a_fact`` marker) from ``ddpprobe.card.plugin``."""

pytest_plugins = ["ddpprobe.plugin.pytest_plugin", "ddpprobe.card.plugin"]


def pytest_configure(config):
    """The world budget (pyproject.toml ``world_budget``) holds where the tooling's recorded worlds were made on this
    release (tests/support/recordings.py): on another, their tests run live, and the budget is off for the run."""
    from tests.support import recordings

    if not recordings.of_this_release("audit"):
        config.option.world_budget = 0

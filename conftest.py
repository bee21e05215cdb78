"""Project-wide pytest set-up: ddpprobe's options (--backend, --world-size, --world-timeout, ...),
the ``run_world`` fixture and the ``gpu`` marker come from ``ddpprobe.plugin.pytest_plugin``; the semantics card
(--semantics-report, the ``semantics`` fixture, the ``not_a_fact`` marker) from ``ddpprobe.card.plugin``."""

pytest_plugins = ["ddpprobe.plugin.pytest_plugin", "ddpprobe.card.plugin"]

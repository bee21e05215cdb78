"""Project-wide pytest set-up: ddpprobe's options (--backend, --world-size, --world-timeout, ...),
the ``run_world`` fixture and the ``gpu`` marker come from ``ddpprobe.pytest_plugin``."""

pytest_plugins = ["ddpprobe.pytest_plugin", "ddpprobe.report"]

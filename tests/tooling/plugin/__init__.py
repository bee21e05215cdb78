"""Tests of the pytest plugin's options and the run_if skip vocabulary (ddpprobe/plugin/pytest_plugin.py,
ddpprobe/plugin/runif.py)."""

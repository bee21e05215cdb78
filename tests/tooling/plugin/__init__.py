"""Tests of the pytest plugin's options and the run_if skip vocabulary (ddpprobe/pytest_plugin.py,
ddpprobe/runif.py)."""

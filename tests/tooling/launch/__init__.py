"""Tests of the launcher (ddpprobe/launch/): worlds, failures, isolation, settings, nodes, external and
shared worlds."""

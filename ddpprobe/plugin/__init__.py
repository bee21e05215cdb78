"""The pytest side of ddpprobe: the plugin, the skip vocabulary, and what the ``run_world`` fixture does between
a fact and the launcher (``ddpprobe.launch`` imports nothing of it, nor of pytest).

- ``pytest_plugin.py``: the pytest plugin (``pytest_plugins = ["ddpprobe.plugin.pytest_plugin"]``): options, the
  ``run_world`` fixture, ``run_if`` markers turned into skips at collection;
- ``runif.py``: ``run_if``, the one skip vocabulary (CUDA devices, the run's backend, a Lightning release range);
- ``_shared_worlds.py``: completed worlds shared within a session, their keys, and the log of worlds;
- ``_warm.py``: ``WarmPool``, the warm worlds of one pytest process (``--warm-worlds``), each a
  ``ddpprobe.launch.WarmWorld`` whose ranks stay up and run scenario after scenario;
- ``_test_code.py``: what a test's code says about its worlds (it waits for a timeout, it fails by design).

This package's ``__init__`` imports nothing, so ``from ddpprobe.plugin.runif import run_if`` loads no pytest.
"""

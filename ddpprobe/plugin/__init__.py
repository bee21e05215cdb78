"""The pytest side of ddpprobe: what the ``run_world`` fixture does between a fact and the launcher.

- ``_warm.py``: ``WarmPool``, the warm worlds of one pytest process (``--warm-worlds``), each a
  ``ddpprobe.launch.WarmWorld`` whose ranks stay up and run scenario after scenario.
"""

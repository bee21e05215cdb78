"""ddpprobe: executable answers to "what does PyTorch Lightning DDP synchronize, and what does it log?".

The rooms, each a package or module with its own docstring:

- :mod:`ddpprobe.launch` starts a world of rank processes (forked, spawned, or the ranks of a torchrun
  or srun world) and returns what each rank recorded, or raises ``RankFailed``/``RankDied``/``WorldTimeout``;
- :mod:`ddpprobe.probes` holds the LightningModules and scenarios that record what a rank saw;
- ``tests/facts/`` holds the facts: pytest cases that assert on those records;
- :mod:`ddpprobe.audit` runs a user's LightningModule at W=1 and W=N and reports which logged values are
  rank-local, wrong or unsafe under DDP (``python -m ddpprobe audit``; docs/audit.md);
- :mod:`ddpprobe.guard`: ``CollectiveGuard``, turns a collective hazard into a clear error at its first
  step (docs/guard.md);
- :mod:`ddpprobe.card` writes the semantics card (what one run of the facts established) and merges
  cards of several Lightning releases into the version matrix;
- :mod:`ddpprobe.plugin.runif`: the one skip vocabulary (``run_if``: CUDA devices, backend, Lightning release);
- :mod:`ddpprobe.plugin.pytest_plugin`: the pytest options, the ``run_world`` fixture and ``run_if`` turned into
  skips at collection (the card's own plugin is :mod:`ddpprobe.card.plugin`).

The Lightning package every room imports (``pytorch_lightning`` or ``lightning.pytorch``) is chosen once,
in ``ddpprobe/_lightning.py``. Here: the launcher's public names users need (``run_world`` and its results
and errors), imported from :mod:`ddpprobe.launch` on first use, so that a training job's ``import
ddpprobe.guard`` loads the guard, the trace and the hazard registry only (tests/tooling/guard/test_guard_import.py).
"""

import importlib


def __getattr__(name: str):
    if name in __all__:
        value = getattr(importlib.import_module("ddpprobe.launch"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ddpprobe' has no attribute {name!r}")


__all__ = [
    "RankDied",
    "RankFailed",
    "RankInfo",
    "RankResult",
    "WorldError",
    "WorldResult",
    "WorldTimeout",
    "run_world",
]

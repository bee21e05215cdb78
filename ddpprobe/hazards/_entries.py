"""The registry: every :class:`Hazard` by name (values first, then collectives), and what Lightning 2.x does with
a removed 1.x hook.

Each entry names the fact tests that prove its cause and its fix; ``tests/tooling/audit/test_audit_registry.py``
checks that every named test exists, that every entry is recognised by the audit (or the guard) on a module
that has the hazard, and that docs/audit.md's table of entries is current.
"""

from __future__ import annotations

from ddpprobe.hazards._collectives import COLLECTIVES
from ddpprobe.hazards._hazard import Hazard
from ddpprobe.hazards._values import VALUES

__all__ = ["HAZARDS", "REMOVED_HOOKS", "Hazard"]

#: Every entry by name: the values first, then the collectives.
HAZARDS = {h.name: h for h in (*VALUES, *COLLECTIVES)}

#: Lightning 1.x hooks removed in 2.0, and what 2.x does with a module that still defines one.
#: Source: pytorch_lightning/trainer/configuration_validator.py (``*_epoch_end`` raise
#: ``NotImplementedError``; ``*_step_end`` are no longer looked up, so they are never called);
#: Lightning-AI/pytorch-lightning PR #16520 (epoch_end) and #16791 (step_end); the facts of
#: tests/facts/test_removed_hooks.py.
REMOVED_HOOKS = {
    "training_epoch_end": "raises NotImplementedError in fit; use on_train_epoch_end and keep outputs yourself",
    "validation_epoch_end": "raises NotImplementedError in fit/validate; use on_validation_epoch_end",
    "test_epoch_end": "raises NotImplementedError in test; use on_test_epoch_end",
    "training_step_end": "silently never called; move its code into training_step",
    "validation_step_end": "silently never called; move its code into validation_step",
    "test_step_end": "silently never called; move its code into test_step",
}

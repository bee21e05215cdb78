"""Hooks from Lightning 1.x that no longer work in 2.x, and what happens to code that still defines them.

The seed's answers often say "use ``validation_step_end``" or "``validation_epoch_end`` receives the
outputs". In Lightning 2.x the first is silently ignored and the second is an error.
Source: pytorch_lightning/trainer/configuration_validator.py ``__verify_eval_loop_configuration``;
the removals are Lightning-AI/pytorch-lightning PR #16520 (epoch_end) and #16791 (step_end).
These facts apply to pytorch-lightning >=2.0; on 1.x both hooks run, and what they receive under ddp
is in ``tests/facts/test_lightning_1x_hooks.py``.
"""

import math

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import hooks

pytestmark = run_if(lightning=">=2.0")


def test_defining_validation_epoch_end_raises_not_implemented_error_on_every_rank(run_world, semantics):
    """A module that defines ``validation_epoch_end`` makes ``trainer.validate`` raise
    ``NotImplementedError`` naming the hook (before any ``validation_step`` runs), on every rank."""
    world = run_world(hooks.removed_hook, 2, hook="validation_epoch_end")
    semantics.number(
        "ranks raising NotImplementedError",
        sum(rec["raised"] == "NotImplementedError" for rec in world.records),
        vs=("world size", 2),
    )

    for rec in world.records:
        assert rec["raised"] == "NotImplementedError", rec
        assert "validation_epoch_end" in rec["message"] and "on_validation_epoch_end" in rec["message"]
        assert rec["calls"] == {"validation_step": 0, "validation_step_end": 0, "validation_epoch_end": 0}


def test_defining_validation_step_end_is_silently_never_called(run_world, semantics):
    """A module that defines ``validation_step_end`` validates without error or warning, and the hook is
    called zero times on every rank while ``validation_step`` runs for each of the rank's batches."""
    n, batch_size = 6, 2
    world = run_world(hooks.removed_hook, 2, hook="validation_step_end", n=n, batch_size=batch_size)

    batches_per_rank = math.ceil(math.ceil(n / 2) / batch_size)
    semantics.number(
        "validation_step_end calls on rank 0",
        world.records[0]["calls"]["validation_step_end"],
        vs=("validation_step calls", world.records[0]["calls"]["validation_step"]),
    )
    for rec in world.records:
        assert rec["raised"] is None, rec
        assert rec["calls"]["validation_step"] == batches_per_rank
        assert rec["calls"]["validation_step_end"] == 0

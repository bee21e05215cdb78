"""What happens under DDP when the loss does not use every parameter? Every rank fails at the second step
with Lightning's advice; ``DDPStrategy(find_unused_parameters=True)`` trains the same module.

DDP's reducer expects a gradient for every parameter it wraps; a parameter without one leaves the
reduction of the first step unfinished, and the next forward raises on every rank (torch/nn/parallel/
distributed.py ``_check_previous_reduction``); Lightning rewords the error with the flag to set
(pytorch_lightning/strategies/ddp.py).

The module is ``Linear(2, 1)`` on ``RegressionDataset`` (ddpprobe/probes/gradients_and_weights.py).
"""

import pytest

from ddpprobe.probes import gradients_and_weights
from tests.support import oracle


@pytest.mark.mirrors(
    "tests_pytorch/strategies/test_ddp_integration.py::test_find_unused_parameters_ddp_exception",
    "tests_pytorch/strategies/test_ddp_integration.py::test_find_unused_parameters_ddp_spawn_raises",
)
def test_a_parameter_the_loss_does_not_use_fails_every_rank_at_the_second_step_with_lightnings_advice(
    run_world, semantics
):
    """A module with a ``Linear`` its loss never uses, under ``DDPStrategy(find_unused_parameters=False)``
    (the default): the first training step runs, and the second forward raises on every rank, with
    DDP's "Expected to have finished reduction in the prior iteration" replaced by Lightning's message
    naming ``strategy='ddp_find_unused_parameters_true'``. Mirrors Lightning's
    tests_pytorch/strategies/test_ddp_integration.py::test_find_unused_parameters_ddp_exception and
    ::test_find_unused_parameters_ddp_spawn_raises (one rank). Source: pytorch_lightning/strategies/ddp.py
    ``DDPStrategy.on_exception`` (``_augment_message``); torch/nn/parallel/distributed.py
    ``_pre_forward`` (``_check_previous_reduction``)."""
    world_size = 2
    world = run_world(gradients_and_weights.fit_unused, world_size, find_unused_parameters=False)

    outcome = [(rec["steps"], rec["raised"]) for rec in world.records]
    assert outcome == [(1, "RuntimeError")] * world_size, oracle.side_by_side("steps run, raised", outcome)
    for rec in world.records:
        assert rec["message"].startswith("It looks like your LightningModule has parameters that were not used"), rec
        assert "ddp_find_unused_parameters_true" in rec["message"], rec["message"]
    semantics.number("training steps before the error", outcome[0][0], vs=("max_steps", 3))


@pytest.mark.mirrors("tests_pytorch/strategies/test_ddp_integration.py::test_find_unused_parameters_ddp_exception")
def test_with_find_unused_parameters_true_the_same_module_trains_every_step(run_world, semantics):
    """The fix Lightning's message names: ``DDPStrategy(find_unused_parameters=True)`` lets the same module
    run all three steps on every rank. Source: torch/nn/parallel/distributed.py
    (``find_unused_parameters`` marks the unused parameters ready after each backward)."""
    world_size = 2
    world = run_world(gradients_and_weights.fit_unused, world_size, find_unused_parameters=True)

    outcome = [(rec["steps"], rec["raised"]) for rec in world.records]
    assert outcome == [(3, None)] * world_size, oracle.side_by_side("steps run, raised", outcome)
    semantics.number("training steps", outcome[0][0], vs=("without find_unused_parameters", 1))

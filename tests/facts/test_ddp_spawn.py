"""``ddp_spawn``: what the process that calls ``trainer.fit`` or ``trainer.predict`` gets back when
Lightning starts the ranks itself (``DDPStrategy(start_method="spawn")``, what ``strategy="ddp_spawn"``
and notebooks use), as Lightning's own tests assert it, in real worlds.

The ranks run in new processes; when they end, rank 0 sends back its weights (through a checkpoint
file), the trainer's state and its ``callback_metrics``, and the other ranks send nothing
(pytorch_lightning/strategies/launchers/multiprocessing.py ``_MultiProcessingLauncher._collect_rank_zero_results``
and ``_recover_results_in_main_process``). Each spawned rank sets ``OMP_NUM_THREADS`` to
``max(1, CPUs // ranks)`` when it is unset (lightning_fabric/utilities/distributed.py
``_set_num_threads_if_needed``).

The ``ddp_spawn`` scenarios (ddpprobe/probes/ddp_spawn.py) run in a world of one process that looks
like a plain script (no rank variables), so Lightning starts two ranks on a loopback port.
"""

import re

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import ddp_spawn
from tests.support import oracle

#: CPU facts (``ddp_spawn`` here starts gloo ranks on CPU whatever the run's backend) that start fresh
#: interpreters, seconds each: left out of the default run, run by ``pytest -m integration``.
pytestmark = [run_if(backend="gloo"), pytest.mark.integration]


@pytest.mark.mirrors(
    "tests_pytorch/strategies/test_ddp_integration.py::test_ddp_spawn_add_get_queue",
    "tests_pytorch/strategies/launchers/test_multiprocessing.py::test_collect_rank_zero_results",
    "tests_fabric/utilities/test_distributed.py::test_set_num_threads_if_needed",
)
def test_after_ddp_spawn_fit_the_caller_gets_rank_0s_callback_metrics_and_trained_weights_but_not_its_step_count(
    run_world, semantics
):
    """``trainer.fit`` under ``ddp_spawn`` with 2 ranks returns None in the calling process, which then
    holds rank 0's ``callback_metrics`` (an unsynced ``rank_value`` logged as ``global_rank + 1`` reads 1.0,
    rank 1's 2.0 never arrives) and the trained weights (they differ from the ones it passed in), while
    its ``trainer.global_step`` stays 0: the loops' progress is not sent back, only the trainer's
    status. The spawned rank 0 found ``OMP_NUM_THREADS`` set to ``max(1, CPUs // 2)`` (it was unset in the
    caller). Mirrors Lightning's
    tests_pytorch/strategies/test_ddp_integration.py::test_ddp_spawn_add_get_queue and
    strategies/launchers/test_multiprocessing.py::test_collect_rank_zero_results (mocked), and
    tests_fabric/utilities/test_distributed.py::test_set_num_threads_if_needed (mocked). Source:
    multiprocessing.py ``_MultiProcessingLauncher`` (``_collect_rank_zero_results``, ``get_extra_results``,
    ``_recover_results_in_main_process``, ``_wrapping_function`` -> ``_set_num_threads_if_needed``)."""
    devices, n = 2, 8
    world = run_world(ddp_spawn.spawn_fit, 1, devices=devices, n=n, timeout=480)

    rec = world.records[0]
    threads = max(1, rec["cpus"] // devices)
    oracle.assert_distinct(rank0_value=1.0, rank1_value=2.0)
    oracle.assert_distinct(threads_set=threads, unset=-1.0)
    assert rec["returned"] == "None", rec["returned"]
    assert rec["callback_metrics"] == {"omp_threads": float(threads), "rank_value": 1.0}, rec["callback_metrics"]
    assert rec["final"] != pytest.approx(rec["initial"]), f"weights came back untrained: {rec['final']}"
    assert rec["global_step"] == 0, rec["global_step"]
    semantics.number("rank_value in the caller", rec["callback_metrics"]["rank_value"], vs=("rank 1's", 2.0))


@pytest.mark.mirrors("tests_pytorch/trainer/test_trainer.py::test_spawn_predict_return_predictions")
def test_predict_with_return_predictions_under_ddp_spawn_reaches_the_caller_as_process_raised_exception(
    run_world, semantics
):
    """``trainer.predict(..., return_predictions=True)`` under ``ddp_spawn`` starts the ranks, and each
    spawned rank raises ``MisconfigurationException: `return_predictions` should be set to `False` when
    using the strategies that spawn or fork``; the caller gets torch's ``ProcessRaisedException`` carrying
    that text, not the ``MisconfigurationException`` itself. Which rank's error it carries is the first to
    fail (``ProcessContext.join`` reports the first process that ended with an error), so the fact asserts a
    spawned rank, not which one. Mirrors Lightning's
    tests_pytorch/trainer/test_trainer.py::test_spawn_predict_return_predictions, which expects the same
    ``ProcessRaisedException`` matching "`return_predictions` should be set to `False`". Source:
    pytorch_lightning/loops/prediction_loop.py ``_PredictionLoop.return_predictions`` (set in
    ``Trainer._predict_impl``, which runs inside the launcher); torch/multiprocessing/spawn.py
    ``ProcessContext.join``."""
    world = run_world(ddp_spawn.spawn_predict, 1, devices=2, return_predictions=True, timeout=480)

    rec = world.records[0]
    assert rec["raised"] == "ProcessRaisedException", rec
    assert re.search(r"-- Process [01] terminated with the following error", rec["message"]), rec["message"]
    assert "MisconfigurationException: `return_predictions` should be set to `False`" in rec["message"]
    semantics.number(
        "exception in the caller", rec["raised"], vs=("what the spawned ranks raised", "MisconfigurationException")
    )

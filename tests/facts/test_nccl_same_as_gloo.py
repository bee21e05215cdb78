"""Do the facts whose Lightning test runs only on two GPUs hold over NCCL? Their twins: the same scenario and the
same assertions, on CUDA devices over NCCL. They run with ``--backend nccl`` on a machine with at least
two CUDA devices (``run_if(min_gpus=2, backend="nccl")``) and skip elsewhere with that reason; their gloo
statements, which run everywhere, are the facts each twin names.

Lightning's tests these mirror carry ``@RunIf(min_cuda_gpus=2)`` (tests/tests_pytorch/...); each twin's
docstring names the one it mirrors.
"""

import pytest

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import gradients_and_weights
from tests.facts import (
    test_gradients_and_weights as gradients,
    test_logged_metrics_reset_aliases_and_dtypes as metrics,
    test_loggers_progress_bar_profiler_per_rank as loggers,
    test_stopping_checkpoints_and_schedules as training,
)

pytestmark = run_if(min_gpus=2, backend="nccl")


@pytest.mark.mirrors("tests_pytorch/strategies/test_ddp_integration.py::test_ddp_gradients_synced")
def test_manual_backward_averages_gradients_over_two_gpus(run_world, semantics):
    """test_gradients_and_weights.py::test_manual_backward_averages_gradients_over_ranks_before_the_optimizer_step
    at W=2 over NCCL. Mirrors tests_pytorch/strategies/test_ddp_integration.py::test_ddp_gradients_synced."""
    gradients.test_manual_backward_averages_gradients_over_ranks_before_the_optimizer_step(run_world, semantics, 2)


@pytest.mark.mirrors("tests_pytorch/utilities/test_all_gather_grad.py::test_all_gather_sync_grads")
def test_all_gather_with_sync_grads_sums_the_gradients_over_two_gpus(run_world, semantics):
    """test_gradients_and_weights.py::test_all_gather_with_sync_grads_gives_each_rank_the_sum_over_ranks_of_the_gradients_of_its_slice
    at W=2 over NCCL. Mirrors tests_pytorch/utilities/test_all_gather_grad.py::test_all_gather_sync_grads."""
    gradients.test_all_gather_with_sync_grads_gives_each_rank_the_sum_over_ranks_of_the_gradients_of_its_slice(
        run_world, semantics, 2
    )


@pytest.mark.mirrors("tests_pytorch/core/test_metric_result_integration.py::test_result_reduce_ddp")
def test_a_logged_metric_is_reset_at_each_epoch_end_on_two_gpus(run_world, semantics):
    """test_logged_metrics_reset_aliases_and_dtypes.py::test_a_logged_metric_is_reset_at_each_epoch_end_while_an_unlogged_one_keeps_growing
    over NCCL. Mirrors tests_pytorch/core/test_metric_result_integration.py::test_result_reduce_ddp."""
    metrics.test_a_logged_metric_is_reset_at_each_epoch_end_while_an_unlogged_one_keeps_growing(run_world, semantics)


@pytest.mark.mirrors("tests_pytorch/trainer/logging_/test_train_loop_logging.py::test_logging_sync_dist_true_ddp")
def test_step_level_reduce_fx_and_its_aliases_reduce_across_two_gpus(run_world, semantics):
    """test_logged_metrics_reset_aliases_and_dtypes.py::test_a_step_level_synced_value_is_reduced_across_ranks_with_reduce_fx_and_its_case_insensitive_aliases
    at W=2 over NCCL. Mirrors tests_pytorch/trainer/logging_/test_train_loop_logging.py::
    test_logging_sync_dist_true_ddp."""
    metrics.test_a_step_level_synced_value_is_reduced_across_ranks_with_reduce_fx_and_its_case_insensitive_aliases(
        run_world, semantics, 2
    )


@pytest.mark.mirrors(
    "tests_pytorch/callbacks/progress/test_tqdm_progress_bar.py::test_progress_bar_max_val_check_interval_ddp"
)
def test_the_progress_bar_counts_one_ranks_batches_on_two_gpus(run_world, semantics):
    """test_loggers_progress_bar_profiler_per_rank.py::test_the_progress_bar_runs_on_global_rank_0_only_and_counts_one_ranks_batches
    over NCCL. Mirrors tests_pytorch/callbacks/progress/test_tqdm_progress_bar.py::
    test_progress_bar_max_val_check_interval_ddp."""
    loggers.test_the_progress_bar_runs_on_global_rank_0_only_and_counts_one_ranks_batches(run_world, semantics)


@pytest.mark.mirrors("tests_pytorch/profilers/test_profiler.py::test_pytorch_profiler_trainer_ddp")
def test_the_profiler_writes_one_file_per_gpu(run_world, semantics):
    """test_loggers_progress_bar_profiler_per_rank.py::test_the_profiler_writes_one_file_per_rank_named_by_its_local_rank
    on one node of two GPUs over NCCL. Mirrors
    tests_pytorch/profilers/test_profiler.py::test_pytorch_profiler_trainer_ddp."""
    got = loggers.profiler_files(run_world, 2, 1)
    semantics.number("profiler files on two GPUs", sum(len(files) for _, _, files in got), vs=("ranks", 2))


@pytest.mark.mirrors("tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_top_k_ddp")
def test_a_step_level_monitor_keeps_the_top_k_steps_on_two_gpus(run_world, semantics):
    """test_stopping_checkpoints_and_schedules.py::test_a_step_level_monitor_keeps_the_top_k_steps_of_the_synced_value_and_rank_0_writes_them
    over NCCL. Mirrors tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_top_k_ddp."""
    training.test_a_step_level_monitor_keeps_the_top_k_steps_of_the_synced_value_and_rank_0_writes_them(
        run_world, semantics
    )


@pytest.mark.mirrors(
    "tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py::test_model_checkpoint_ddp_monitor_none"
)
def test_without_a_monitor_rank_0_keeps_the_last_checkpoint_on_two_gpus(run_world, semantics):
    """test_stopping_checkpoints_and_schedules.py::test_without_a_monitor_every_rank_names_the_last_epochs_checkpoint_and_rank_0_keeps_only_it
    over NCCL. Mirrors test_checkpoint_callback_frequency.py::test_model_checkpoint_ddp_monitor_none."""
    training.test_without_a_monitor_every_rank_names_the_last_epochs_checkpoint_and_rank_0_keeps_only_it(
        run_world, semantics
    )


@pytest.mark.mirrors(
    "tests_pytorch/parity_pytorch/test_sync_batchnorm_parity.py::test_sync_batchnorm_parity",
    "tests_pytorch/strategies/test_ddp.py::test_ddp_dont_configure_sync_batchnorm",
)
def test_sync_batchnorm_runs_in_fit_and_is_reverted_to_batchnorm_when_fit_returns_on_two_gpus(run_world, semantics):
    """GPU only (``SyncBatchNorm`` needs CUDA): with ``Trainer(sync_batchnorm=True)`` the training steps run
    ``SyncBatchNorm`` on every rank, and when ``fit`` returns the module holds a ``BatchNorm1d`` again; a
    ``validate`` after it runs ``BatchNorm1d``. Mirrors Lightning's tests_pytorch/parity_pytorch/
    test_sync_batchnorm_parity.py::test_sync_batchnorm_parity (the revert) and strategies/test_ddp.py::
    test_ddp_dont_configure_sync_batchnorm. Source: pytorch_lightning/strategies/ddp.py ``DDPStrategy.setup``
    and ``teardown`` (``self._layer_sync.revert``); pytorch_lightning/plugins/layer_sync.py ``TorchSyncBatchNorm``."""
    world_size = 2
    world = run_world(gradients_and_weights.batchnorm_classes, world_size, stages=["fit", "validate"])

    want = {
        "during": {"fit": ["SyncBatchNorm"], "validate": ["BatchNorm1d"]},
        "after": {"fit": "BatchNorm1d", "validate": "BatchNorm1d"},
    }
    assert world.records == [want] * world_size, world.records
    semantics.number("layer class after fit", world.records[0]["after"]["fit"], vs=("during fit", "SyncBatchNorm"))

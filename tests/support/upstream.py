"""Known upstream bugs, each a strict ``xfail`` marker that names the issue: a fact wearing it asserts the
*correct* behaviour, so the marker's XPASS turns the suite red the day the bug is fixed.

Next to each such fact stands its companion, wearing the bug's ``..._TODAY`` marker: it asserts the wrong
value the bug gives today, computed from the data, so the xfail's "bug still present" means *this* bug
and not any other failure. It holds while the bug is present and fails, with the xfail's XPASS, the day
the bug is fixed; the two then go together."""

import pytest

#: Lightning-AI/pytorch-lightning#21859: ``_ResultMetric.compute`` mean-syncs the int64
#: ``cumulated_batch_size`` with integer arithmetic (floored), inflating a synced epoch mean whenever the
#: ranks' batch-size totals do not sum to a multiple of W (fix proposed in PR #21839).
#: Source: pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultMetric.compute``.
FLOORED_COUNT_BUG = pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="https://github.com/Lightning-AI/pytorch-lightning/issues/21859: the int64 cumulated_batch_size "
    "is mean-synced in integer arithmetic (floored), inflating the epoch mean (fix proposed in PR #21839)",
)

#: Worn by the companions of the facts wearing ``FLOORED_COUNT_BUG``: they assert today's value,
#: ``(sum(v*b) / W) / floor(sum(b) / W)`` (``oracle.floored_sync_mean``), computed from the logged values.
FLOORED_COUNT_TODAY = pytest.mark.upstream_bug_today("https://github.com/Lightning-AI/pytorch-lightning/issues/21859")

#: Lightning-AI/pytorch-lightning#19604 and #21264: ``TQDMProgressBar.on_train_epoch_end`` reads
#: ``trainer.progress_bar_metrics`` on global rank 0 only (``ProgressBar.setup`` disables the bar elsewhere),
#: which syncs the epoch values there before the module's ``on_train_epoch_end``: a collective in that hook
#: pairs with the bar's sync on rank 0. Source: pytorch_lightning/callbacks/progress/tqdm_progress.py.
PROGRESS_BAR_SYNC_BUG = pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="https://github.com/Lightning-AI/pytorch-lightning/issues/19604 and #21264: TQDMProgressBar"
    ".on_train_epoch_end reads progress_bar_metrics on global rank 0 only, which syncs the epoch values there "
    "before the module's on_train_epoch_end",
)

"""The audit explains what it found from the evidence the ranks recorded, and each fix fits the case.

Each test runs ``ddpprobe audit`` on a small module of tests/support/audit_modules.py that makes one kind
of mistake (or none), and checks the verdict, the cause and the fix against what the data say: which
samples each rank ran (``tests/support/oracle.py``), which collectives each rank made from which line,
and what each value should be.
"""

import functools
import inspect

import pytest

from ddpprobe.audit import audit
from tests.support import oracle
from tests.support.worlds import skip_unless_runnable

pytestmark = pytest.mark.not_a_fact("tests the audit's diagnoses, not a fact about DDP")

MODULES = "tests.support.audit_modules"

#: Seconds a world of these small modules may run; a collective that never completes fails after half.
TIMEOUT = 40.0
#: The same for a world that is expected to hang in a collective: it ends at the process-group timeout.
HANG_TIMEOUT = 12.0

#: Lightning's default ``num_sanity_val_steps``: validation batches each rank runs before ``fit`` trains.
SANITY_STEPS = 2


@functools.lru_cache(maxsize=None)
def _audit(model: str, data: str, stage: str = "validate", timeout: float = TIMEOUT, max_epochs: int = 1):
    skip_unless_runnable("gloo", 2)
    return audit(
        f"{MODULES}:{model}",
        f"{MODULES}:{data}" if data else None,
        world_size=2,
        stage=stage,
        timeout=timeout,
        max_epochs=max_epochs,
    )


def _line_of(cls, method: str, text: str) -> str:
    """``"audit_modules.py:<line> in <method>"``: the line of ``cls.method`` that holds ``text``."""
    lines, start = inspect.getsourcelines(getattr(cls, method))
    offset = next(i for i, line in enumerate(lines) if text in line)
    return f"audit_modules.py:{start + offset} in {method}"


# --- 1. fit: the sanity check is counted apart ------------------------------------------------------


def test_fit_counts_the_sanity_check_apart_so_no_sample_is_called_repeated():
    """``--stage fit`` of 8 validation samples over 2 epochs at W=2: each validation epoch, each rank runs its
    ``DistributedSampler`` shard once (4 samples, no sample on two ranks); the sanity check's 2 batches per
    rank ran before training and are counted apart, so no sample is called repeated."""
    n, world_size, batch_size, epochs = 8, 2, 2, 2
    result = _audit("make_mean_model", "make_fit_8", "fit", max_epochs=epochs)

    shards = [oracle.shard(n, world_size, r) for r in range(world_size)]
    val = result.counts["val"]
    assert val["samples"] == [len(s) for s in shards] and val["duplicates"] == 0, val
    assert val["epochs"] == [epochs] * world_size
    sanity = [min(SANITY_STEPS, len(oracle.batches(s, batch_size))) for s in shards]
    assert val["sanity_batches"] == sanity, val
    text = " ".join(result.format().split())
    assert "repeated" not in text and "ran twice" in text and "counted apart" in text, text
    assert result.exit_code == 0, text

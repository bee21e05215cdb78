"""Half precision in synced logs: Lightning casts a float16 value to float32 before it syncs it; a plain
all_reduce of the same float16 tensor sums in float16 and overflows.

``_ResultMetric.update`` converts every logged tensor whose dtype is not float32 or float64 to the
default dtype (``value.to(_get_default_dtype())``, float32 here) *before* the step sync
(``self.meta.sync(value.clone())``) and before accumulating the epoch value, whose state is float32 too
(``add_state("value", torch.tensor(default, dtype=_get_default_dtype()), ...)``). So a float16 value
logged with ``sync_dist=True`` is summed across ranks in float32, at step and at epoch level, and
``trainer.logged_metrics`` hold float32. ``torch.distributed.all_reduce`` of a float16 tensor keeps
float16 (gloo sums half values), and float16's largest finite number is 65504: a sum over ranks past
it is ``inf`` on every rank, with no error.

Rank ``r`` logs ``half_value(r)`` = ``2 ** 15 + 2 ** 12 * (2 ** r - 1)`` (32768, 36864, 45056: exact in
float16) as a float16 0-d tensor, once (one sample per rank). The probe is
ddpprobe/probes/hidden_collectives.py (``half_precision``).
Sources: pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultMetric.__init__``,
``_ResultMetric.update``; lightning_fabric/utilities/distributed.py ``_sync_ddp``.
"""

import math
import re

import pytest

from ddpprobe.probes import hidden_collectives as hidden
from tests.support import oracle

#: float16's largest finite number.
FLOAT16_MAX = 65504.0


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_float16_value_logged_with_sync_dist_is_synced_in_float32_and_does_not_overflow(
    run_world, semantics, world_size
):
    """``self.log(key, float16_value, on_step=True, on_epoch=True, sync_dist=True)`` with
    ``reduce_fx="mean"`` and ``"sum"``: the step and epoch values in ``logged_metrics`` are float32 and
    equal the mean and the sum over the ranks' values, although the sum is past float16's range."""
    world = run_world(hidden.half_precision, world_size)

    values = [hidden.half_value(r) for r in range(world_size)]
    total, mean = sum(values), sum(values) / world_size
    assert total > FLOAT16_MAX
    oracle.assert_distinct(sum=total, mean=mean, **{f"rank{r}": v for r, v in enumerate(values)})
    expected = {"half_mean_step": mean, "half_mean_epoch": mean, "half_sum_step": total, "half_sum_epoch": total}
    given = [rec["value_dtype"] for rec in world.records]
    assert given == ["float16"] * world_size, oracle.side_by_side("dtype given to self.log", given)
    got = [rec["logged"] for rec in world.records]
    semantics.number("half_sum_step", got[0]["half_sum_step"], vs=("float16 max", FLOAT16_MAX))
    assert got == [pytest.approx(expected, rel=1e-6)] * world_size, oracle.side_by_side("logged", got)
    assert [rec["logged_dtypes"] for rec in world.records] == [
        {key: "float32" for key in sorted(expected)}
    ] * world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_plain_all_reduce_of_the_same_float16_tensor_overflows_to_inf_on_every_rank(run_world, semantics, world_size):
    """``torch.distributed.all_reduce(float16_tensor)`` (SUM) on every rank: the result stays float16 and
    is ``inf`` on every rank, with no error or warning, since the sum (69632 at W = 2) is past 65504.
    Cast to float32 first (as Lightning does) to sum large half values."""
    world = run_world(hidden.half_precision, world_size)

    total = sum(hidden.half_value(r) for r in range(world_size))
    got = [rec["plain"] for rec in world.records]
    semantics.number("float16 all_reduce", got[0]["value"], vs=("the sum", total))
    assert total > FLOAT16_MAX
    assert all(p["dtype"] == "float16" and math.isinf(p["value"]) and p["value"] > 0 for p in got), (
        oracle.side_by_side("all_reduce", got) + f"   the sum {total}"
    )
    about_it = [
        [w["message"] for w in rec["warnings"] if re.search(r"float16|half|overflow|\binf\b", w["message"], re.I)]
        for rec in world.records
    ]
    assert about_it == [[]] * world_size, oracle.side_by_side("warnings", about_it)

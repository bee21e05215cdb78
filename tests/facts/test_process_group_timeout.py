"""Does ``DDPStrategy(timeout=...)`` reach the process group: how long does a collective wait for a rank
that never joins it?

Lightning keeps the strategy's ``timeout`` and passes it to ``torch.distributed.init_process_group`` when
it creates the group (pytorch_lightning/strategies/ddp.py ``DDPStrategy.setup_distributed``,
lightning_fabric/utilities/distributed.py ``_init_dist_connection``); without it the group waits
torch's default, 30 minutes (``default_pg_timeout``). Lightning's own test
(tests_pytorch/strategies/test_ddp.py::test_set_timeout) mocks ``init_process_group`` and checks the
keyword it receives; here the group Lightning really creates is asked: a collective that rank 0 enters
alone fails after exactly the given seconds, with gloo's own words ("Timed out waiting <ms>ms").

The probe is ddpprobe/probes/process_group_timeout.py; it builds the strategy itself, so no other
code sets the group's timeout.
"""

import pytest
from torch.distributed import distributed_c10d

from ddpprobe.plugin.runif import run_if
from ddpprobe.probes import process_group_timeout
from ddpprobe.probes.common import RENDEZVOUS_TIMEOUT_S
from tests.support import gloo, oracle

#: The timeout given to ``DDPStrategy``, unlike every other timeout in play: torch's and Lightning's
#: default (1800 s), the world's own process-group timeout and rendezvous wait (60 s), the world's timeout.
TIMEOUT_S = 3
WORLD_TIMEOUT_S = 40
PG_TIMEOUT_S = 15


@pytest.mark.mirrors("tests_pytorch/strategies/test_ddp.py::test_set_timeout")
@run_if(backend="gloo")  # gloo's words for a timeout; NCCL's watchdog reports its own
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.waits_for_timeout
def test_ddp_strategy_timeout_is_the_process_groups_so_a_collective_left_alone_fails_after_that_many_seconds(
    run_world, semantics, world_size
):
    """``DDPStrategy(timeout=timedelta(seconds=3))``, the process group created by Lightning in
    ``trainer.validate``; then rank 0 all_reduces on the default group while the other ranks sleep 8 s.
    Rank 0's all_reduce raises after 3 s (not torch's 1800 s default, not the world's 15 s) with gloo's
    "Timed out waiting 3000ms". Were the argument dropped on the way, the group would wait torch's 30
    minutes and rank 0 would fail only when its peers leave (gloo: "Connection closed by peer") or when
    the world's timeout ends it. Source: pytorch_lightning/strategies/ddp.py ``DDPStrategy.__init__``
    (``self._timeout``) and ``setup_distributed``; lightning_fabric/utilities/distributed.py
    ``_init_dist_connection`` (``torch.distributed.init_process_group(..., **kwargs)``)."""
    hold_s = TIMEOUT_S + 5
    oracle.assert_distinct(
        given=TIMEOUT_S,
        torch_default=distributed_c10d.default_pg_timeout.total_seconds(),
        world_pg_timeout=PG_TIMEOUT_S,
        rendezvous=RENDEZVOUS_TIMEOUT_S,
        world_timeout=WORLD_TIMEOUT_S,
        peers_leave=hold_s,
    )
    world = run_world(
        process_group_timeout.all_reduce_left_by_the_others,
        world_size,
        timeout_s=TIMEOUT_S,
        hold_s=hold_s,
        timeout=WORLD_TIMEOUT_S,
        pg_timeout=PG_TIMEOUT_S,
    )

    rank0 = world.records[0]
    semantics.number("rank 0's lone all_reduce failed after (s)", round(rank0["waited_s"], 1), vs=("given", TIMEOUT_S))
    assert rank0["raised"] is not None, f"the all_reduce rank 0 entered alone returned: {rank0}"
    assert gloo.error_kind(rank0["message"]) == gloo.TIMED_OUT, rank0["message"]
    assert f"Timed out waiting {TIMEOUT_S * 1000}ms" in rank0["message"], rank0["message"]
    assert TIMEOUT_S <= rank0["waited_s"] < hold_s, f"rank 0 waited {rank0['waited_s']:.1f}s, given {TIMEOUT_S}s"

"""Ranks as threads for the guard's store-protocol tests (tests/tooling/guard/test_guard_protocol.py and
test_guard_digest_protocol.py): each "rank" is a thread holding its own ``Exchange``
(ddpprobe/guard/_exchange.py) on one shared ``torch.distributed.HashStore``, the calls the ranks of a world
make on the world's ``TCPStore``."""

import threading
import time
from typing import Optional

import torch.distributed as dist

from ddpprobe.guard import _entries
from ddpprobe.guard._exchange import Exchange

#: Seconds a thread may take before a test calls it stuck: far above a check's cost, far below the timeouts.
JOIN_S = 20


def exchanges(world_size: int, timeout_s: float) -> list:
    """One ``Exchange`` per rank on one new ``HashStore``, guard timeout ``timeout_s`` (the process group's
    twice that), stage ``validate``."""
    store = dist.HashStore()
    return [Exchange(store, 0, r, world_size, timeout_s, 2 * timeout_s, "validate") for r in range(world_size)]


def in_threads(exchanges: list, entry_of, delay_s: Optional[dict] = None) -> dict:
    """``exchange.check(entry_of(exchange))`` on every exchange at once (rank ``r`` after ``delay_s[r]``
    seconds); ``{rank: raised or None}``. Fails the test when a check has not returned within ``JOIN_S``."""
    outcome = {}

    def run(ex):
        time.sleep((delay_s or {}).get(ex.rank, 0))
        try:
            ex.check(entry_of(ex))
            outcome[ex.rank] = None
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test looks at
            outcome[ex.rank] = exc

    threads = [threading.Thread(target=run, args=(ex,)) for ex in exchanges]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), f"a check did not return within {JOIN_S} s: {outcome}"
    return outcome


def log_sync(ex, key: str, line: int = 12, group_size: int = 2) -> dict:
    """The entry of a ``self.log(key, ..., sync_dist=True)`` all_reduce at ``model.py:<line>`` in
    ``validation_step``, for rank ``ex.rank`` at its next check."""
    fields = {"op": "all_reduce", "reduce_op": "SUM", "dtype": "float32", "shape": [], "group_size": group_size}
    fields.update(source="self.log", key=key, hook="validation_step", call_site=f"model.py:{line} in validation_step")
    return _entries.collective(ex.n, ex.rank, fields)

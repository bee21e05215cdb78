"""A warm rank puts back the process-wide settings a scenario changed (the table ``STATE`` of
ddpprobe/launch/_warm_state.py) before the next scenario, so what the next one reads is what a fresh world
reads: one scenario changes each setting, the next reads it, on one warm world at W = 2, and the reads are
compared with the reader run on a fresh world (``ddpprobe.run_world``). State no reset restores (a library's
module attribute) makes the next call fail warm and pass fresh: the fixture warns, naming it.
"""

import os
import warnings

import pytest

from ddpprobe import run_world as fresh_world
from ddpprobe.launch import WarmWorld, warm_call
from ddpprobe.plugin._warm import WarmWorldLeakSuspect

pytestmark = pytest.mark.not_a_fact("tests that warm worlds reset process state, not a fact about DDP")


def read_settings(info) -> dict:
    """Every setting of the table, as a scenario sees it, and an all_reduce (sum) of ones over the world."""
    import decimal
    import gc
    import socket
    import sys

    import numpy as np
    import torch
    import torch._dynamo.config
    import torch.distributed as dist
    import torch.multiprocessing

    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    mask = os.umask(0o022)
    os.umask(mask)
    read = {
        "default_device": str(torch.get_default_device()),
        "zeros_device": str(torch.zeros(1).device),
        "torch_print": str(torch.tensor([1.23456])),
        "numpy_print": str(np.array([1.23456])),
        "numpy_divide": np.geterr()["divide"],
        "warn_always": torch.is_warn_always_enabled(),
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "autocast_cpu": torch.is_autocast_enabled("cpu"),
        "sharing": torch.multiprocessing.get_sharing_strategy(),
        "dynamo_cache_size_limit": torch._dynamo.config.cache_size_limit,
        "umask": mask,
        "recursion_limit": sys.getrecursionlimit(),
        "next_fd": fd,
        "decimal_prec": decimal.getcontext().prec,
        "socket_timeout": socket.getdefaulttimeout(),
        "gc_enabled": gc.isenabled(),
        "all_reduce_is_c10d": dist.all_reduce is dist.distributed_c10d.all_reduce,
    }
    dist.init_process_group(info.backend, rank=info.rank, world_size=info.world_size)
    ones = torch.ones(1, device="cpu")
    dist.all_reduce(ones)
    read["all_reduce_of_ones"] = ones.item()
    return read


def change_settings(info) -> dict:
    """Change every setting of the table and leave it so (a descriptor left open, ``all_reduce`` wrapped so
    that it doubles its result); returns what :func:`read_settings` reads afterwards."""
    import decimal
    import gc
    import socket
    import sys

    import numpy as np
    import torch
    import torch._dynamo.config
    import torch.distributed as dist
    import torch.multiprocessing

    original = dist.all_reduce

    def doubled(tensor, *args, **kwargs):
        work = original(tensor, *args, **kwargs)
        tensor.mul_(2)
        return work

    dist.all_reduce = doubled
    torch.set_default_device("meta")
    torch.set_printoptions(precision=1)
    np.set_printoptions(precision=1)
    np.seterr(all="raise")
    torch.set_warn_always(True)
    torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
    torch.set_autocast_enabled("cpu", True)
    torch.multiprocessing.set_sharing_strategy("file_system")
    torch._dynamo.config.cache_size_limit = 3
    os.umask(0o077)
    sys.setrecursionlimit(321)
    os.open(os.devnull, os.O_RDONLY)  # left open
    decimal.getcontext().prec = 3
    socket.setdefaulttimeout(7)
    gc.disable()
    read = read_settings(info)
    dist.destroy_process_group()
    return read


@pytest.mark.integration
def test_a_warm_rank_reads_every_setting_as_a_fresh_rank_after_a_scenario_changed_it():
    """After a scenario changed every setting of the table (and wrapped ``torch.distributed.all_reduce``), the
    next scenario on the same warm ranks reads each as a fresh world's rank does: an all_reduce of ones at
    W = 2 gives 2.0, not the wrapper's 4.0. The changer's own reads differ from the fresh ones in every key, so
    each setting was changed."""
    world = WarmWorld(*warm_call(read_settings, 2).world)
    try:
        changed = world.run(warm_call(change_settings, 2))
        after = world.run(warm_call(read_settings, 2))
    finally:
        world.close()
    assert changed is not None and after is not None, "a warm scenario failed"
    fresh = fresh_world(read_settings, 2)
    assert fresh.records[0]["all_reduce_of_ones"] == 2.0
    for rank in range(2):
        unchanged = {k for k, v in changed.records[rank].items() if v == fresh.records[rank][k]}
        assert not unchanged, f"rank {rank}: the changer left {sorted(unchanged)} as a fresh rank has them"
        differ = {k: (v, fresh.records[rank][k]) for k, v in after.records[rank].items() if v != fresh.records[rank][k]}
        assert not differ, f"rank {rank}: (warm, fresh) after a changing scenario: {differ}"


def leave_a_library_attribute(info) -> dict:
    """Set a module attribute of a library (here the standard library's ``json``), which no reset restores."""
    import json

    json.ddpprobe_left_by_a_scenario = True
    return {}


def fail_on_a_left_library_attribute(info) -> dict:
    """Raise when :func:`leave_a_library_attribute` ran before on this process (never in a fresh world)."""
    import json

    if getattr(json, "ddpprobe_left_by_a_scenario", False):
        raise AssertionError("json.ddpprobe_left_by_a_scenario was left by an earlier scenario")
    return {"ok": True}


@pytest.mark.integration
def test_the_fixture_warns_naming_a_scenario_that_failed_warm_and_passed_fresh(run_world, request):
    """A call that fails on a warm world and passes in a fresh one points at state an earlier scenario leaked:
    the ``run_world`` fixture keeps the fresh outcome and warns ``WarmWorldLeakSuspect`` naming the scenario
    (ddpprobe/plugin/_warm.py). Without warm worlds (``--fresh-worlds``) the call passes and nothing warns."""
    pool = request.getfixturevalue("_warm_pool")
    run_world(leave_a_library_attribute, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        world = run_world(fail_on_a_left_library_attribute, 2)
    assert [rec["ok"] for rec in world.records] == [True, True]
    suspects = [str(w.message) for w in caught if issubclass(w.category, WarmWorldLeakSuspect)]
    if pool is None:
        assert suspects == []
    else:
        assert len(suspects) == 1 and f"{__name__}:fail_on_a_left_library_attribute" in suspects[0], suspects

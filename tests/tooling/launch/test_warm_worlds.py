"""Warm worlds (ddpprobe/launch/_warm.py, ddpprobe/plugin/_warm.py): ranks that stay up and run one scenario
after another give the records a fresh world gives, a failed warm world is never reused, and the fixture
runs a call fresh again when its warm world fails.

The fidelity check runs a representative set of scenarios, every probe module at least once (a probe
module added without a case here fails ``test_every_probe_module_has_a_fidelity_case``), with and without
loggers, callbacks, checkpoints and torchmetrics, at W = 2 and 3: each case fresh (``ddpprobe.run_world``)
and, one after another, on one warm world, so every warm case runs on ranks that just ran another scenario.
Records, stdout and the names of the files each rank wrote must be equal after dropping only measurements
of the process (process ids, timings, memory sizes) and the world's folder name, which differs between any
two worlds.
"""

import ast
import importlib
import inspect
import os
import re
import tempfile

import pytest

from ddpprobe import RankFailed, run_world as fresh_world
from ddpprobe.launch import WarmWorld, warm_call
from ddpprobe.plugin._warm import WarmPool
from ddpprobe.probes import PROBE_MODULES, log_spec
from tests.support import scenarios

pytestmark = pytest.mark.not_a_fact("tests that warm worlds give what fresh worlds give, not a fact about DDP")

SYNCED = [log_spec("v", sync_dist=True)]

#: (probe module, scenario name, params or a function of the world size giving them, called anew for the warm
#: and the fresh run): the fidelity cases, run in this order on one warm world.
CASES = [
    ("validation", "validate", dict(n=7, logs=SYNCED)),
    ("validation", "validate", dict(n=6, logs=SYNCED, csv_logger=True, prints=True)),
    ("validation", "validate", dict(n=6, csv_logger=True, experiment_log=True)),
    ("accumulation", "accumulate_and_log", dict(n=12, batch_size=2, accumulate_grad_batches=2)),
    ("callbacks", "early_stopping", dict(values=[[3.0, 2.0, 1.0], [3.0, 4.0, 5.0], [1.0, 1.0, 1.0]])),
    ("callbacks", "model_checkpoint", dict(values=[[3.0, 2.0, 1.0], [3.0, 4.0, 0.5], [2.0, 2.0, 2.0]])),
    ("callbacks", "reduce_decision", dict(decisions=[True, False, True])),
    ("collectives", "collective", dict(action="shapes")),
    ("dataloaders", "validate_loaders", dict(sizes=[5, 4], firsts=[0, 100], logs=SYNCED)),
    ("f1", "f1_five_ways", dict(n=10)),
    ("hazards", "log_keys", lambda w: dict(n=3 * w, batch_size=2, step_plan=[[["v", 2.0**r]] for r in range(w)])),
    ("hazards", "metric_compute", dict(where="every_rank", n=8, batch_size=2)),
    (
        "hidden_collectives",
        "metrics_read",
        dict(where="training_step", reader="every_rank", then="nothing", n=8, batch_size=2),
    ),
    ("hidden_collectives", "list_state", lambda w: dict(metric="list_state", updates=[1, 0, 2][:w], reduce="cat")),
    ("hooks", "removed_hook", dict(hook="validation_epoch_end")),
    ("iterable", "validate_iterable", dict(n=10, batch_size=2, shard="rank")),
    ("legacy_hooks", "legacy_hook", dict(hook="validation_epoch_end")),
    ("manual_ddp_options", "fit_manual", dict(static_graph=True)),
    ("metric_checkpoints", "fit_and_checkpoint", lambda w: dict(ckpt_dir=tempfile.mkdtemp(prefix="ddpprobe-ckpt-"))),
    ("metric_memory", "peak_memory", dict(recipe="counts", n=1000)),
    ("metric_wrappers", "collection", dict(compute_groups=True)),
    ("multilabel", "best_threshold_recipes", dict(n=12)),
    ("outside_log_reductions", "strategy_reduce", lambda w: dict(values={"int64": [[3, -4], [4, -3], [1, -1]][:w]})),
    ("strategy_and_fabric_collectives", "evaluate_collectives", dict()),
    ("gradients_and_weights", "evaluate_rank_weights", dict(stage="validate")),
    ("logged_metrics", "fit_metric_reset", dict(n=8, val_n=6, batch_size=2, epochs=2)),
    ("loggers_per_rank", "validate_with_logger", dict(n=8, batch_size=2, logs=SYNCED)),
    (
        "stopping_checkpoints_and_schedules",
        "fit_stepping",
        dict(n=12, batch_size=2, max_epochs=2, accumulate_grad_batches=2),
    ),
    ("samplers_per_loader", "validate_with_batch_sampler", dict(n=9, batch_size=2, drop_last=False)),
    ("precision", "bfloat16", dict()),
    ("predict", "predict", dict(n=7, write_files=True)),
    ("contract", "contract_fit", dict(n=8, steps=2, lr_from_rank=True)),
    ("contract", "split_apart", dict(n=12, val=6, batch_size=3)),
    ("contract", "own_loader_schedule", dict(n=16, batch_size=2)),
    ("rank_state", "seeded_randomness", dict(seed=1234)),
    ("rank_state", "logger_versions", dict()),
    ("reductions", "validate_plan", dict(n=7, batch_size=2, plan=[log_spec("v", reduce_fx="max", sync_dist=True)])),
    ("samplers", "evaluate_with_sampler", dict(n=9, batch_size=2, logs=SYNCED)),
    ("samplers_rewrapped", "fit_with_sampler", dict(n=9, sampler="ordered")),
    ("training", "fit_regression", dict(n=8, batch_size=2, max_epochs=2, val_n=4)),
    ("training", "fit_batchnorm", lambda w: dict(n=4 * w)),
    ("validation", "validate", dict(n=7, logs=SYNCED)),  # again, after everything above ran on these ranks
]

#: Probe modules without a case, and why.
NO_CASE = {
    "common": "helpers every case runs (ddp_trainer takes a RankInfo but is not a scenario)",
    "nccl": "its scenarios need CUDA tensors and the nccl backend; warm worlds run gloo only",
    "multinode": "a world of several nodes has its own warm world (num_nodes is in the key); checked below",
    "preemption": "its scenarios end ranks with SIGTERM, a world that fails by design and so runs fresh",
    "process_group_timeout": "its scenario leaves a collective to time out, breaking the process group: it runs fresh",
    "ddp_spawn": "its facts give worlds their own timeout (a ddp_spawn Trainer inside a rank), so they run fresh",
}

#: Keys whose values are measurements of the rank's process, not of DDP: process ids, timings and memory
#: sizes (a warm rank that ran other scenarios holds more memory than a freshly forked one).
VOLATILE_KEY = re.compile(r"(^|_)(pid|pids|seconds|secs|time|times|duration|elapsed|ms|s|bytes)$")
WORLD_DIR = re.compile(r"/[\w./-]*ddpprobe-world-[\w]+")


# ---------------------------------------------------------------------------------------------
# A scenario that changes what a rank process keeps (run inside the ranks)
# ---------------------------------------------------------------------------------------------

#: Appended to by every run of ``change_process_state`` in this process: module state of the project's own
#: code, which a warm rank forgets after each scenario (the next imports this module afresh).
_RUNS = []

#: Environment variable the scenario sets.
_ENV = "DDPPROBE_WARM_TEST"


def change_process_state(info):
    """Record what this rank's process looks like, then change all of it."""
    import logging
    import random
    import sys
    import warnings

    import numpy as np
    import torch

    result = importlib.import_module("pytorch_lightning.trainer.connectors.logger_connector.result")
    registry = sys.modules["ddpprobe.probes"].__dict__.setdefault("__warningregistry__", {})
    shown = []
    showwarning, warnings.showwarning = warnings.showwarning, lambda *args, **kwargs: shown.append(1)
    try:
        warnings.warn_explicit("shown once per process", UserWarning, "warm.py", 1, registry=registry)
    finally:
        warnings.showwarning = showwarning
    before = {
        "cwd": os.getcwd(),
        "env": os.environ.get(_ENV),
        "runs": len(_RUNS),
        "warning_shown": len(shown),
        "warning_cache": len(result.warning_cache),
        "filters": len(warnings.filters),
        "logger_level": logging.getLogger("ddpprobe.warm-test").level,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "dtype": str(torch.get_default_dtype()),
        "grad": torch.is_grad_enabled(),
        "random_is_seed_0": random.random() == random.Random(0).random(),
        "numpy_is_seed_0": float(np.random.rand()) == float(np.random.RandomState(0).rand()),
        "torch_is_seed_0": torch.rand(1).item() == torch.rand(1, generator=torch.Generator().manual_seed(0)).item(),
        "files_here": sorted(os.listdir(".")),
    }
    _RUNS.append(1)
    os.environ[_ENV] = "set by the last scenario"
    result.warning_cache.add("a warning shown by the last scenario")
    warnings.simplefilter("ignore")
    logging.getLogger("ddpprobe.warm-test").setLevel(logging.ERROR)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    with open("left-by-the-last-scenario.txt", "w") as fh:
        fh.write("x")
    return {"before": before}


def _scenario(module: str, name: str):
    return getattr(importlib.import_module(f"ddpprobe.probes.{module}"), name)


def _normal(value):
    """``value`` with process ids and timings dropped and the world's folder named ``<world>``."""
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items() if not VOLATILE_KEY.search(str(k))}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, str):
        return WORLD_DIR.sub("<world>", value)
    return value


def _seen(world) -> list:
    """What a test reads of a world: each rank's record, stdout and file names."""
    return [{"record": _normal(r.record), "stdout": _normal(r.stdout), "files": sorted(r.files)} for r in world]


def _differences(warm, fresh) -> str:
    lines = []
    for rank, (w, f) in enumerate(zip(_seen(warm), _seen(fresh))):
        for part in w:
            if w[part] != f[part]:
                lines.append(f"rank {rank} {part}: warm {w[part]!r}\n      fresh {f[part]!r}")
    return "\n".join(lines)


def _scenarios_of(module: str) -> list:
    """Top-level functions of a probe module whose first parameter is ``info``: its scenarios."""
    tree = ast.parse(inspect.getsource(importlib.import_module(f"ddpprobe.probes.{module}")))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.args.args and node.args.args[0].arg == "info"
    ]


def test_every_probe_module_has_a_fidelity_case():
    with_scenarios = {module for module in PROBE_MODULES if _scenarios_of(module)}
    covered = {module for module, _, _ in CASES}
    assert with_scenarios - covered - set(NO_CASE) == set(), "add a case to CASES (or a reason to NO_CASE)"


@pytest.mark.integration  # about 150 worlds, 30-70 s: left to `pytest -m integration` (and .ci/run)
@pytest.mark.fresh_world("compares warm worlds with fresh ones")
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_warm_world_gives_the_records_a_fresh_world_gives_scenario_after_scenario(world_size):
    warm = WarmWorld(*warm_call(scenarios.identity, world_size).world)
    try:
        differences = []
        for module, name, params in CASES:
            scenario = _scenario(module, name)
            given = (lambda: params(world_size)) if callable(params) else (lambda: params)
            warm_world = warm.run(warm_call(scenario, world_size, **given()))
            assert warm_world is not None, f"{module}.{name}{given()} failed on a warm world"
            fresh = fresh_world(scenario, world_size, **given())
            found = _differences(warm_world, fresh)
            if found:
                differences.append(f"{module}.{name} {given()}:\n{found}")
        assert warm.scenarios == len(CASES) and not warm.ended
    finally:
        warm.close()
    assert not differences, "\n\n".join(differences)


@pytest.mark.integration
def test_a_warm_world_of_two_nodes_gives_the_layout_a_fresh_one_gives():
    multinode = _scenario("multinode", "node_layout")
    warm = WarmWorld(*warm_call(multinode, 4, num_nodes=2).world)
    try:
        warm_worlds = [warm.run(warm_call(multinode, 4, num_nodes=2, n=10)) for _ in range(2)]
    finally:
        warm.close()
    fresh = fresh_world(multinode, 4, num_nodes=2, n=10)
    assert [_seen(world) for world in warm_worlds] == [_seen(fresh)] * 2


@pytest.mark.integration
def test_a_warm_rank_starts_each_scenario_as_a_fresh_rank_does():
    """What one scenario changes in a rank's process (environment, working folder, warnings shown once,
    torch's flags, a logger's level, Lightning's once-per-process warning cache, the random generators
    seeded) does not reach the next; a fresh world gives the same record both times."""
    warm = WarmWorld(*warm_call(scenarios.identity, 2).world)
    try:
        first, second = (warm.run(warm_call(change_process_state, 2)) for _ in range(2))
    finally:
        warm.close()
    fresh = fresh_world(change_process_state, 2)
    assert _seen(first) == _seen(second) == _seen(fresh), _differences(second, fresh)
    assert first.records[0]["before"]["cwd"] != second.records[0]["before"]["cwd"]
    assert fresh.records[0]["before"]["warning_shown"] == 1 and fresh.records[0]["before"]["env"] is None


@pytest.mark.integration
def test_a_warm_world_whose_rank_raises_is_ended_and_not_reused():
    warm = WarmWorld(*warm_call(scenarios.identity, 2).world)
    try:
        ok = warm.run(warm_call(scenarios.identity, 2, tag="before"))
        pids = warm.pids
        failed = warm.run(warm_call(scenarios.raise_on, 2, rank=1))
        after = warm.run(warm_call(scenarios.identity, 2, tag="after"))
    finally:
        warm.close()
    assert ok is not None and failed is None and after is None
    assert warm.ended
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.integration
def test_a_warm_world_that_hangs_is_ended_at_the_world_timeout():
    warm = WarmWorld(*warm_call(scenarios.identity, 2).world)
    try:
        assert warm.run(warm_call(scenarios.hang_on, 2, rank=1, timeout=2.5, pg_timeout=2)) is None
    finally:
        warm.close()
    assert warm.ended


@pytest.mark.integration
def test_the_pool_reruns_a_failed_call_fresh_and_starts_a_new_warm_world_after_it():
    pool = WarmPool()
    try:
        first = pool.run(scenarios.identity, 2, {"tag": "a"})
        assert pool.run(scenarios.raise_on, 2, {"rank": 0}) is None
        with pytest.raises(RankFailed):
            fresh_world(scenarios.raise_on, 2, rank=0)
        again = pool.run(scenarios.identity, 2, {"tag": "a"})
    finally:
        pool.close()
    assert (pool.warm, pool.fell_back, pool.started) == (2, 1, 2)
    assert _seen(first) == _seen(again)
    assert first.pids != again.pids


def test_the_pool_refuses_what_only_a_fresh_world_runs():
    pool = WarmPool()
    try:
        assert pool.run(scenarios.identity, 2, {"backend": "nccl"}) is None
        assert pool.run(scenarios.identity, 2, {"env": {"TORCH_FR_BUFFER_SIZE": "10"}}) is None
        assert pool.run(scenarios.identity, 0, {}) is None  # a bad world size: run_world raises it
    finally:
        pool.close()
    assert (pool.warm, pool.started) == (0, 0)


def test_the_fixture_runs_a_world_warm_when_warm_worlds_are_on(run_world, request):
    world = run_world(scenarios.identity, 2, tag="fixture")
    assert [rec["rank"] for rec in world.records] == [0, 1]
    pool = request.getfixturevalue("_warm_pool")
    if pool is not None:
        assert pool.warm >= 1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False

"""Fidelity of the launcher: a rank forked from the preloaded forkserver looks to Lightning exactly like a
rank started as a fresh interpreter (``spawn``), and nothing one world did leaks into the next.

Why this needs proof. The forkserver imported torch and Lightning *before* any rank existed, and every
forked rank inherits that process's memory. Three things Lightning keeps per process could therefore be
wrong in a forked rank, and each is checked here:

- ``rank_zero_only.rank`` is read from ``RANK``/``LOCAL_RANK`` once, when Lightning is imported
  (lightning_fabric/utilities/rank_zero.py); imported in the server, it would say 0 on every rank;
- once-per-process caches: Lightning's ``WarningCache`` objects are module globals
  (pytorch_lightning/trainer/connectors/logger_connector/result.py ``warning_cache``), and
  ``LightningEnvironment.teardown`` deletes ``WORLD_SIZE`` from ``os.environ``
  (lightning_fabric/plugins/environments/lightning.py);
- random generators: a fresh interpreter seeds Python's and NumPy's from OS entropy, and torch's
  default generator with a fixed default seed (older torch) or from OS entropy (torch 2.13). Python's
  ``random`` reseeds itself in a forked child (``os.register_at_fork`` in random.py); NumPy's and torch's
  do not, so without the launcher's reseeding (ddpprobe/launch/_rank.py ``_align_process_state``)
  forked ranks would share the server's draws.

The scenarios are defined in this module: a scenario can be any importable top-level function.
"""

import csv
import functools
import io
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from ddpprobe._lightning import pl
from ddpprobe.probes import log_spec, validation
from ddpprobe.probes.common import ddp_trainer, id_loader, recorded_warnings
from tests.support import oracle

pytestmark = pytest.mark.not_a_fact("tests that launched ranks look like torchrun's, not a fact about DDP")

START_METHODS = ["forkserver", "spawn"]

#: World timeout (s) of a world with spawned ranks: each rank is a fresh interpreter importing torch and
#: Lightning, seconds on a quiet machine but over the default 120 s on a loaded one (seen under
#: ``pytest -n 4`` on 2 cores, both ranks still importing pytorch_lightning when the world was ended).
SPAWN_TIMEOUT_S = 400

#: The message of the once-per-process warning the state scenario triggers (Lightning logs an
#: epoch-level value with ``sync_dist=False`` in a distributed run). Source:
#: pytorch_lightning/trainer/connectors/logger_connector/result.py ``_ResultCollection._get_cache``.
UNSYNCED_WARNING = "It is recommended to use `self.log('unsynced', ..., sync_dist=True)`"


# ---------------------------------------------------------------------------------------------
# Scenarios (run inside the ranks)
# ---------------------------------------------------------------------------------------------


rank_zero_only = pl.utilities.rank_zero_only


@rank_zero_only
def _rank_zero_marker() -> str:
    return "ran"


def rank_zero_only_before_trainer(info):
    """Call a ``rank_zero_only`` function before any Trainer exists; record what it returned here."""
    return {"rank": info.rank, "returned": _rank_zero_marker(), "rank_zero_only_rank": rank_zero_only.rank}


def process_state(info, n=6):
    """Record the per-process state Lightning depends on, then validate twice and record what changed.

    Record keys: ``rank_zero_only_rank``, ``world_size_env`` (``WORLD_SIZE`` at start), ``random``
    (``random.random()``), ``numpy_random``, ``torch_initial_seed``, ``torch_rand`` (first two draws of
    torch's default generator), ``cwd``, ``rank_dir``, ``runs`` (per ``trainer.validate``: the warning
    messages raised and ``WORLD_SIZE`` afterwards).
    """
    state = {
        "rank_zero_only_rank": rank_zero_only.rank,
        "world_size_env": os.environ.get("WORLD_SIZE"),
        "random": random.random(),
        "numpy_random": float(np.random.random()),
        "torch_initial_seed": torch.initial_seed(),
        "torch_rand": torch.rand(2).tolist(),
        "cwd": os.getcwd(),
        "rank_dir": info.rank_dir,
    }
    runs = []
    for _ in range(2):
        model = validation.ValidationProbe(logs=[log_spec("unsynced")])
        with recorded_warnings() as caught:
            ddp_trainer(info).validate(model, dataloaders=id_loader(n, 2), verbose=False)
        runs.append({"warnings": [w["message"] for w in caught], "world_size_env_after": os.environ.get("WORLD_SIZE")})
    return {**state, "runs": runs}


@functools.lru_cache(maxsize=None)
def _fresh_interpreters_torch_state(count: int = 2) -> list:
    """torch's default generator in ``count`` brand-new interpreters (started side by side):
    ``[{"seed": initial_seed, "rand": first two draws}, ...]`` (computed once per test session).
    Importing Lightning, torchmetrics or the probes draws nothing from it, so ``import torch`` suffices."""
    code = "import json, torch\nprint(json.dumps({'seed': torch.initial_seed(), 'rand': torch.rand(2).tolist()}))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(count)]
    states = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        states.append(json.loads(out.strip().splitlines()[-1]))
    return states


def _across_worlds(label: str, values: list) -> str:
    """``"label: world 0 rank 0 -> a  world 0 rank 1 -> b  world 1 rank 0 -> c ..."`` (two ranks a world)."""
    return f"{label}: " + "  ".join(f"world {i // 2} rank {i % 2} -> {v}" for i, v in enumerate(values))


def _parsed(files: dict) -> dict:
    """``files`` with every ``.csv`` text replaced by its rows as sorted ``(column, value)`` tuples."""
    return {
        path: [tuple(sorted(row.items())) for row in csv.DictReader(io.StringIO(text))]
        if path.endswith(".csv")
        else text
        for path, text in files.items()
    }


def _count(messages, needle) -> int:
    return sum(needle in m for m in messages)


# ---------------------------------------------------------------------------------------------
# Facts
# ---------------------------------------------------------------------------------------------


#: The spawned world is the launcher's one spawn world in the default run; the forkserver case runs in the integration
#: run (the default run's fresh forkserver world is test_harness.py's).
@pytest.mark.parametrize(
    "start_method", [pytest.param(m, marks=pytest.mark.integration) if m == "forkserver" else m for m in START_METHODS]
)
def test_a_rank_zero_only_function_called_before_any_trainer_runs_on_rank_0_only(run_world, start_method):
    """``@rank_zero_only`` decides by ``rank_zero_only.rank``, which Lightning sets from the environment
    when it is imported and again when a Trainer's strategy sets up. Called before any Trainer exists,
    the function must still run on rank 0 only, whether the rank was forked from a server that imported
    Lightning with no rank set, or started fresh. Source: lightning_fabric/utilities/rank_zero.py."""
    world_size = 3 if start_method == "forkserver" else 2  # a spawned rank costs a fresh interpreter
    timeout = SPAWN_TIMEOUT_S if start_method == "spawn" else None
    world = run_world(rank_zero_only_before_trainer, world_size, start_method=start_method, timeout=timeout)

    returned = [rec["returned"] for rec in world.records]
    assert returned == ["ran"] + [None] * (world_size - 1), oracle.side_by_side("returned", returned)
    assert [rec["rank_zero_only_rank"] for rec in world.records] == list(range(world_size))


@pytest.mark.integration
@pytest.mark.fresh_world("compares the random draws and working folders of two worlds started one after the other")
def test_no_per_process_state_leaks_from_one_world_into_the_next(run_world):
    """Two worlds of forked ranks run back to back. In each, every rank starts as a fresh interpreter
    would (spawned ranks *are* fresh interpreters, so only the forkserver can leak):

    - ``rank_zero_only.rank`` is the rank;
    - ``WORLD_SIZE`` is set, although the previous world's ``LightningEnvironment.teardown`` deleted it;
    - Lightning's once-per-process warning (``WarningCache``) fires on rank 0 in the first validate of
      *each* world and not in the second validate of the same world (so the cache is real and per rank);
    - Python's and NumPy's random draws differ between all ranks of both worlds (seeded from OS
      entropy), and torch's default generator starts as in a new interpreter (the same fixed seed
      everywhere, or, in a torch that seeds it from OS entropy, a different seed in every rank);
    - the working directory is the rank's own folder, new for each world.
    """
    worlds = [run_world(process_state, 2, start_method="forkserver") for _ in range(2)]
    records = [rec for world in worlds for rec in world.records]

    for world in worlds:
        recs = world.records
        assert [r["rank_zero_only_rank"] for r in recs] == [0, 1]
        assert [r["world_size_env"] for r in recs] == ["2", "2"]
        # Lightning's teardown really deletes it: what a leak would carry into the next world.
        assert [r["runs"][0]["world_size_env_after"] for r in recs] == [None, None]
        warned = [[_count(run["warnings"], UNSYNCED_WARNING) for run in r["runs"]] for r in recs]
        assert warned == [[1, 0], [0, 0]], oracle.side_by_side("sync_dist warnings in validate 1, 2", warned)
        assert [r["cwd"] for r in recs] == [r["rank_dir"] for r in recs]

    py_draws = [r["random"] for r in records]
    np_draws = [r["numpy_random"] for r in records]
    assert len(set(py_draws)) == 4, _across_worlds("random.random()", py_draws)
    assert len(set(np_draws)) == 4, _across_worlds("np.random.random()", np_draws)
    # torch's default generator: the oracle is two fresh interpreters. Either they agree (a torch
    # that starts from a fixed default seed) and so must every rank, or they differ (a torch that
    # seeds from OS entropy) and so must all four ranks.
    fresh = _fresh_interpreters_torch_state()
    seeds = [r["torch_initial_seed"] for r in records]
    draws = [r["torch_rand"] for r in records]
    if fresh[0] == fresh[1]:
        assert set(seeds) == {fresh[0]["seed"]}, _across_worlds(f"torch.initial_seed() (fresh: {fresh[0]})", seeds)
        assert all(d == fresh[0]["rand"] for d in draws), _across_worlds("torch.rand(2)", draws)
    else:
        assert len(set(seeds)) == 4, _across_worlds(f"torch.initial_seed() (fresh: {fresh})", seeds)
        assert len({tuple(d) for d in draws}) == 4, _across_worlds("torch.rand(2)", draws)
    assert len({r["cwd"] for r in records}) == 4


@pytest.mark.integration
def test_the_same_scenario_gives_identical_records_files_and_stdout_under_both_start_methods(run_world):
    """A deterministic scenario (``trainer.validate`` with synced and unsynced logging, a CSVLogger and
    prints) gives the same records, the same files and the same stdout on every rank whether the ranks
    were forked from the forkserver or spawned as fresh interpreters."""
    params = dict(
        n=7,
        batch_size=2,
        logs=[log_spec("synced", sync_dist=True), log_spec("unsynced")],
        prints=True,
        csv_logger=True,
    )
    forked = run_world(validation.validate, 2, start_method="forkserver", **params)
    spawned = run_world(validation.validate, 2, start_method="spawn", timeout=SPAWN_TIMEOUT_S, **params)

    for rank in range(2):
        assert forked.records[rank] == spawned.records[rank], (
            f"rank {rank}\n  forkserver: {json.dumps(forked.records[rank], sort_keys=True)}"
            f"\n  spawn:      {json.dumps(spawned.records[rank], sort_keys=True)}"
        )
    # Files compared by content, CSV files row by row: Lightning's CSV logger up to 2.1 orders its columns
    # by set iteration, which follows the string hash seed; forked ranks share the forkserver's seed,
    # spawned ones each draw their own (a difference no fork can undo: PYTHONHASHSEED is read at start).
    assert [_parsed(r.files) for r in forked] == [_parsed(r.files) for r in spawned]
    assert [r.stdout for r in forked] == [r.stdout for r in spawned]
    # The comparison is not vacuous: the ranks saw different shards and logged numbers.
    assert forked.records[0]["seen_ids"] != forked.records[1]["seen_ids"]
    assert "synced" in forked.records[0]["callback_metrics"]

"""Recorded trace worlds: the events each rank of a traced scenario wrote, run once live and stored under
``tests/recordings/trace/``, so that a test of how the events are grouped (ddpprobe/trace/_read.py ``split_trace``)
and worded (ddpprobe/trace/_words.py ``describe_call``, ``describe_collective``) runs that part in its own process,
in milliseconds (tests/support/recordings.py).

The trace splits where its live part ends. Live, in each rank: the patch of ``torch.distributed`` (_patch.py), the
classifier that reads the rank's frames to name which code made a collective (_classify.py ``CallClassifier``:
``call_site``, ``call``, ``call_kind``, ``loop_step``, ``callback``) and the recorder (_record.py, _gradients.py)
write one JSON event per line. Pure, in any process: ``split_trace(events)`` groups the events (a collective's
status, a gradient bucket's training batch) and the words are functions of one grouped entry.

A recording (tool ``trace``) holds, for one scenario (:func:`scenario_of`: the scenario function by name, the world
size, the backend, its parameters and ``PYTHONHASHSEED``), ``records``: each rank's record as the scenario returned
it, the trace's ``events`` as the rank wrote them (``read_trace``) and whatever else it records (a counting comm
hook's calls). :func:`records_of` is the tests' entry (the ``traced_world`` fixture, conftest.py): the stored
recording where one was made on this release, else the world live (stored under ``--regen-all``); ``live=True``, and
inside a torchrun or srun world, the world live, never recorded. tests/tooling/recordings/test_recordings.py
records every stored scenario again in the integration run and fails with a diff where it changed.
"""

from __future__ import annotations

import json
import os

from tests.support import recordings
from tests.support.worlds import skip_unless_runnable

#: The recordings' tool name (their folder: tests/recordings/trace/).
TOOL = "trace"


def scenario_of(scenario, world_size: int, backend: str, params: dict) -> dict:
    """The recording's key: the scenario function by name, the world size, the backend, the parameters (as JSON
    gives them back: a tuple is a list) and ``PYTHONHASHSEED``."""
    key = {
        "model": f"{scenario.__module__}:{scenario.__qualname__}",
        "stage": "run",
        "world_size": world_size,
        "backend": backend,
        "params": params,
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED") or None,
    }
    return json.loads(json.dumps(key))


def record(scenario: dict) -> dict:
    """A live recording of ``scenario`` (:func:`scenario_of`): its world run now, fresh (``ddpprobe.run_world``, never
    a warm world: a warm rank's Flight Recorder still holds the collectives of the scenarios it ran before, which the
    trace's ``flight_recorder`` event would carry)."""
    from ddpprobe import run_world
    from ddpprobe.launch._message import resolve

    world = run_world(
        resolve(scenario["model"]), scenario["world_size"], backend=scenario["backend"], **scenario["params"]
    )
    return recordings.make(TOOL, scenario, records=world.records)


def records_of(run_world, backend: str, scenario, world_size: int, live: bool = False, **params) -> list:
    """Each rank's record of ``scenario``'s world of ``world_size`` ranks run with ``params``: from its stored
    recording where one was made on this release; else the world run now, fresh, and recorded (:func:`record`),
    stored under ``--regen-all``. ``live=True`` (a test whose claim is the live run's), and inside a torchrun or
    srun world: the world run now by ``run_world`` (the fixture), never recorded."""
    from ddpprobe.launch._external import external_world

    if live or external_world() is not None:
        return run_world(scenario, world_size, **params).records
    backend = params.pop("backend", backend)
    skip_unless_runnable(backend, world_size)
    key = scenario_of(scenario, world_size, backend, params)
    found = recordings.load(TOOL, key)
    if found is None:
        found = record(key)
        if recordings.updating():
            recordings.store(found)
    return found["records"]

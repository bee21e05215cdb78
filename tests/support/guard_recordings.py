"""Recorded guard worlds: a hazard's world run once live, what each rank posted at the check that differed stored
under ``tests/recordings/guard/``, and the guard's verdict and words computed again from it in the test's own
process, in milliseconds (tests/support/recordings.py).

The guard splits where its live part ends. Live: each rank posts an entry at every check and, where the digests
differ, reads every rank's full entry from the world's store (ddpprobe/guard/_exchange.py). Pure: the verdict on
those entries, ``ddpprobe.guard._exchange.verdict(entries, n, stage, pg_timeout_s, backend)``, gives the error and
its text (``CollectiveMismatch``, ``PeerFailed``, ``StateDiverged``: the sides, the consequence, the cause and fix,
the state's fields and the lines that set them), and ``ddpprobe.guard._errors.printed(error, under)`` what an
uncaught one prints under the user's line. The live guard calls the same two functions.

A recording (tool ``guard``) holds, for one scenario (:func:`scenario_of`: the scenario function, world size,
backend, its parameters and ``PYTHONHASHSEED``):

``check``
    the differing check's number, the ``Trainer`` stage, the process-group timeout and the backend (what the
    verdict names besides the entries);
``entries``
    what each rank posted at that check, as every rank read it from the store;
``ranks``
    each rank's outcome, as the launcher reported it: ``raised`` (the exception's type, None where the rank
    finished), ``replayed`` (its guard error is the verdict on ``entries``, computed again at replay), ``under`` (the
    user's line it was raised under, relative to the repository), ``traceback`` (its frames, without line numbers)
    and, for an exception the guard did not make (a peer's own error, which the guard names), ``message``;
``sources``
    a digest of each file of the repository (outside ``ddpprobe/``) whose lines the recording holds: the frames the
    ranks raised through and the files its call sites and hooks name (``"call_modules.py:135"``). A recording whose
    sources changed since (a line moved, a scenario edited) is not read: the test runs the world live, as for
    another release, until ``--regen-all`` records it again.

:func:`record` runs the world live under :func:`recorded` (each rank spies on the verdict and writes its outcome to a
folder) and checks that the replay of what it recorded gives every rank's error text exactly as the live ranks
raised it (so the recording holds all the pure part reads); :func:`replay` turns a recording into a
:class:`Replayed`, read by the tests as they read a ``RankFailed``. :func:`failed_world` is the tests' entry: the
stored recording where one was made on this release, else the world live (recorded, and stored under
``--regen-all``); inside a torchrun or srun world, always the world live, as the test ran before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import traceback
from typing import Optional

import pytest

from tests.support import recordings
from tests.support.worlds import skip_unless_runnable

#: The recordings' tool name (their folder: tests/recordings/guard/).
TOOL = "guard"
#: The repository's root: a user's line is recorded relative to it.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- the rank's side ------------------------------------------------------------------------------------------------


def recorded(info, ref: str, evidence: str, **params):
    """Scenario: the scenario ``ref`` (``"module:function"``) run on this rank with ``params``, the guard's verdicts
    seen as they are made; where the scenario raises, this rank's outcome is written to ``<evidence>/rank<r>.json``
    and the exception raised on, so the world fails as it fails without the recording. torch's generator is seeded
    (0) first, so a scenario that does not seed its module's weights records the same parameters every time (they
    are in a state check's records)."""
    import torch

    from ddpprobe.guard import _exchange
    from ddpprobe.launch._message import resolve

    torch.manual_seed(0)

    seen = []
    original = _exchange.verdict

    def spy(entries, n, stage, pg_timeout_s, backend=None):
        check = {"n": n, "stage": stage, "pg_timeout_s": pg_timeout_s, "backend": backend}
        copied = json.loads(json.dumps(entries, default=str))
        error = original(entries, n, stage, pg_timeout_s, backend)
        seen.append((check, copied, error))
        return error

    _exchange.verdict = spy
    try:
        return resolve(ref)(info, **params)
    except BaseException as exc:
        with open(os.path.join(evidence, f"rank{info.rank}.json"), "w") as f:
            json.dump(_outcome(info.rank, exc, seen), f, default=str)
        raise
    finally:
        _exchange.verdict = original


def _outcome(rank: int, exc: BaseException, seen: list) -> dict:
    from ddpprobe.guard._errors import report, user_frame

    out = {"rank": rank, "raised": type(exc).__name__, "traceback": _frames(exc)}
    made = next(((check, entries) for check, entries, error in seen if error is exc), None)
    if made is None:  # not the guard's verdict: a peer's own error, or one the guard made otherwise (a timeout)
        out.update(message=str(exc), sources=_sources(exc, []))
        return out
    out.update(replayed=True, check=made[0], entries=made[1], under=_relative(user_frame(exc.__traceback__)))
    out["live_report"] = _relative(report(exc, exc.__traceback__))  # checked against the replay, not stored
    out["sources"] = _sources(exc, made[1])
    return out


def _sources(exc: BaseException, entries: list) -> dict:
    """``{path: digest}`` (:func:`digest`) of the repository's files, outside ``ddpprobe/``, whose lines ``exc``'s
    frames and ``entries`` hold: the files of the frames it was raised through, and the loaded modules' files that
    the entries name by ``"<file>.py:<line>"``."""
    files, seen = set(), set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        files |= {f.filename for f in traceback.extract_tb(exc.__traceback__)}
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    named = set(re.findall(r"([A-Za-z0-9_]+\.py):\d+", json.dumps(entries)))
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        if os.path.basename(path) in named:
            files.add(path)
    files.discard(os.path.abspath(__file__))  # the recording's own frame (:func:`recorded`), not the scenario's
    own = [os.path.relpath(f, ROOT) for f in files if f.startswith(ROOT + os.sep)]
    return {
        path: digest(path)
        for path in sorted(own)
        if not path.startswith(("ddpprobe", ".")) and "site-packages" not in path
    }


def digest(path: str) -> Optional[str]:
    """16 hex digits of the SHA-256 of the repository's file ``path`` (relative to the root), None where absent."""
    full = os.path.join(ROOT, path)
    if not os.path.exists(full):
        return None
    with open(full, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def current(recording: dict) -> bool:
    """Whether every source file the recording holds lines of is as it was recorded (``sources``)."""
    return all(digest(path) == value for path, value in recording.get("sources", {}).items())


def _frames(exc: BaseException) -> list:
    """Every frame of ``exc``'s traceback and of the exceptions it was raised from or while handling, outermost
    first, as ``"file.py in function: source line"`` (no path, no line number)."""
    frames, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        own = [f"{os.path.basename(f.filename)} in {f.name}: {f.line}" for f in traceback.extract_tb(exc.__traceback__)]
        frames = own + frames
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return frames


def _relative(text: Optional[str]) -> Optional[str]:
    return None if text is None else text.replace(ROOT + os.sep, "")


# --- the test's side ------------------------------------------------------------------------------------------------


def scenario_of(scenario, world_size: int, backend: str, params: dict) -> dict:
    """The recording's key: the scenario function by name, the world size, the backend, the parameters (as JSON
    gives them back: a tuple is a list) and ``PYTHONHASHSEED``."""
    key = {
        "model": f"{scenario.__module__}:{scenario.__qualname__}",
        "world_size": world_size,
        "backend": backend,
        "params": params,
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED") or None,
    }
    return json.loads(json.dumps(key))


def record(scenario: dict) -> dict:
    """A live recording of ``scenario`` (:func:`scenario_of`): its world run now. Fails the test where the world does
    not fail (a ``pytest.raises(RankFailed)`` that did not raise) or where the replay of the recording does not give
    each rank's error as the live rank raised it."""
    from ddpprobe import RankFailed, run_world

    folder = tempfile.mkdtemp(prefix="ddpprobe-guard-")
    try:
        try:
            run_world(
                recorded,
                scenario["world_size"],
                backend=scenario["backend"],
                ref=scenario["model"],
                evidence=folder,
                **scenario["params"],
            )
        except RankFailed as exc:
            failure = exc
        else:
            pytest.fail(f"DID NOT RAISE {RankFailed}: the world of {scenario} finished without error")
        outcomes = {}
        for rank in range(scenario["world_size"]):
            path = os.path.join(folder, f"rank{rank}.json")
            if os.path.exists(path):
                with open(path) as f:
                    outcomes[rank] = json.load(f)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    recording = _recording(scenario, failure, outcomes)
    _replays_as_live(recording, failure, outcomes)
    return recording


def _recording(scenario: dict, failure, outcomes: dict) -> dict:
    ranks, check, entries, sources = [], None, None, {}
    for rank in range(scenario["world_size"]):
        outcome = outcomes.get(rank)
        if outcome is None:
            assert rank not in failure.ranks, f"rank {rank} failed without writing its outcome:\n{failure}"
            ranks.append({"rank": rank, "raised": None})
            continue
        outcome = {k: v for k, v in outcome.items() if k != "live_report"}
        sources.update(outcome.pop("sources", {}))
        if outcome.get("replayed"):
            here = (outcome.pop("check"), outcome.pop("entries"))
            assert check is None or here == (check, entries), (
                f"ranks raised the guard's verdict at different checks, which one recording cannot hold: {scenario}"
            )
            check, entries = here
        ranks.append(outcome)
    return recordings.make(
        TOOL, scenario, check=check, entries=entries, ranks=ranks, sources=dict(sorted(sources.items()))
    )


def _replays_as_live(recording: dict, failure, outcomes: dict) -> None:
    """The replay gives every failed rank the type and text it raised live, and the report it would print."""
    replayed = replay(recording)
    live = {r: (failure.exc_types.get(r), failure.rank_errors.get(r)) for r in failure.ranks}
    again = {r: (replayed.exc_types.get(r), replayed.rank_errors.get(r)) for r in failure.ranks}
    assert again == live, f"the replay of the recording differs from the live world:\nlive: {live}\nreplay: {again}"
    for rank, outcome in outcomes.items():
        if outcome.get("replayed"):
            assert replayed.reports[rank]["report"] == outcome["live_report"], (outcome, replayed.reports[rank])


class Replayed:
    """A recorded world's failure, read as a ``ddpprobe.RankFailed`` is: ``ranks`` (those that raised),
    ``exc_types``, ``rank_errors`` (``"Type: message"``) and ``tracebacks`` by rank; for a guard error, its type and
    text come from the verdict on the recorded entries, computed here; a peer's own error and every traceback are as
    the live rank recorded them. ``errors``: each rank's guard error; ``reports``: ``{rank: {"type", "message",
    "report"}}``, what it would print uncaught (``ddpprobe.guard._errors.printed``)."""

    def __init__(self, recording: dict):
        from ddpprobe.guard._errors import printed
        from ddpprobe.guard._exchange import verdict

        check, entries = recording["check"], recording["entries"]
        self.ranks, self.exc_types, self.rank_errors, self.tracebacks = [], {}, {}, {}
        self.errors, self.reports = {}, {}
        for outcome in recording["ranks"]:
            rank = outcome["rank"]
            if outcome["raised"] is None:
                continue
            self.ranks.append(rank)
            self.tracebacks[rank] = "\n".join(outcome["traceback"])
            if not outcome.get("replayed"):
                self.exc_types[rank] = outcome["raised"]
                self.rank_errors[rank] = f"{outcome['raised']}: {outcome['message']}"
                continue
            error = verdict(json.loads(json.dumps(entries)), **check)
            if error is None:
                self.exc_types[rank] = None
                self.rank_errors[rank] = "the replayed check raised nothing"
                continue
            error.rank = rank
            name = type(error).__name__
            self.errors[rank] = error
            self.exc_types[rank] = name
            self.rank_errors[rank] = f"{name}: {error}"
            self.reports[rank] = {"type": name, "message": str(error), "report": printed(error, outcome["under"])}

    def __str__(self) -> str:
        return "\n".join(f"rank {r}: {self.rank_errors[r]}" for r in self.ranks)


def replay(recording: dict) -> Replayed:
    """The failure of a stored guard recording, its guard errors computed again in this process."""
    return Replayed(recording)


def failed_world(run_world, backend: str, scenario, world_size: int, live: bool = False, **params):
    """The failure of ``scenario``'s world of ``world_size`` ranks run with ``params`` (``run_world``'s keywords and
    the scenario's): the :class:`Replayed` of its stored recording where one was made on this release from the
    sources there are now (:func:`current`); else the world live, recorded (and stored under ``--regen-all``), then
    replayed. ``live=True`` (a test whose claim is the
    live run's: where a rank raised, what the launcher reports), and inside a torchrun or srun world: the
    ``RankFailed`` of the world run now (``run_world``, the fixture), never recorded. Fails the test where the world
    finished."""
    from ddpprobe import RankFailed
    from ddpprobe.launch._external import external_world

    if live or external_world() is not None:
        with pytest.raises(RankFailed) as failure:
            run_world(scenario, world_size, **params)
        return failure.value
    backend = params.pop("backend", backend)
    skip_unless_runnable(backend, world_size)
    key = scenario_of(scenario, world_size, backend, params)
    found = recordings.load(TOOL, key)
    if found is None or not current(found):
        found = record(key)
        if recordings.updating():
            recordings.store(found)
    return replay(found)

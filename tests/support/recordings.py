"""Recorded worlds: the evidence a tool's live part gathered, stored under ``tests/recordings/``, so that a test
of its reasoning or wording runs the pure part in the test's own process, in milliseconds.

A recording is one JSON file: ``{"format", "tool", "scenario", "recorded_on", ...}`` and the tool's evidence
(the audit's: ``"inputs"`` and ``"worlds"``, ``ddpprobe.audit.worlds._worlds.Worlds.to_dict``). ``scenario`` holds
the arguments that made it (the key it is found by); ``recorded_on`` the releases it was made on
(:func:`release`). A recording made on another release (torch, the Lightning package or its version, Python's
minor version) is not used: the test runs the tool live instead, as it would without a recording.

The fields that differ from one live run of a scenario to the next (wall-clock times, temporary folders) are listed
once, in :data:`VOLATILE`, :data:`VOLATILE_VALUES` and :data:`VOLATILE_TEXT`: a recording stores them as recorded,
and two recordings are compared without them (:func:`stable`, :func:`differences`).

Commands (README, "Recorded worlds"; pytest-regressions' update flags):

- ``pytest -m integration tests/tooling/recordings`` runs every stored scenario live again and fails with a
  unified diff where the fresh recording differs from the stored one (CI runs it);
- ``pytest -n auto tests/tooling -m "integration or not integration" --regen-all`` (re)records every recording:
  each recorded test runs its scenario live and writes its file, and the integration test rewrites the stored ones
  it re-ran (pytest-regressions' ``--regen-all``; ``--force-regen`` does the same and fails each rewritten test).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import sysconfig
import tempfile
from typing import Callable, Optional

#: The folder of every recording, one subfolder per tool.
FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recordings")
#: The checkout's root: a recording stores a path under it as :data:`ROOT_MARK` and the path's rest, and a read
#: puts this checkout's root back, so a recording made in one checkout is read the same in a clone elsewhere (the
#: audit tells the user's frames from ddpprobe's own and shortens them by where ddpprobe and the working folder are).
ROOT = os.path.dirname(os.path.dirname(FOLDER))
#: What a stored recording holds in place of :data:`ROOT`.
ROOT_MARK = "<checkout>"
#: The standard library's folder (a frame of ``threading.py``, ``multiprocessing``): stored as :data:`STDLIB_MARK`
#: and read back as this interpreter's, as :data:`ROOT` is.
STDLIB = sysconfig.get_paths()["stdlib"]
#: What a stored recording holds in place of :data:`STDLIB`.
STDLIB_MARK = "<stdlib>"
#: The folders a recording stores by a mark, each with its mark.
_MARKS = ((ROOT, ROOT_MARK), (STDLIB, STDLIB_MARK))
#: The recordings' format; a file of another format is not read.
FORMAT = 1
#: What a volatile field's value is compared as.
PLACEHOLDER = "<varies>"
#: Dictionary keys, anywhere in a recording, whose value differs from one live run of a scenario to the next: a
#: wall-clock time (a traced batch's, a state check's, when a stage raised) or a process id.
VOLATILE = frozenset({"t", "stage_error_t", "pid"})
#: Dictionary keys whose value is a mapping of names to such values (each hook's last wall-clock time): its names
#: are compared, its values are not.
VOLATILE_VALUES = frozenset({"hook_times"})
#: Patterns inside strings that differ from run to run, each with its stand-in: the names of temporary folders
#: (tempfile's, the audit's, pytest's) and a port in an address.
VOLATILE_TEXT = (
    (
        re.compile(
            re.escape(tempfile.gettempdir())
            + r"/(?:pytest-of-[^/]+/pytest-\d+|tmp[A-Za-z0-9_]+|ddpprobe-[A-Za-z0-9_-]+)"
        ),
        "<tmp>",
    ),
    (re.compile(r"<tmp>/tmp[A-Za-z0-9_]+"), "<tmp>"),
    (re.compile(r"(127\.0\.0\.1|localhost)(\]?):\d+"), r"\1\2:<port>"),
    # A thread's id in a Python stack (faulthandler's "Thread 0x00007f505abff6c0").
    (re.compile(r"\bThread 0x[0-9a-f]+"), "Thread <id>"),
    # Where the interpreter and the packages are installed (a CI run's fresh virtual environment).
    (re.compile(r"[^\s\"'(]*/(?:site|dist)-packages/"), "<site-packages>/"),
    (re.compile(re.escape(STDLIB) + "/"), STDLIB_MARK + "/"),
)
#: Digests whose input differs from run to run: the hash of a whole model's weights (``weights_digest``), of a
#: tensor's values (``digest``) unless its ``dtype`` beside it is an integer or bool, and the guard's state entry's id
#: (``["state", boundary, hook, <digest of the state>]``). Floating-point results of a run (training's matmuls, a
#: gradient's all_reduce) differ in their last bits from one run to the next (the order of the threads' partial sums),
#: so their digests do; the values themselves are compared within :data:`FLOAT_TOLERANCE` and :data:`FLOAT_FLOOR`.
#: Which of a world's digests are equal is compared (the ranks' weights are the same, or not): each is replaced by
#: ``<digest N>``, N counting the distinct ones in the order of the world's sorted keys. Each world of ``"worlds"``
#: is counted apart: one process's gradient on the ranks' samples equals the ranks' averaged one in some runs and not
#: in others (the order of the float additions), where the ranks of one world hold the same bits by the all_reduce.
VOLATILE_DIGESTS = frozenset({"digest", "weights_digest"})
#: How :func:`_stable` marks a volatile digest for :func:`_classed`.
_DIGEST_MARK = "\x00digest:"
#: Two floats at the same place of two recordings are the same value when they differ by at most this much,
#: relative to the larger (last-bit differences of float32 arithmetic, grown through a few training steps).
FLOAT_TOLERANCE = 1e-5
#: ... or by at most this much whatever their size (two zeros computed two ways).
FLOAT_FLOOR = 1e-12
#: ... and a value under the key ``"sum"`` (a state's sum of a tensor's values) by at most this much: a sum that
#: cancels to about zero (2.8e-08 one run, 2.0e-08 the next) keeps only the rounding of its terms, where a learning
#: rate of 2e-07 against 1e-06 is a real change.
SUM_FLOOR = 1e-6
#: How many live recordings of one scenario the integration run makes before it reports a difference: a world that
#: raises by design (a hazard) ends in one of a few ways depending on which rank's error reaches the other first
#: (gloo's "Connection closed by peer" or "Application timeout", the batch a rank had reached), and the stored
#: recording is one of them.
ATTEMPTS = 3

#: Whether this session rewrites the recordings it uses (pytest-regressions' ``--regen-all`` or
#: ``--force-regen``; tests/tooling/conftest.py sets it).
_UPDATE = [False]


def update(on: bool) -> None:
    """Rewrite each recording a test uses from a live run (on), or read the stored ones (off, the default)."""
    _UPDATE[0] = bool(on)


def updating() -> bool:
    return _UPDATE[0]


def release() -> dict:
    """The releases a recording depends on: ``{"torch", "lightning", "python"}``, e.g. ``{"torch": "2.13.0+cpu",
    "lightning": "pytorch_lightning 2.6.6", "python": "3.11"}`` (the Lightning package ddpprobe runs,
    ddpprobe/_lightning.py ``chosen``, and its distribution's version). Read from the installed distributions'
    metadata: nothing is imported."""
    from ddpprobe import _lightning

    choice = _lightning.chosen()
    return {
        "torch": importlib.metadata.version("torch"),
        "lightning": f"{choice} {importlib.metadata.version(_lightning.PACKAGES[choice][2])}",
        "python": ".".join(platform.python_version_tuple()[:2]),
    }


def of_this_release(tool: str) -> bool:
    """Whether every stored recording of ``tool`` was made on this release (False where none is stored): where one
    was not, the tests that read it run live."""
    found = stored(tool)
    this = release()
    for path in found:
        with open(path) as f:
            if json.load(f).get("recorded_on") != this:
                return False
    return bool(found)


def path_of(tool: str, scenario: dict) -> str:
    """The file of ``tool``'s recording of ``scenario`` (a dict of JSON values: the arguments that make it):
    ``tests/recordings/<tool>/<model's last name>-<stage>-w<world size>-<12 hex digits of the scenario>.json``."""
    text = json.dumps(scenario, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    model = str(scenario.get("model", "scenario")).replace(":", ".").split(".")[-1]
    name = re.sub(r"[^A-Za-z0-9_]+", "_", model)[:60]
    return os.path.join(
        FOLDER, tool, f"{name}-{scenario.get('stage', 'run')}-w{scenario.get('world_size')}-{digest}.json"
    )


def stable(value):
    """``value`` with every :data:`VOLATILE` field, :data:`VOLATILE_VALUES` mapping and :data:`VOLATILE_TEXT` pattern
    replaced, and each volatile digest by its class (:data:`VOLATILE_DIGESTS`): what two live runs of one scenario
    share, the part of a recording that is compared."""
    return _classed(_stable(value), {})


def _classed(value, classes: dict):
    """``value`` with each digest :func:`_stable` marked replaced by ``<digest N>``: the same digest by the same N,
    N counting the distinct ones (``classes``) in the order of the sorted keys, each world of ``"worlds"`` apart."""
    if isinstance(value, dict):
        out = {}
        for key in sorted(value):
            found = value[key]
            if key == "worlds" and isinstance(found, dict):
                out[key] = {name: _classed(found[name], {}) for name in sorted(found)}
            else:
                out[key] = _classed(found, classes)
        return out
    if isinstance(value, list):
        return [_classed(v, classes) for v in value]
    if isinstance(value, str) and value.startswith(_DIGEST_MARK):
        return classes.setdefault(value, f"<digest {len(classes) + 1}>")
    return value


def _stable(value):
    """:func:`stable` but for the classes: each volatile digest marked with :data:`_DIGEST_MARK`."""
    if isinstance(value, dict):
        out = {}
        for key, found in value.items():
            if key in VOLATILE and found is not None:
                out[key] = PLACEHOLDER
            elif key in VOLATILE_VALUES and isinstance(found, dict):
                out[key] = {name: PLACEHOLDER for name in found}
            elif key in VOLATILE_DIGESTS and isinstance(found, str) and not _exact_dtype(value.get("dtype")):
                out[key] = _DIGEST_MARK + found
            elif key == "id" and isinstance(found, list) and found[:1] == ["state"]:
                out[key] = [_stable(part) for part in found[:-1]] + [_DIGEST_MARK + json.dumps(found[-1])]
            else:
                out[key] = _stable(found)
        return out
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, str):
        for pattern, stand_in in VOLATILE_TEXT:
            value = pattern.sub(stand_in, value)
        return value
    return value


def _exact_dtype(dtype) -> bool:
    """Whether a tensor of ``dtype`` (a torch dtype's name, e.g. ``"int64"``) holds the same bits every run."""
    return isinstance(dtype, str) and (dtype == "bool" or dtype.lstrip("u").startswith("int"))


def _within_tolerance(stored, fresh, floor: float = FLOAT_FLOOR):
    """``fresh`` with each float that is within :data:`FLOAT_TOLERANCE` of the float at its place in ``stored`` (or
    within ``floor``: :data:`FLOAT_FLOOR`, :data:`SUM_FLOOR` under a ``"sum"`` key) replaced by that one: what is
    left differs beyond the last bits."""
    if isinstance(stored, dict) and isinstance(fresh, dict):
        return {
            key: _within_tolerance(stored[key], found, SUM_FLOOR if key == "sum" else floor) if key in stored else found
            for key, found in fresh.items()
        }
    if isinstance(stored, list) and isinstance(fresh, list) and len(stored) == len(fresh):
        return [_within_tolerance(a, b, floor) for a, b in zip(stored, fresh)]
    if isinstance(stored, float) and isinstance(fresh, float) and stored != fresh:
        if abs(stored - fresh) <= max(FLOAT_TOLERANCE * max(abs(stored), abs(fresh)), floor):
            return stored
    return fresh


def differences(stored_path: str, fresh_path: str) -> str:
    """A unified diff of two recording files' :func:`stable` parts, floats compared within
    :data:`FLOAT_TOLERANCE` ("" where they are equal): what a fresh recording changed beyond the fields that
    differ run to run."""
    found = []
    for path in (stored_path, fresh_path):
        with open(path) as f:
            found.append(_stable(json.load(f)))
    found[1] = _within_tolerance(*found)
    texts = [text_of(_classed(one, {})).splitlines(keepends=True) for one in found]
    return "".join(difflib.unified_diff(*texts, fromfile=str(stored_path), tofile=str(fresh_path), n=2))


def check_rerecorded(
    path: str, record: Callable[[dict], dict], file_regression, outcome: Optional[Callable[[dict], object]] = None
) -> None:
    """The integration run's check of the stored recording at ``path``: ``record(scenario)`` records its scenario
    live, up to :data:`ATTEMPTS` times until a fresh recording equals the stored one (:func:`differences`), and
    pytest-regressions compares the last with the stored file (a unified diff where they differ; ``--regen-all``
    writes it instead). Skips a recording made on another release: there its tests run live.

    ``outcome`` (optional) is what the tool concludes from a recording whose world raised by design (a hazard's
    world: ``outcome(recording)`` is called only when ``raised(recording)``): where ranks race to an error, which
    error each rank reads, how far it got and what a mismatched collective returned differ from run to run, so such
    a fresh recording that differs in its fields but gives the same outcome is the stored one's scenario still."""
    import pytest

    found = read(path)
    if found.get("recorded_on") != release():
        pytest.skip(
            f"recorded on {found.get('recorded_on')}, this run has {release()}: the tests that read it run the tool "
            "live on this release"
        )
    handle, fresh_path = tempfile.mkstemp(suffix=".json", prefix="fresh-recording-")
    os.close(handle)
    try:
        for _ in range(1 if updating() else ATTEMPTS):
            fresh = record(found["scenario"])
            with open(fresh_path, "w") as f:
                f.write(text_of(fresh))
            if not differences(path, fresh_path):
                break
            if outcome is not None and not updating() and raised(found) and raised(fresh):
                if outcome(read(fresh_path)) == outcome(found):
                    return
    finally:
        os.unlink(fresh_path)
    file_regression.check(text_of(fresh), fullpath=path, check_fn=_same_but_volatile)


def raised(recording: dict) -> bool:
    """Whether a world of an audit's ``recording`` failed: the world ended in an ``error``, or a rank's stage raised
    (its record's ``raised``, its trace's ``stage_error``). False for a recording without ``worlds``."""
    worlds = recording.get("worlds")
    if not isinstance(worlds, dict):
        return False
    for world in (w for w in worlds.values() if isinstance(w, dict)):
        records = [r for r in world.get("records") or [] if isinstance(r, dict)]
        traces = [t for t in world.get("traces") or [] if isinstance(t, dict)]
        if world.get("error") or any(r.get("raised") for r in records) or any(t.get("stage_error") for t in traces):
            return True
    return False


def _same_but_volatile(fresh_path, stored_path) -> None:
    """pytest-regressions' comparison of a fresh recording (``fresh_path``) with the stored one: equal but for the
    fields that differ run to run (:func:`stable`, :data:`FLOAT_TOLERANCE`)."""
    diff = differences(str(stored_path), str(fresh_path))
    assert not diff, f"the fresh recording differs from the stored one beyond the volatile fields:\n{diff}"


def _rooted(value, old: str, new: str):
    """``value`` with ``old`` at the start of a path replaced by ``new`` in every string (a path starts a string,
    follows a quote, a space or an opening parenthesis)."""
    if isinstance(value, dict):
        return {key: _rooted(found, old, new) for key, found in value.items()}
    if isinstance(value, list):
        return [_rooted(found, old, new) for found in value]
    if isinstance(value, str) and old in value:
        return re.sub(r'(^|["\'( ])' + re.escape(old) + r"(?=/)", lambda m: m.group(1) + new, value)
    return value


def text_of(recording: dict) -> str:
    """A recording as the text stored (sorted keys, one-space indents, one final newline; paths under the checkout
    as :data:`ROOT_MARK`, under the standard library as :data:`STDLIB_MARK`): a diff of two reads line by line."""
    portable = recording
    for folder, mark in _MARKS:
        portable = _rooted(portable, folder, mark)
    return json.dumps(portable, sort_keys=True, indent=1, allow_nan=True) + "\n"


def read(path: str) -> dict:
    """The recording stored at ``path``, its paths under the checkout rooted in this checkout (:data:`ROOT`) and its
    standard library's in this interpreter's (:data:`STDLIB`)."""
    with open(path) as f:
        found = json.load(f)
    for folder, mark in _MARKS:
        found = _rooted(found, mark, folder)
    return found


def make(tool: str, scenario: dict, **evidence) -> dict:
    """A recording of ``tool`` for ``scenario`` on this release, ``evidence`` as the tool recorded it (its volatile
    fields too: a replay reads what the live run read)."""
    return {"format": FORMAT, "tool": tool, "scenario": scenario, "recorded_on": release(), **evidence}


def load(tool: str, scenario: dict) -> Optional[dict]:
    """The stored recording of ``scenario``, or None: there is none, this session rewrites it (:func:`updating`), or
    it was made on another release or format (then the caller runs the tool live)."""
    if updating():
        return None
    path = path_of(tool, scenario)
    if not os.path.exists(path):
        return None
    found = read(path)
    if found.get("format") != FORMAT or found.get("recorded_on") != release() or found.get("scenario") != scenario:
        return None
    return found


def store(recording: dict) -> str:
    """Write ``recording`` to its file (:func:`path_of`), whole, then renamed into place; returns the path."""
    path = path_of(recording["tool"], recording["scenario"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        f.write(text_of(recording))
    os.replace(partial, path)
    return path


def stored(tool: str) -> list:
    """Every stored recording file of ``tool``, sorted (the integration run re-records each)."""
    folder = os.path.join(FOLDER, tool)
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".json"))

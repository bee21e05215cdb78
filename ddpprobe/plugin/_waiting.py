"""Tests that wait, run side by side: more pytest-xdist workers than cores, and the waiting tests on workers of
their own, so that their sleeping overlaps the CPU-bound tests.

A fact that provokes a hang waits seconds for a process-group or world timeout while using almost no CPU. Such a
test says so with ``@pytest.mark.waits_for_timeout`` on its function or in its module's ``pytestmark`` (the
declaration; the controller reads it from the test file's source, :func:`waiting_functions`, since under xdist
only the workers collect). Then, under ``pytest -n auto``:

- :func:`auto_num_workers` (the ``pytest_xdist_auto_num_workers`` hook) gives ``WAITING_WORKERS`` workers more
  than the machine has cores when a selected test file holds such a test;
- :class:`WaitsFirstScheduling` (the ``pytest_xdist_make_scheduler`` hook, in place of xdist's default ``load``
  distribution) deals the waiting tests into ``workers - cores`` groups (at least one), each run by one worker
  from the start, while every other test goes, one at a time, to whichever worker is free. A worker whose group
  is done takes other tests too.

So while the waiting workers sleep through their timeouts, the others keep the cores busy; the run's wall time
is about the larger of its CPU time per core and the longest group's waits, not their sum. Node ids are not
changed (xdist's ``loadgroup`` would append ``@group`` to them, and the semantics card keys facts by node id).
"""

from __future__ import annotations

import ast
import functools
import os
from typing import Optional

#: Workers added to the cores under ``-n auto`` when waiting tests are selected (``DDPPROBE_WAITING_WORKERS``).
#: Each worker costs its own import and collection (5-15 s of CPU in this suite) and, on a machine whose cores
#: are busy, every extra process running worlds adds contention; one is where the facts' waits overlapped best
#: per CPU second spent (benchmarks/README.md, "Waits that overlap").
WAITING_WORKERS = 1

#: The marker a waiting test carries.
MARKER = "waits_for_timeout"


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def waiting_workers() -> int:
    """``DDPPROBE_WAITING_WORKERS`` (a whole number >= 0), else ``WAITING_WORKERS``."""
    raw = os.environ.get("DDPPROBE_WAITING_WORKERS", "").strip()
    return int(raw) if raw.isdigit() else WAITING_WORKERS


def _is_marker(node) -> bool:
    """``pytest.mark.waits_for_timeout`` or ``mark.waits_for_timeout``, called or not."""
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr == MARKER


@functools.lru_cache(maxsize=None)
def waiting_functions(path: str) -> frozenset:
    """The names of the test functions (and methods) in the file at ``path`` that carry the marker, ``{"*"}``
    when its module's ``pytestmark`` does; empty when it names the marker nowhere or cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    except OSError:
        return frozenset()
    if MARKER not in source:
        return frozenset()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return frozenset()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(_is_marker, node.decorator_list)):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            if any(map(_is_marker, values)):
                names.add("*")
    return frozenset(names)


def waits(nodeid: str, rootdir: str) -> bool:
    """Whether the test ``nodeid`` (``path::[Class::]function[params]``, relative to ``rootdir``) carries the
    marker on its function or module."""
    path, _, rest = nodeid.partition("::")
    function = rest.split("::")[-1].split("[")[0]
    names = waiting_functions(os.path.join(rootdir, path))
    return "*" in names or function in names


def _test_files(paths) -> list:
    files = []
    for path in paths:
        if os.path.isfile(path):
            files.append(path)
        for folder, _, names in os.walk(path):
            files += [os.path.join(folder, n) for n in names if n.startswith("test_") and n.endswith(".py")]
    return files


def auto_num_workers(config) -> Optional[int]:
    """Workers for ``-n auto``: the cores plus :func:`waiting_workers` when a selected test file (the command
    line's paths, else ``testpaths``) holds a waiting test; None (xdist decides) otherwise or when
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` is set. Narrowing with ``-k`` or ``-m`` is not seen here."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    rootdir = str(config.rootpath)
    given = [a.split("::")[0] for a in config.args if not a.startswith("-")]
    paths = given or [os.path.join(rootdir, p) for p in config.getini("testpaths")] or [rootdir]
    paths = [p if os.path.isabs(p) else os.path.join(str(config.invocation_params.dir), p) for p in paths]
    if any(waiting_functions(f) for f in _test_files(paths)):
        return cores() + waiting_workers()
    return None


def make_scheduler(config, log):
    """:class:`WaitsFirstScheduling` for xdist's default distribution (``load``), else None (xdist's own)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WaitsFirstScheduling(LoadScopeScheduling):
        """xdist's scope scheduling, each test its own scope but the waiting tests, dealt in collection order
        into ``max(1, workers - cores)`` groups; the groups are sent first (``--loadscope-reorder``, on by
        default, puts the larger scopes first; without it the waiting tests lead the collection anyway,
        ddpprobe/plugin/_test_code.py), one worker each."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.rootdir = str(config.rootpath)
            self.groups = max(1, self.numnodes - cores())
            self.dealt: dict = {}

        def _split_scope(self, nodeid: str) -> str:
            if not waits(nodeid, self.rootdir):
                return nodeid
            if nodeid not in self.dealt:
                self.dealt[nodeid] = f"waits-{len(self.dealt) % self.groups}"
            return self.dealt[nodeid]

    return WaitsFirstScheduling(config, log)

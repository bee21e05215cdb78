"""What a test's code says about the worlds it runs, read by the pytest plugin (ddpprobe/plugin/pytest_plugin.py).

- :func:`waits_for_timeout`: the test waits seconds for a timeout by design (marked ``waits_for_timeout``); under
  xdist such tests start first (:func:`start_waiting_tests_first`, ddpprobe/plugin/_waiting.py);
- :func:`fails_by_design`: the test gets fresh worlds, never warm ones (ddpprobe/plugin/_warm.py).
"""

from __future__ import annotations

import functools
import inspect
import re


def start_waiting_tests_first(items) -> None:
    """Move the tests that wait for a timeout by design to the front, keeping the order within each part.

    A test waits when it is marked ``waits_for_timeout`` (a fact that provokes a hang and is released by a
    short process-group timeout). Such a test holds its worker for seconds while using almost no CPU; started
    first, those seconds pass while the other workers run the CPU-bound tests, instead of at the end with the
    cores idle (the plugin's scheduler, ddpprobe/plugin/_waiting.py, sends them to workers of their own; under
    ``--dist load`` the first batches are the front of this list). Every worker collects the same order, as
    xdist requires.
    """
    items[:] = sorted(items, key=lambda item: not waits_for_timeout(item))


def waits_for_timeout(item) -> bool:
    return item.get_closest_marker("waits_for_timeout") is not None


@functools.lru_cache(maxsize=None)
def body_of(function) -> str:
    """The source of ``function`` from its ``def`` line on (its decorators, e.g. parameters, left out)."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return ""
    start = source.find(f"def {function.__name__}(")
    return source[start:] if start >= 0 else source


#: What in a test's code says it fails a world by design or watches the ranks' processes: it then gets
#: fresh worlds, never warm ones (a warm world that fails is ended and the call run again fresh, so such a
#: test would pay for two worlds, and a warm rank's process outlives the call).
FRESH_BY_DESIGN = re.compile(r"pg_timeout=|\b(RankFailed|RankDied|WorldTimeout|WorldError|pids?|exitcodes?)\b")


def fails_by_design(item) -> bool:
    """The test gets fresh worlds only: marked ``fresh_world`` or ``waits_for_timeout``, or its code names one
    of ``FRESH_BY_DESIGN``."""
    if item.get_closest_marker("fresh_world") is not None or item.get_closest_marker("waits_for_timeout"):
        return True
    function = getattr(item, "function", None)
    return function is not None and FRESH_BY_DESIGN.search(body_of(function)) is not None

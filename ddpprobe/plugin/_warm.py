"""Warm worlds for the ``run_world`` fixture: one pool per pytest process, one warm world per kind of world.

With ``--warm-worlds`` (or ``DDPPROBE_WARM_WORLDS=1``) the fixture gives each call to :meth:`WarmPool.run`
first. The pool keeps, for each group of settings a world depends on, a ``ddpprobe.launch.WarmWorld`` whose
ranks stay up and run one scenario after another, each as a fresh world would (ddpprobe/launch/_warm.py,
ddpprobe/launch/_warm_rank.py): same ``WorldResult``, new world folder and working directories, the
environment, random generators, warnings, logging and torch's flags as a freshly forked rank has them, and
a new process group per scenario.

The group of settings (the pool's key): world size, nodes, backend, start method, ``keep_cluster_env``, the
call's ``env=``, the launcher's environment (``os.environ`` but ``IGNORED_ENVIRONMENT``, which includes the
Lightning package chosen, ``DDPPROBE_LIGHTNING``) and ``sys.path``. Each scenario gets the environment anew
from the launcher, but modules a rank imported while running one keep what they read at import.

A warm world that fails is never reused: if any rank raises, dies, or does not finish within the world
timeout, the world is ended and :meth:`WarmPool.run` returns None; the fixture then runs the call in a
fresh world (``ddpprobe.run_world``), whose result or error is what the test sees; when that fresh run
succeeds, the fixture warns ``WarmWorldLeakSuspect`` naming the scenario (a failure that only a warm world
shows points at state a scenario leaked). Calls that fail by design
go to a fresh world at once (the fixture decides: ``fresh_world``, a test that waits for a timeout or
expects a ``WorldError``, a call with its own ``timeout=`` or ``pg_timeout=``), and so does anything
``ddpprobe.launch.warm_call`` refuses (nccl, an external world, torch's Flight Recorder on).

The pool holds at most ``MAX_RANKS`` rank processes (the least recently used world is ended first) and
gives a world at most ``MAX_SCENARIOS`` scenarios; :meth:`close` ends every world (at the session's end).
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import warnings
from typing import Callable, Optional

from ddpprobe.launch import WarmWorld, WorldResult, warm_call

#: Most rank processes the warm worlds of one pytest process hold at once (each a forked Python process
#: with torch and Lightning loaded, about 150 MB of its own once it has run a Trainer).
MAX_RANKS = 12

#: Most scenarios one warm world runs before it is ended and a new one started: a bound on whatever a
#: rank accumulates that no reset clears (allocator caches, interned strings).
MAX_SCENARIOS = 200

#: The environment variable that turns warm worlds on (``--warm-worlds``).
ENV_VAR = "DDPPROBE_WARM_WORLDS"

#: Variables of the launcher's environment that change no world: pytest's name of the current test and
#: the folder of the log of worlds (ddpprobe/plugin/_shared_worlds.py).
IGNORED_ENVIRONMENT = ("PYTEST_CURRENT_TEST", "DDPPROBE_WORLD_LOG")


class WarmPool:
    """The warm worlds of one pytest process.

    Attributes:
        warm: calls answered by a warm world.
        fell_back: calls a warm world failed (each then ran in a fresh world).
        started: warm worlds started.
    """

    def __init__(self, max_ranks: int = MAX_RANKS, max_scenarios: int = MAX_SCENARIOS):
        self.max_ranks = max_ranks
        self.max_scenarios = max_scenarios
        self.worlds: collections.OrderedDict = collections.OrderedDict()  # key -> WarmWorld, oldest first
        self.warm = 0
        self.fell_back = 0
        self.started = 0
        atexit.register(self.close)

    def run(self, scenario: Callable, world_size, kwargs: dict) -> Optional[WorldResult]:
        """``run_world(scenario, world_size, **kwargs)``'s result from a warm world, or None: the call is
        not one a warm world runs, its arguments are bad (the fresh world raises the error), or the warm
        world failed (it is ended; the fresh world gives the outcome)."""
        try:
            call = warm_call(scenario, world_size, **kwargs)
        except Exception:  # noqa: BLE001 - run_world raises the same error for the test to see
            return None
        if call is None:
            return None
        key = (call.world, _sorted(call.env), _sorted(os.environ, IGNORED_ENVIRONMENT), tuple(sys.path))
        world = self.worlds.pop(key, None)
        if world is None:
            world = WarmWorld(*call.world)
            self.started += 1
        try:
            result = world.run(call)
        except Exception:  # noqa: BLE001 - a warm world that cannot run (e.g. its forkserver is gone) is ended
            result = None
        finally:
            if world.ended or world.scenarios >= self.max_scenarios:
                world.close()
            else:
                self.worlds[key] = world  # most recently used last
                self._evict()
        if result is None:
            self.fell_back += 1
        else:
            self.warm += 1
        return result

    def close(self) -> None:
        """End every warm world of this process (its ranks killed and reaped)."""
        while self.worlds:
            _, world = self.worlds.popitem(last=False)
            world.close()

    def _evict(self) -> None:
        while len(self.worlds) > 1 and sum(w.world_size for w in self.worlds.values()) > self.max_ranks:
            _, world = self.worlds.popitem(last=False)
            world.close()


class WarmWorldLeakSuspect(UserWarning):
    """A call failed on a warm world and passed in a fresh one: a scenario run before it on those ranks
    probably changed process state that the warm reset does not put back (docs/worlds.md, "Warm worlds")."""


def warn_leak_suspect(ref: str, world_size) -> None:
    """Warn (shown in pytest's summary) that scenario ``ref`` failed warm and passed fresh; the test keeps
    the fresh outcome."""
    warnings.warn(
        WarmWorldLeakSuspect(
            f"{ref} at world size {world_size} failed on a warm world and passed in a fresh one: a scenario "
            "run before it on the same warm ranks probably left process state the warm reset does not put "
            "back (a changed library class or module attribute?); run it with --fresh-worlds, then find the "
            "earlier scenario (docs/worlds.md, 'Warm worlds')"
        ),
        stacklevel=3,
    )


def _sorted(mapping, ignored=()) -> tuple:
    return tuple(sorted((k, v) for k, v in mapping.items() if k not in ignored))


#: Whether the fixture runs warm worlds when neither ``--warm-worlds`` nor ``DDPPROBE_WARM_WORLDS`` says
#: (``--fresh-worlds`` and ``DDPPROBE_WARM_WORLDS=0`` turn them off whatever this says).
DEFAULT = True


def enabled(option: bool) -> bool:
    """Warm worlds on: ``--warm-worlds`` given, or ``DDPPROBE_WARM_WORLDS`` 1/true/yes; off with 0/false/no;
    else ``DEFAULT``."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if option or value in ("1", "true", "yes"):
        return True
    return False if value in ("0", "false", "no") else DEFAULT

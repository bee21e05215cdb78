"""One audit run per scenario for the whole test run: the tooling tests' shared audit runner.

``audited(model, data, ...)`` takes ``ddpprobe.audit.audit``'s arguments and returns its ``AuditResult``. The
first call with given arguments runs the audit (two worlds: W=1 and W=``world_size``); every later call with the
same arguments, from any test file and any pytest-xdist worker of the run, gets that result. The arguments are
the key, as given: a module audited at ``stage="fit"`` and at ``"validate"``, or with another ``timeout=``, is
audited again. An audit that raises (``RankFailed``, ``AuditInputError``, a skip) is not kept, so a test that
expects the error gets its own run.

Between processes the results are kept as the ``run_world`` fixture keeps completed worlds
(ddpprobe/plugin/_shared_worlds.py ``SharedWorlds``: one file per key in a folder every worker of the run
shares, the first asker runs the audit while the others wait on its lock, each process reads its own copy);
:func:`use_folder` names that folder (tests/tooling/conftest.py, once per session). Within a process a result
is read once and then shared by the tests that ask for it; a test reads it and must not change it (none does).
Without a folder (a test module imported outside pytest) the cache is this process's alone.

Skips first, with ddpprobe's reason, when a ``world_size``-rank world of ``backend`` cannot run here
(``tests/support/worlds.py``).

Recorded worlds (tests/support/recordings.py): where both factories are given by name, the audit's worlds are read
from the scenario's recording under ``tests/recordings/audit/`` when one was made on this release, and only the pure
part (``ddpprobe.audit._pipeline.assemble``: evidence, causes, report) runs, in this process. Without one (a new
scenario, another release) the audit runs live; under ``--regen-all`` it runs live and writes the recording.
``live=True`` runs it live whatever is stored: for a test whose claim is about the live run itself (a file the
ranks wrote, what an environment variable did), and never records it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Callable, Optional, Union

from tests.support import recordings
from tests.support.worlds import skip_unless_runnable

#: The environment variables that change how the audit's worlds run (ddpprobe's world and process-group timeouts,
#: start method, backend): a scenario holds those that are set, so a run that sets one records and reads its own.
LIVE_ENVIRONMENT = ("DDPPROBE_TIMEOUT", "DDPPROBE_PG_TIMEOUT", "DDPPROBE_START_METHOD", "DDPPROBE_BACKEND")
#: The folder of the run's shared results (:func:`use_folder`); None: this process keeps its own.
_FOLDER = [None]


def use_folder(folder: Optional[str]) -> None:
    """Keep audit results in ``folder``, shared by every process of the run that names the same one."""
    _FOLDER[0] = folder


def audited(
    model: Union[str, Callable],
    data: Union[str, Callable, None] = None,
    world_size: int = 2,
    stage: str = "validate",
    *,
    backend: str = "gloo",
    timeout: Optional[float] = None,
    max_epochs: int = 1,
    live: bool = False,
):
    """``ddpprobe.audit.audit(model, data, world_size, stage, backend=..., timeout=..., max_epochs=...)``, run once
    per distinct set of arguments in the test run, from its recording where one is stored (``live=True``: never)."""
    skip_unless_runnable(backend, world_size)
    return _audit(model, data, world_size, stage, backend, timeout, max_epochs, live)


def scenario_of(model, data, world_size: int, stage: str, backend: str, timeout, max_epochs: int) -> Optional[dict]:
    """The recording's key for these arguments (with the environment variables the audit reads: ``PYTHONHASHSEED``
    and those of :data:`LIVE_ENVIRONMENT` that are set), or None where a
    factory is not given by name (a callable: not recordable)."""
    if not all(isinstance(ref, (str, type(None))) for ref in (model, data)):
        return None
    return {
        "model": model,
        "data": data,
        "world_size": world_size,
        "stage": stage,
        "backend": backend,
        "timeout": timeout,
        "max_epochs": max_epochs,
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED") or None,
        **{name: os.environ[name] for name in LIVE_ENVIRONMENT if os.environ.get(name)},
    }


def replay(recording: dict):
    """The :class:`~ddpprobe.audit.AuditResult` of a stored audit recording: the pure part of the audit, in this
    process, at the audit's default tolerances."""
    from ddpprobe.audit._pipeline import assemble
    from ddpprobe.audit.worlds._worlds import Worlds

    return assemble(Worlds.from_dict(recording["worlds"]), recording["inputs"], 1e-5, 1e-6)


def record(scenario: dict) -> dict:
    """A live recording of ``scenario`` (:func:`scenario_of`): the audit's worlds, run now."""
    from ddpprobe.audit import audit_worlds

    arguments = {k: v for k, v in scenario.items() if k != "PYTHONHASHSEED" and k not in LIVE_ENVIRONMENT}
    model, data, size, stage = (arguments.pop(k) for k in ("model", "data", "world_size", "stage"))
    worlds, inputs = audit_worlds(model, data, size, stage, **arguments)
    return recordings.make("audit", scenario, inputs=inputs, worlds=worlds.to_dict())


@functools.lru_cache(maxsize=None)
def _audit(model, data, world_size: int, stage: str, backend: str, timeout: Optional[float], max_epochs: int, live):
    from ddpprobe.audit import audit

    scenario = None if live else scenario_of(model, data, world_size, stage, backend, timeout, max_epochs)
    if scenario is not None:
        found = recordings.load("audit", scenario)
        if found is not None:
            return replay(found)

    def run():
        if scenario is None:
            return audit(model, data, world_size, stage, backend=backend, timeout=timeout, max_epochs=max_epochs)
        made = record(scenario)
        if recordings.updating():
            recordings.store(made)
        return replay(made)

    folder = _FOLDER[0]
    if folder is None or scenario is None:
        return run()
    from ddpprobe.plugin._shared_worlds import IGNORED_ENVIRONMENT, SharedWorlds

    environ = sorted((k, v) for k, v in os.environ.items() if k not in IGNORED_ENVIRONMENT)
    arguments = [model, data, world_size, stage, backend, timeout, max_epochs, environ]
    key = "audit-" + hashlib.sha256(json.dumps(arguments).encode()).hexdigest()
    result, _ = SharedWorlds(folder).run(key, run)
    return result

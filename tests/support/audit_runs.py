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
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Callable, Optional, Union

from tests.support.worlds import skip_unless_runnable

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
):
    """``ddpprobe.audit.audit(model, data, world_size, stage, backend=..., timeout=..., max_epochs=...)``, run once
    per distinct set of arguments in the test run."""
    skip_unless_runnable(backend, world_size)
    return _audit(model, data, world_size, stage, backend, timeout, max_epochs)


@functools.lru_cache(maxsize=None)
def _audit(model, data, world_size: int, stage: str, backend: str, timeout: Optional[float], max_epochs: int):
    from ddpprobe.audit import audit

    def run():
        return audit(model, data, world_size, stage, backend=backend, timeout=timeout, max_epochs=max_epochs)

    folder = _FOLDER[0]
    if folder is None or not all(isinstance(ref, (str, type(None))) for ref in (model, data)):
        return run()
    from ddpprobe.plugin._shared_worlds import IGNORED_ENVIRONMENT, SharedWorlds

    environ = sorted((k, v) for k, v in os.environ.items() if k not in IGNORED_ENVIRONMENT)
    arguments = [model, data, world_size, stage, backend, timeout, max_epochs, environ]
    key = "audit-" + hashlib.sha256(json.dumps(arguments).encode()).hexdigest()
    result, _ = SharedWorlds(folder).run(key, run)
    return result

"""One audit run per scenario for the whole test process: the tooling tests' shared audit runner.

``audited(model, data, ...)`` takes ``ddpprobe.audit.audit``'s arguments and returns its ``AuditResult``. The
first call with given arguments runs the audit (two worlds: W=1 and W=``world_size``); every later call with the
same arguments, from any test file in this process (one pytest-xdist worker), gets that same result. The
arguments are the key, as given: a module audited at ``stage="fit"`` and at ``"validate"``, or with another
``timeout=``, is audited again. An audit that raises (``RankFailed``, ``AuditInputError``, a skip) is not kept, so
a test that expects the error gets its own run.

The result is shared, not copied: a test reads it and must not change it (none does; ``AuditResult`` is what
the audit concluded, its fields read-only by convention).

Skips first, with ddpprobe's reason, when a ``world_size``-rank world of ``backend`` cannot run here
(``tests/support/worlds.py``).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Union

from tests.support.worlds import skip_unless_runnable


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
    per distinct set of arguments in this process."""
    skip_unless_runnable(backend, world_size)
    return _audit(model, data, world_size, stage, backend, timeout, max_epochs)


@functools.lru_cache(maxsize=None)
def _audit(model, data, world_size: int, stage: str, backend: str, timeout: Optional[float], max_epochs: int):
    from ddpprobe.audit import audit

    return audit(model, data, world_size, stage, backend=backend, timeout=timeout, max_epochs=max_epochs)

"""Guard a real run: a collective hazard becomes a clear error at its first step, on any backend.

::

    from ddpprobe.guard import CollectiveGuard

    trainer = Trainer(strategy="ddp", callbacks=[CollectiveGuard()])

Before each collective a rank makes from Python (``self.log(..., sync_dist=True)`` syncs, torchmetrics
state syncs, ``all_gather``, ``strategy.reduce``, barriers, ``reduce_boolean_decision``) and at each hook
boundary (setup, each batch's start and end, each epoch's end, teardown), every rank announces a digest
of what it is about to do to the world's c10d store and waits for the check's verdict, which the last
rank to arrive sets (five store requests per rank per check whatever the world size). A difference
raises ``CollectiveMismatch`` on every rank, naming each rank's side in the words of the audit
(``ddpprobe.trace.describe_collective``); a peer that raised makes the waiting ranks raise
``PeerFailed`` naming its error; a peer that does not arrive within the guard's timeout is named with its
last check (``GuardTimeout``). All are ``GuardError``. The guard makes no collective of its own.

At the start of each stage, after the first optimizer step, at each epoch's end and at the end, every rank
also posts a digest of the state the DDP contract says must be equal on every rank (ddpprobe/contract/:
optimizer settings, parameters, module attributes, datasets by their own state ...); the small fields of it
(optimizer settings, schedulers, the loop's counters) ride on every training batch's end check too. A difference
raises ``StateDiverged`` on every rank, naming the field and each rank's value (``CollectiveGuard(state=False)``
turns it off). The records read only: no item of a dataset, no random draw, no collective.

Every rank also meets at a check at Lightning's barrier after ``prepare_data`` (which Lightning runs on some ranks
only), so a collective made there is named at once, not after the guard's timeout.

A field that differs is named with the user's line that last set it where the guard sees the set (module
attributes, optimizer param-group keys), else with the hooks each rank ran since it was last equal; a fix is given
where the registry's preconditions hold on what the guard saw (the branch fix only where the code reads the rank).

Layout: ``_callback.py`` (the callback and the wrappers), ``_exchange.py`` (the store protocol),
``_entries.py`` (what a rank posts, the comparison, the error text), ``_state.py`` (the state checks),
``_writers.py`` (where a differing field was written, and the hooks that ran), ``_errors.py`` (the errors, and how
an uncaught one is printed: once, message first, under the user's line that parted the ranks). See docs/guard.md
for what it catches, what it costs, how it scales and what it cannot see.
"""

from ddpprobe.guard._callback import CollectiveGuard
from ddpprobe.guard._errors import CollectiveMismatch, GuardError, GuardTimeout, PeerFailed, StateDiverged

__all__ = ["CollectiveGuard", "CollectiveMismatch", "GuardError", "GuardTimeout", "PeerFailed", "StateDiverged"]

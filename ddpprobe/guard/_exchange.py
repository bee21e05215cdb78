"""The guard's protocol over the world's store: post an entry, wait for every rank's entry of the same
check, compare, raise.

Keys, under the prefix ``ddpprobe-guard/<session>/`` (one session per ``Trainer`` stage a guard runs):
``<n>/<rank>`` holds rank ``rank``'s entry (ddpprobe/guard/_entries.py) for check ``n``. A rank posts its
entry, then waits (``store.wait``, server-side, no polling) for all ``W`` entries of ``n`` until the
guard's timeout, reads them in one ``multi_get`` and compares their ``id``. Once a rank holds every entry
of check ``n``, every rank has posted ``n`` and so has read every entry of ``n - 1``: it deletes its own
``n - 1`` key, so the store holds about two entries per rank whatever the run's length.

A rank that raises posts a ``raised`` entry under its next check number: the peers waiting there (they
can only wait at that number, since it posted every earlier one) wake at once and raise ``PeerFailed``.
A rank whose wait times out replaces its own entry with a ``raised`` one before raising ``GuardTimeout``,
so a peer that arrives late learns it instead of going on alone.

Only store operations: the guard adds no collective to the process group.
"""

from __future__ import annotations

import datetime
import json

import torch.distributed

from ddpprobe.guard import _entries
from ddpprobe.guard._errors import CollectiveMismatch, GuardError, GuardTimeout, PeerFailed

#: Prefix of every key the guard writes in the world's store.
PREFIX = "ddpprobe-guard"


class Exchange:
    """One rank's side of a guarded session.

    Args:
        store: the world's c10d store (``torch.distributed.distributed_c10d._get_default_store()``);
            the session's keys go under a ``PrefixStore``.
        session: a number equal on every rank for the same ``Trainer`` stage (the guard counts them).
        rank, world_size: this rank and the world's size.
        timeout_s: seconds to wait for the peers at each check.
        pg_timeout_s: the process group's timeout in seconds (named in the errors).
        stage: the ``Trainer`` entry point (``"validate"``, ``"fit"`` ...), named in the errors.
    """

    def __init__(self, store, session: int, rank: int, world_size: int, timeout_s: float, pg_timeout_s: float, stage):
        self.store = torch.distributed.PrefixStore(f"{PREFIX}/{session}/", store)
        self.rank = rank
        self.world_size = world_size
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.pg_timeout_s = pg_timeout_s
        self.stage = stage
        #: The next check's sequence number (the number of checks this rank has posted).
        self.n = 0
        #: The guard error this rank raised, raised again at every later check.
        self.error = None

    def _keys(self, n: int) -> list:
        return [f"{n}/{r}" for r in range(self.world_size)]

    def _post(self, entry: dict) -> None:
        self.store.set(f"{entry['n']}/{self.rank}", json.dumps(entry))

    def check(self, entry: dict) -> None:
        """Post ``entry`` (its ``n`` is this check's number) and return once every rank posted the same
        ``id``; raise ``CollectiveMismatch``, ``PeerFailed`` or ``GuardTimeout`` (on this rank) if not."""
        if self.error is not None:  # a guard error the caller swallowed (Lightning's broadcasts do): raise it again
            raise self.error
        n = self.n
        self.n += 1
        try:
            self._compare(n, entry)
        except GuardError as exc:
            self.error = exc
            raise

    def _compare(self, n: int, entry: dict) -> None:
        self._post(entry)
        keys = self._keys(n)
        try:
            self.store.wait(keys, self.timeout)
        except torch.distributed.DistStoreError as exc:
            if "timeout" not in str(exc).lower():
                raise GuardError(
                    f"CollectiveGuard, check #{n}: the world's store cannot be reached ({exc})", n, {}
                ) from exc
            if not self.store.check(keys):  # not a late arrival at the last moment: a timeout
                self._timed_out(n, entry, keys)
        entries = [json.loads(value) for value in self.store.multi_get(keys)]
        if n > 0:
            self.store.delete_key(f"{n - 1}/{self.rank}")
        ids = {json.dumps(e["id"]) for e in entries}
        if len(ids) > 1:
            self._differ(n, entries)

    def post_raised(self, error: str, hook) -> None:
        """Post a ``raised`` entry under the next check number (from ``on_exception``), without waiting."""
        try:
            self._post(_entries.raised(self.n, self.rank, error, hook))
        except Exception:  # noqa: BLE001 - the store may be gone with the world; the rank raises anyway
            pass
        self.n += 1

    def _head(self, n: int) -> str:
        return f"CollectiveGuard, check #{n} of trainer.{self.stage}"

    def _differ(self, n: int, entries: list) -> None:
        sides = {e["rank"]: e["text"] for e in entries}
        failed = {e["rank"]: e["error"] for e in entries if e["kind"] == "raised"}
        text = _entries.sides_text(entries)
        if failed:
            others = [e for e in entries if e["kind"] != "raised"]
            raise PeerFailed(
                f"{self._head(n)}: {_entries.ranks_text(list(failed))} raised before reaching it:\n{text}\n"
                f"Without the guard {_entries.ranks_text([e['rank'] for e in others])} would wait for "
                f"{'it' if len(failed) == 1 else 'them'} until the process-group timeout ({self.pg_timeout_s:g} s).",
                n,
                sides,
                failed,
            )
        raise CollectiveMismatch(
            f"{self._head(n)}: the ranks are not making the same collective calls:\n{text}\n"
            + _entries.consequence(entries, self.pg_timeout_s),
            n,
            sides,
        )

    def _timed_out(self, n: int, entry: dict, keys: list) -> None:
        missing = [r for r, key in enumerate(keys) if not self.store.check([key])]
        if not missing:  # the last one arrived between the two looks
            return
        last_seen = {}
        for r in missing:
            previous = f"{n - 1}/{r}"
            last_seen[r] = (
                json.loads(self.store.get(previous))["text"] if n > 0 and self.store.check([previous]) else None
            )
        error = (
            f"CollectiveGuard timed out: {_entries.ranks_text(missing)} did not reach check #{n} "
            f"within {self.timeout_s:g} s"
        )
        self._post(_entries.raised(n, self.rank, error, None))
        here = [r for r in range(self.world_size) if r not in missing]
        lines = [
            f"  {_entries.ranks_text([r])} "
            + (f"was last at check #{n - 1}: {text}" if text else "has not reached the first check (setup)")
            for r, text in last_seen.items()
        ]
        lines.append(
            f"  {_entries.ranks_text(here)} {'waits' if len(here) == 1 else 'wait'} at check #{n}: {entry['text']}"
        )
        raise GuardTimeout(
            f"{self._head(n)}: {_entries.ranks_text(missing)} did not arrive within {self.timeout_s:g} s "
            f"(CollectiveGuard's timeout; the process-group timeout is {self.pg_timeout_s:g} s):\n"
            + "\n".join(lines)
            + "\nThe missing rank is in slow code, in a collective made from C++ (e.g. DistributedDataParallel's "
            "gradient all_reduce in backward), or gone. Raise CollectiveGuard(timeout=...) if it is only slow.",
            n,
            {r: entry["text"] for r in here},
            missing,
            last_seen,
        )

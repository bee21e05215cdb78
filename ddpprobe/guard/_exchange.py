"""The guard's protocol over the world's store: each rank announces a digest of its entry, the last rank to
arrive sets the check's verdict, the others wait for that one key; full entries travel only when the
digests differ.

Keys, under the prefix ``ddpprobe-guard/<session>/`` (one session per ``Trainer`` stage a guard runs), for
check ``n``:

``n/ref``
    the digest of the first entry to arrive (``compare_set``: set once, read by every later rank).
``n/a``
    the arrival counter (``add``): the rank that brings it to ``W`` is the check's last arrival.
``n/v``
    the verdict (``compare_set``: written once): ``differ``, or the last arrival's position record
    ``{"rank", "n", "text"}`` when every rank's digest equalled ``n/ref``.
``n/e/<rank>``
    rank ``rank``'s full entry (ddpprobe/guard/_entries.py), written only once the verdict is ``differ``.
``s/<rank>``
    rank ``rank``'s position record (``{"n", "text"}``, overwritten at every check it did not close).

A rank at check ``n``: reads ``n/ref`` (setting it if first); if its digest differs it sets the verdict to
``differ`` at once; adds one to ``n/a``; then either closes the check (the ``W``-th arrival: every rank
has compared its digest, so a verdict still unset means they all agree) or writes its position record
and waits (``store.wait``, server-side, no polling) for ``n/v``. That is five store requests per rank per
check, four of them answered, whatever the world size; the store's server handles ``O(W)`` requests per
check instead of ``O(W^2)`` entries. When the verdict is ``differ`` every rank writes its full entry,
waits for all ``W`` of them and compares them (:func:`verdict`, a pure function of the ``W`` entries: the first
difference, in the audit's words; for a state check, the contract's comparison: ddpprobe/guard/_state.py
``diverged``).

The last arrival deletes ``n/ref`` and ``n/a`` (every rank has used them), the previous check's verdict
(every rank has read it: all are at ``n``) and its own position record (its position is in ``n/v``), so
in a run whose checks agree the store holds ``W`` keys of the session however long the run: ``W - 1``
position records and the last verdict.

A rank that raises writes a ``raised`` entry under its next check number and sets that check's verdict
to ``differ``: the peers waiting there (they can only wait at that number, since it passed every earlier
one) wake at once, read its entry and raise ``PeerFailed``. A rank whose wait times out sets the verdict
to ``differ`` (unless the last arrival closed the check in the meantime) and writes a ``raised`` entry
before raising ``GuardTimeout``, naming the missing ranks from their position records; a peer that
arrives late learns it instead of going on alone.

Only store operations: the guard adds no collective to the process group.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Optional

import torch.distributed

from ddpprobe.guard import _entries, _state
from ddpprobe.guard._errors import CollectiveMismatch, GuardError, GuardTimeout, PeerFailed

#: Prefix of every key the guard writes in the world's store.
PREFIX = "ddpprobe-guard"
#: The verdict of a check whose ranks' digests differ (or where a rank raised or timed out).
DIFFER = "differ"


def digest(entry: dict) -> str:
    """What a rank announces for ``entry``: 16 hex digits of the BLAKE2b hash of its ``id`` in JSON
    (equal on every rank exactly when the ``id`` is, but for a 2**-64 chance)."""
    return hashlib.blake2b(json.dumps(entry["id"]).encode(), digest_size=8).hexdigest()


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
        backend: the process group's backend (``"gloo"``, ``"nccl"``), for the sentences that differ by
            backend (None: both are said).
    """

    def __init__(
        self,
        store,
        session: int,
        rank: int,
        world_size: int,
        timeout_s: float,
        pg_timeout_s: float,
        stage,
        backend: Optional[str] = None,
    ):
        self.store = torch.distributed.PrefixStore(f"{PREFIX}/{session}/", store)
        self.rank = rank
        self.world_size = world_size
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.pg_timeout_s = pg_timeout_s
        self.stage = stage
        self.backend = backend
        #: The next check's sequence number (the number of checks this rank has posted).
        self.n = 0
        #: The guard error this rank raised, raised again at every later check.
        self.error = None
        #: Whether this rank's position record ``s/<rank>`` is in the store.
        self._has_slot = False
        #: Seconds the last timed-out wait lasted (the timeout, or more while a peer was busy).
        self._waited_s = timeout_s
        #: ``entry -> None``: adds to a state-bearing entry what this rank saw written (ddpprobe/guard/_writers.py),
        #: called only when the digests differ, before the entry crosses the store.
        self.annotate = None

    def check(self, entry: dict) -> None:
        """Announce ``entry`` (its ``n`` is this check's number) and return once every rank announced the
        same ``id``; raise ``CollectiveMismatch``, ``PeerFailed`` or ``GuardTimeout`` (on this rank) if not."""
        if self.error is not None:  # a guard error the caller swallowed (Lightning's broadcasts do): raise it again
            raise self.error
        n = self.n
        self.n += 1
        try:
            self._compare(n, entry)
        except GuardError as exc:
            exc.rank = self.rank
            self.error = exc
            raise

    def _compare(self, n: int, entry: dict) -> None:
        store, mine = self.store, digest(entry)
        try:
            if store.compare_set(f"{n}/ref", "", mine).decode() != mine:
                store.compare_set(f"{n}/v", "", DIFFER)
            if store.add(f"{n}/a", 1) == self.world_size:
                verdict = self._close(n, entry)
            else:
                store.set(f"s/{self.rank}", json.dumps({"n": n, "text": entry["text"]}))
                self._has_slot = True
                verdict = self._verdict(n, entry)
        except torch.distributed.DistStoreError as exc:
            raise GuardError(
                f"CollectiveGuard, check #{n}: the world's store cannot be reached ({exc})", n, {}
            ) from exc
        if verdict == DIFFER:
            self._explain(n, entry)

    def _close(self, n: int, entry: dict) -> str:
        """The last arrival: set the verdict (every digest is in; ``differ`` is already set if one was
        different) and delete what no rank reads any more."""
        record = json.dumps({"rank": self.rank, "n": n, "text": entry["text"]})
        verdict = self.store.compare_set(f"{n}/v", "", record).decode()
        for key in (f"{n}/ref", f"{n}/a") + ((f"{n - 1}/v",) if n > 0 else ()):
            self.store.delete_key(key)
        if verdict != DIFFER and self._has_slot:
            self.store.delete_key(f"s/{self.rank}")
            self._has_slot = False
        return verdict

    def _verdict(self, n: int, entry: dict) -> str:
        key, waited, timeout = f"{n}/v", 0.0, self.timeout_s
        while True:
            try:
                self.store.wait([key], datetime.timedelta(seconds=timeout))
                break
            except torch.distributed.DistStoreError as exc:
                if "timeout" not in str(exc).lower():
                    raise
                waited += timeout
                notes = self._busy_notes(n)
                if notes and all(note.get("unbounded") for note in notes):
                    timeout = self.timeout_s
                    continue  # the missing ranks are in a step Lightning waits for without a timeout: so do we
                timeout = min(self.timeout_s, self.pg_timeout_s - waited)
                if timeout > 0.001 and notes:
                    continue  # the missing ranks are in a Lightning step that keeps one rank away: wait on
                self._waited_s = waited
                self._timed_out(n, entry)  # returns only if the last arrival closed the check in the meantime
                break
        return self.store.get(key).decode()

    def busy(self, step: str, unbounded: bool = False) -> None:
        """Note in this rank's position record that it is in ``step`` (e.g. ``"writing a checkpoint
        (Trainer.save_checkpoint)"``), a step of Lightning's that keeps this rank alone away from the next
        check: a peer whose wait times out meanwhile waits on, up to the process-group timeout (what it
        would wait in the collective without the guard), or, ``unbounded``, as long as the step lasts (what
        Lightning's own barrier without a timeout around ``prepare_data`` waits). The next check replaces the
        note."""
        text = f"is {step} (after check #{self.n - 1})"
        note = {"n": self.n - 1, "text": text, "busy": step, "unbounded": unbounded}
        try:
            self.store.set(f"s/{self.rank}", json.dumps(note))
            self._has_slot = True
        except Exception:  # noqa: BLE001 - a note only: the peers' timeout applies without it
            pass

    def _busy_notes(self, n: int) -> Optional[list]:
        """The position records of the ranks missing at check ``n`` where every one noted a Lightning step it is in
        (``busy``), else None."""
        notes = []
        for r in range(self.world_size):
            if r == self.rank:
                continue
            record = json.loads(self.store.get(f"s/{r}")) if self.store.check([f"s/{r}"]) else None
            if record is not None and record["n"] >= n:
                continue  # arrived
            if record is None or not record.get("busy"):
                return None
            notes.append(record)
        return notes or None

    def _explain(self, n: int, entry: dict) -> None:
        """The digests differ: every rank writes its full entry; read all ``W`` and raise the difference."""
        if self.annotate is not None and entry.get("record"):
            try:
                self.annotate(entry)
            except Exception:  # noqa: BLE001 - where a field was written is a help; the check's verdict stands
                pass
        self.store.set(f"{n}/e/{self.rank}", json.dumps(entry, default=str))
        keys = [f"{n}/e/{r}" for r in range(self.world_size)]
        try:
            self.store.wait(keys, self.timeout)
        except torch.distributed.DistStoreError as exc:
            if "timeout" not in str(exc).lower():
                raise GuardError(
                    f"CollectiveGuard, check #{n}: the world's store cannot be reached ({exc})", n, {}
                ) from exc
            missing = [r for r, key in enumerate(keys) if not self.store.check([key])]
            if missing:
                self._raise_timeout(n, entry, missing)
        entries = [json.loads(value) for value in self.store.multi_get(keys)]
        if len({json.dumps(e["id"]) for e in entries}) > 1:
            self._differ(n, entries)

    def post_raised(self, error: str, hook) -> None:
        """Write a ``raised`` entry under the next check number and set its verdict to ``differ`` (from
        ``on_exception``), without waiting."""
        try:
            self.store.set(f"{self.n}/e/{self.rank}", json.dumps(_entries.raised(self.n, self.rank, error, hook)))
            self.store.compare_set(f"{self.n}/v", "", DIFFER)
        except Exception:  # noqa: BLE001 - the store may be gone with the world; the rank raises anyway
            pass
        self.n += 1

    def _head(self, n: int) -> str:
        return _head(n, self.stage)

    def _differ(self, n: int, entries: list) -> None:
        error = verdict(entries, n, self.stage, self.pg_timeout_s, self.backend)
        if error is not None:  # None: the digests differ, yet no field breaks the contract (missing or unreadable)
            raise error

    def _positions(self, n: int) -> dict:
        """``{rank: (its last check, its text there)}`` from the position records and the verdict of check
        ``n - 1`` (the record of that check's last arrival); ranks with none are left out."""
        positions = {}
        for r in range(self.world_size):
            if self.store.check([f"s/{r}"]):
                record = json.loads(self.store.get(f"s/{r}"))
                positions[r] = (record["n"], record["text"])
        if n > 0 and self.store.check([f"{n - 1}/v"]):
            value = self.store.get(f"{n - 1}/v").decode()
            if value != DIFFER:
                record = json.loads(value)
                if positions.get(record["rank"], (-1, None))[0] < record["n"]:
                    positions[record["rank"]] = (record["n"], record["text"])
        return positions

    def _timed_out(self, n: int, entry: dict) -> None:
        """No verdict within the timeout: claim the verdict ``differ``, unless the last arrival closed the
        check between the wait and now (then return), and raise ``GuardTimeout`` naming the missing ranks."""
        if self.store.compare_set(f"{n}/v", "", DIFFER).decode() != DIFFER:
            return
        positions = self._positions(n)
        missing = [r for r in range(self.world_size) if r != self.rank and positions.get(r, (-1,))[0] < n]
        self._raise_timeout(n, entry, missing, positions)

    def _raise_timeout(self, n: int, entry: dict, missing: list, positions=None) -> None:
        positions = self._positions(n) if positions is None else positions
        last_seen = {r: positions[r][1] if r in positions and n > 0 else None for r in missing}
        error = (
            f"CollectiveGuard timed out: {_entries.ranks_text(missing)} did not reach check #{n} "
            f"within {self.timeout_s:g} s, where {_entries.ranks_text([self.rank])} {entry['text']}"
        )
        self.store.set(f"{n}/e/{self.rank}", json.dumps(_entries.raised(n, self.rank, error, None)))
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
            f"{self._head(n)}: {_entries.ranks_text(missing)} did not arrive within {self._waited_s:g} s "
            f"(CollectiveGuard's timeout; the process-group timeout is {self.pg_timeout_s:g} s):\n"
            + "\n".join(lines)
            + "\nThe missing rank is in slow code, in a collective the guard does not check (e.g. "
            "DistributedDataParallel's buffer broadcast: of the collectives made from C++ only DDP's gradient "
            "all-reduces are checked, bucket by bucket through the guard's comm hook, and none under "
            "CollectiveGuard(collectives=False)), or gone. Raise CollectiveGuard(timeout=...) if it is only slow.",
            n,
            {r: entry["text"] for r in here},
            missing,
            last_seen,
        )


def verdict(entries: list, n: int, stage, pg_timeout_s: float, backend: Optional[str] = None) -> Optional[GuardError]:
    """The error every rank raises at check ``n`` where the ranks' full ``entries`` (one per rank, as posted:
    ddpprobe/guard/_entries.py) differ, or None where they differ in no field the contract compares (a state field
    missing or unreadable on some rank). Pure: the entries in, the error out, no store; the protocol calls it once
    the digests differ (``Exchange._differ``), and a test replays entries a live world posted through it.

    ``PeerFailed`` where a rank posted ``raised`` (its error named); ``StateDiverged`` where the entries are one
    state check (:func:`ddpprobe.guard._state.same_check`); else ``CollectiveMismatch``, carrying the entries
    (``error.entries``: the report's line of another rank, ddpprobe/guard/_errors.py). ``stage``, ``pg_timeout_s``
    and ``backend`` are the exchange's (named in the words)."""
    sides = {e["rank"]: text for e, text in zip(entries, _entries.side_texts(entries))}
    failed = {e["rank"]: e["error"] for e in entries if e["kind"] == "raised"}
    if not failed and _state.same_check(entries):
        return _state.diverged(_head(n, stage), n, entries)
    text = _entries.sides_text(entries)
    if failed:
        others = [e for e in entries if e["kind"] != "raised"]
        return PeerFailed(
            f"{_head(n, stage)}: {_entries.ranks_text(list(failed))} raised before reaching it:\n{text}\n"
            + _peer_wait([e["rank"] for e in others], len(failed), pg_timeout_s, backend),
            n,
            sides,
            failed,
        )
    error = CollectiveMismatch(
        f"{_head(n, stage)}: the ranks are not making the same collective calls:\n{text}\n"
        + _entries.consequence(entries, pg_timeout_s),
        n,
        sides,
    )
    error.entries = entries  # what each rank posted (the guard defers some, ddpprobe/guard/_callback.py)
    return error


def _head(n: int, stage) -> str:
    return f"CollectiveGuard, check #{n} of trainer.{stage}"


def _peer_wait(waiting: list, failed: int, pg_timeout_s: float, backend: Optional[str]) -> str:
    """What the ``waiting`` ranks would do without the guard, in the collective the ranks that raised never
    join; on each backend where they differ (this run's named first). gloo fails the wait at once when the
    peer's process exits (its connection closes, tests/facts/test_collective_hazards_keys.py) and waits
    until the process-group timeout while the process lives on (tests/facts/
    test_collective_hazards_callbacks.py, the peers kept alive); NCCL waits until the timeout."""
    it, its = ("it", "its process") if failed == 1 else ("them", "their processes")
    pg = f"the process-group timeout ({pg_timeout_s:g} s)"
    gloo = f"on gloo until {its} {'exits' if failed == 1 else 'exit'} (the closed connection fails the wait at "
    gloo += f"once) or, while {'it lives' if failed == 1 else 'they live'} on, until {pg}"
    nccl = f"on NCCL until {pg}"
    said = [nccl, gloo] if backend == "nccl" else [gloo, nccl]
    return f"Without the guard {_entries.ranks_text(waiting)} would wait for {it} in the collective: " + (
        "; ".join(said) + "."
    )

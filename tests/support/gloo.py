"""The backends' own words for what went wrong in a collective, shared by the facts that provoke it:
:func:`error_kind` says which of three failures a rank's error text reports.

gloo reports a partner that left (its socket closed) with different words depending on when the read or
write noticed: "Connection closed by peer", "Connection reset by peer" or a "Read error". A late partner
ends in "Timed out waiting ...ms" or, on the pair it was reading from, "Application timeout caused pair
closure". A message larger than the buffer posted for it ends in "Received data size doesn't match
expected size" (``gloo::EnforceNotMet``, thrown in a background thread, so the rank aborts). Source:
gloo/transport/tcp/pair.cc (``Pair::read``, ``Pair::waitUntilConnected``, ``signalException``) and
unbound_buffer.cc (``waitRecv``).

NCCL has no connection to lose: a collective without partners waits until the process-group timeout,
then ``WorkNCCL::checkTimeout`` records "Watchdog caught collective operation timeout: WorkNCCL(...) ran
for N milliseconds before timing out" (raised as a ``DistBackendError`` by the rank waiting under
``TORCH_NCCL_BLOCKING_WAIT=1``, or, without it, aborting the process from the watchdog), and the blocking
wait logs "Work ... timed out in blocking wait". Source: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp
(``WorkNCCL::checkTimeout``, ``WorkNCCL::wait``).
"""

import re
from typing import Optional

#: The kinds :func:`error_kind` tells apart.
PEER_GONE, TIMED_OUT, SIZE_MISMATCH = "peer gone", "timed out", "size mismatch"

#: A collective whose partner is gone (gloo).
PEER_GONE_WORDS = ("Connection closed by peer", "Connection reset by peer", "Read error")
#: A collective whose partner did not come within the process-group timeout (gloo, then NCCL).
TIMEOUT_WORDS = (
    "Timed out waiting",
    "Application timeout caused pair closure",
    "Watchdog caught collective operation timeout",
    "timed out in blocking wait",
)
#: A received message larger than the buffer posted for it (gloo).
SIZE_MISMATCH_WORDS = ("Received data size doesn't match expected size",)

#: Each kind's words, in the order :func:`error_kind` looks for them.
_WORDS = ((TIMED_OUT, TIMEOUT_WORDS), (SIZE_MISMATCH, SIZE_MISMATCH_WORDS), (PEER_GONE, PEER_GONE_WORDS))


def error_kind(text: str) -> Optional[str]:
    """Which failure ``text`` (a rank's error, ``WorldError.rank_errors[r]``) reports.

    Returns:
        ``TIMED_OUT`` ("timed out") when it holds any timeout words, else ``SIZE_MISMATCH`` ("size
        mismatch") for a received size that did not match, else ``PEER_GONE`` ("peer gone") for a
        partner that left; None when it holds none of these (e.g. a Python exception of the user's,
        or ``"did not finish"``). The order makes "peer gone" and "size mismatch" mean also "no
        timeout": a rank said to have lost its partner did not wait for the process-group timeout.
    """
    for kind, words in _WORDS:
        if any(w in text for w in words):
            return kind
    return None


def collective_in(traceback: str) -> Optional[str]:
    """The ``torch.distributed`` function (``"all_reduce"``, ``"all_gather"``, ``"barrier"`` ...) a rank's
    traceback ends in: the last frame of torch/distributed/distributed_c10d.py, or None."""
    frames = re.findall(r'distributed_c10d\.py", line \d+, in (\w+)', traceback)
    return frames[-1] if frames else None


def where_waiting(err, rank: int) -> str:
    """Where rank ``rank`` of a failed world (``err``, a ``WorldError``) was, as traceback text (most recent
    call last, ``File "...", line N, in name`` lines), whether it raised or was ended by the launcher: its
    traceback if it raised, else its main thread's frames from the Python stack the launcher captured when
    it ended it (``err.stacks``, faulthandler's format: the ``Current thread`` block, most recent call
    first). :func:`collective_in` reads either. Raises ``KeyError`` for a rank with neither."""
    if rank in getattr(err, "tracebacks", {}):
        return err.tracebacks[rank]
    stack = err.stacks[rank]
    current = stack.split("Current thread", 1)[-1]
    frames = re.findall(r'File "([^"]+)", line (\d+) in (\w+|<module>)', current)
    return "\n".join(f'  File "{path}", line {line}, in {name}' for path, line, name in reversed(frames))


def assert_stuck_until_the_timeout(err, elapsed: float, pg_timeout: float, world_size: int) -> None:
    """What a world whose ranks wait in unpaired collectives reports (``err``, a ``RankFailed``): it failed
    no sooner than the process-group timeout (``elapsed`` and ``pg_timeout`` in seconds); rank 0 is among
    the ranks that raised, each with a ``RuntimeError`` saying it timed out or lost its partner, at least one
    of them a timeout; every other rank "did not finish" (ended by the launcher)."""
    assert elapsed >= pg_timeout, f"failed after {elapsed:.1f}s, before the process-group timeout"
    assert 0 in err.ranks and set(err.exc_types.values()) == {"RuntimeError"}, f"{err.ranks} {err.exc_types}\n{err}"
    errors = {r: err.rank_errors[r] for r in err.ranks}
    assert any(error_kind(text) == TIMED_OUT for text in errors.values()), errors
    assert all(error_kind(text) in (TIMED_OUT, PEER_GONE) for text in errors.values()), errors
    assert all(err.rank_errors[r] == "did not finish" for r in range(world_size) if r not in err.ranks), err.rank_errors

"""gloo's own words for what went wrong in a collective, shared by the facts that provoke it.

gloo reports a partner that left (its socket closed) with different words depending on when the read or
write noticed: "Connection closed by peer", "Connection reset by peer" or a "Read error". A late partner
ends in "Timed out waiting ...ms" or, on the pair it was reading from, "Application timeout caused pair
closure". Source: gloo/transport/tcp/pair.cc (``Pair::read``, ``Pair::waitUntilConnected``, ``signalException``).
"""

import re

#: A collective whose partner is gone.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Read error")
#: A collective whose partner did not come within the process-group timeout.
TIMEOUTS = ("Timed out waiting", "Application timeout caused pair closure")


def says_peer_gone(text: str) -> bool:
    """Whether ``text`` (a rank's error) is gloo's report of a partner that left the collective."""
    return any(words in text for words in PEER_GONE)


def says_timed_out(text: str) -> bool:
    """Whether ``text`` (a rank's error) is gloo's report of a partner that did not come in time."""
    return any(words in text for words in TIMEOUTS)


def collective_in(traceback: str) -> "str | None":
    """The ``torch.distributed`` function (``"all_reduce"``, ``"all_gather"``, ``"barrier"`` ...) a rank's
    traceback ends in: the last frame of torch/distributed/distributed_c10d.py, or None."""
    frames = re.findall(r'distributed_c10d\.py", line \d+, in (\w+)', traceback)
    return frames[-1] if frames else None

"""Where a launched world meets: a rendezvous store on loopback only, and a folder for this user only.

The store is a ``torch.distributed.TCPStore`` the launcher hosts; ranks connect to it as clients
(``TORCHELASTIC_USE_AGENT_STORE=True``, ddpprobe/launch/_rank.py). It takes unauthenticated reads and
writes, so it must not be reachable from another host. ``TCPStore("127.0.0.1", 0, is_master=True)``
alone does not do that: in torch 2.13, with either server backend (libuv or the classic one), the
server binds the wildcard address (``[::]:PORT``, every interface, IPv4 included) whatever host name it
is given. The launcher therefore binds a socket to 127.0.0.1 itself and hands it to the store
(``master_listen_fd``, torch/csrc/distributed/c10d/TCPStore.hpp ``TCPStoreOptions::masterListenFd``),
so the store listens on 127.0.0.1 only, on a port the OS chose (no two worlds collide).
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile

#: Address every launched world listens on and connects to.
LOOPBACK = "127.0.0.1"

#: Pending connections the store's listening socket accepts (torch uses the same for its own socket).
LISTEN_BACKLOG = 2048


def private_world_dir() -> str:
    """A new folder for one world, readable and writable by the current user only (mode ``0o700``)."""
    return tempfile.mkdtemp(prefix="ddpprobe-world-")  # mkdtemp creates it with mode 0o700


def loopback_store(timeout_s: float):
    """A ``TCPStore`` server listening on 127.0.0.1 only, on a free port (``store.port``).

    Args:
        timeout_s: seconds a store operation may wait (the process group's timeout).
    """
    from torch.distributed import TCPStore

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, 0))
        listener.listen(LISTEN_BACKLOG)
        port = listener.getsockname()[1]
        fd = listener.detach()  # the store owns the socket from here and closes it when deleted
    try:
        return TCPStore(
            LOOPBACK,
            port,
            None,
            True,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=fd,
        )
    except BaseException:
        os.close(fd)
        raise

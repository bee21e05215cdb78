"""A launched world is reachable from this machine only, and its files from this user only.

While a world runs, the launcher hosts the rendezvous ``TCPStore`` and every rank holds gloo's sockets.
The store takes unauthenticated reads and writes, so it must not listen on an address another host can
reach: the launcher binds it to 127.0.0.1 itself and hands the listening socket to torch
(``TCPStore(master_listen_fd=...)``, ddpprobe/launch/_rendezvous.py); the ranks connect to it as
clients (``TORCHELASTIC_USE_AGENT_STORE``) and gloo listens on the loopback interface only
(``GLOO_SOCKET_IFNAME=lo``). The world's folder (ranks' output, stacks, working directories) is
``0o700``. (ddpprobe/launch/_rendezvous.py, _rank.py ``_set_environment``.)
"""

from __future__ import annotations

import ipaddress
import os
import stat

import pytest

from ddpprobe.probes import validation

pytestmark = pytest.mark.not_a_fact("tests what a launched world exposes, not a fact about DDP")


# ---------------------------------------------------------------------------------------------
# Listening sockets of a set of processes, from /proc
# ---------------------------------------------------------------------------------------------


def _address(hex_address: str) -> tuple:
    """``"0100007F:1F90"`` (a /proc/net/tcp* field) -> ``("127.0.0.1", 8080)``.

    The kernel prints the address as 32-bit words in host byte order (little-endian here)."""
    ip_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(ip_hex)
    network_order = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(network_order)), int(port_hex, 16)


def listening_sockets(pids) -> list:
    """``[(pid, "tcp" or "tcp6", address, port), ...]``: TCP sockets in the LISTEN state that one of
    ``pids`` holds open (matched by inode between ``/proc/<pid>/fd`` and ``/proc/<pid>/net/tcp*``)."""
    found = []
    for pid in pids:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:  # closed meanwhile
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:[") : -1])
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}") as fh:
                next(fh)  # header
                for line in fh:
                    fields = line.split()
                    if fields[3] == "0A" and fields[9] in inodes:  # 0A: TCP_LISTEN
                        found.append((pid, table, *_address(fields[1])))
    return sorted(found)


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


# ---------------------------------------------------------------------------------------------
# Scenarios (run inside the ranks)
# ---------------------------------------------------------------------------------------------


def sockets_while_running(info, launcher_pid: int, lightning: bool = True):
    """Join the world (through ``trainer.validate``, or a bare ``init_process_group``), then, while
    every rank and the launcher still hold their sockets, rank 0 lists the listening TCP sockets of the
    launcher and of every rank. Record keys: ``pids`` (every rank's pid), ``listening`` (rank 0 only)."""
    import torch.distributed as dist

    if lightning:
        validation.validate(info, n=4)
    else:
        dist.init_process_group(info.backend, rank=info.rank, world_size=info.world_size)
    pids = [None] * info.world_size
    dist.all_gather_object(pids, os.getpid())
    listening = listening_sockets([launcher_pid, *pids]) if info.rank == 0 else None
    dist.barrier()  # nobody leaves (closing its sockets) before rank 0 has looked
    return {"pids": pids, "listening": listening}


def folder_modes(info):
    """The permission bits of the world folder and of every entry this rank has in it (its folder
    ``rank<r>`` and its captured output ``rank<r>.stdout``, ``.stderr``, ``.stack``), as octal text."""
    mine = [name for name in os.listdir(info.world_dir) if name.split(".")[0] == f"rank{info.rank}"]
    return {
        name: oct(stat.S_IMODE(os.stat(os.path.join(info.world_dir, name)).st_mode)) for name in [".", *sorted(mine)]
    }


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------


#: (2, True) is the launcher's one isolation check in the default run; (3, False) runs in the integration run.
@pytest.mark.parametrize("world_size, lightning", [(2, True), pytest.param(3, False, marks=pytest.mark.integration)])
def test_no_process_of_a_running_world_listens_on_a_non_loopback_address(run_world, world_size, lightning):
    """The launcher (this process) and every rank: each listening TCP socket is on 127.0.0.0/8 or ::1.
    The rendezvous store is among them (the launcher listens on ``MASTER_PORT``), so the check is not
    vacuous."""
    world = run_world(sockets_while_running, world_size, launcher_pid=os.getpid(), lightning=lightning)

    listening = world.records[0]["listening"]
    launcher = [s for s in listening if s[0] == os.getpid()]
    assert launcher, f"the launcher hosts no listening socket? {listening}"
    exposed = [s for s in listening if not _is_loopback(s[2])]
    assert not exposed, "listening beyond loopback (pid, table, address, port):\n" + "\n".join(map(str, exposed))


@pytest.mark.integration
def test_the_world_folder_and_the_ranks_files_are_readable_by_this_user_only(run_world):
    """The world folder and each rank's folder are ``0o700``; its captured stdout, stderr and stack
    files ``0o600``: another user on a shared machine reads neither outputs nor records."""
    world = run_world(folder_modes, 2)

    expected = [
        {
            ".": "0o700",
            f"rank{r}": "0o700",
            f"rank{r}.stack": "0o600",
            f"rank{r}.stderr": "0o600",
            f"rank{r}.stdout": "0o600",
        }
        for r in range(2)
    ]
    assert world.records == expected, world.records

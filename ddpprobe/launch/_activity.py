"""Whether a rank process is still at work or asleep, read from Linux's ``/proc``.

After one rank of a world failed, the launcher must tell the ranks that are about to report (their
own error on its way, a record being sent, a death in progress) from the ranks blocked in a collective
whose partners will not come. A blocked rank sleeps: every thread of it waits for an event (state
``S``) and its CPU time stands still. A rank at work has a thread running or waiting for a core (state
``R``, however loaded the machine is) or for the disk (``D``), or its CPU time grows.
Source: proc(5), ``/proc/[pid]/task/[tid]/stat`` fields 3 (state), 14 (utime) and 15 (stime), in clock ticks.
"""

from __future__ import annotations

import os
import time
from typing import Optional

#: CPU clock ticks (``utime + stime``, all threads) a rank may spend in one observation window and still
#: count as asleep: a backend's own timers (NCCL's blocking wait polls every few milliseconds) cost a tick
#: now and then while the rank waits.
IDLE_TICKS = 2


#: Whether this system has ``/proc`` with per-thread states (Linux).
HAS_PROC = os.path.isdir("/proc/self/task")


def sample(pid: int) -> Optional[tuple]:
    """``(running, ticks)`` of process ``pid``: whether any thread is at work, and the CPU clock ticks
    its threads used so far. None when ``/proc`` cannot tell (not Linux, or the process is gone).

    A thread is at work in any state but ``S`` (sleeping until an event: a collective's socket, a
    condition variable, ``time.sleep``): running or runnable (``R``), waiting for the disk or a page it
    touched (``D``, frequent on a machine short of memory), or dying (``Z``, ``X``: its death is about to
    be reported)."""
    task_dir = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    if not tids:
        return None  # every thread has exited: the process is ending
    running, ticks = False, 0
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except OSError:
            continue  # the thread ended between the listing and the read
        running = running or fields[0] != "S"
        ticks += int(fields[11]) + int(fields[12])
    return running, ticks


class Watch:
    """Successive samples of some processes: :meth:`asleep` says whether each stayed asleep for the last
    ``idle_s`` seconds (seconds of wall time, however many samples fell in them)."""

    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self._since: dict = {}  # pid -> (monotonic time, ticks) when it was first seen asleep in a row

    def asleep(self, pids: list) -> bool:
        """True when every process in ``pids`` was asleep (every thread ``S``) at every sample of the last
        ``idle_s`` seconds and used at most ``IDLE_TICKS`` of CPU in them.

        A process ``/proc`` no longer shows is not asleep: it has ended (reaped by the forkserver it was
        forked from, which has yet to tell the launcher), and its death is about to be reported. Without
        ``/proc`` (not Linux) nothing can be read, and every process counts as asleep ``idle_s`` seconds
        after the first call."""
        now = time.monotonic()
        if not HAS_PROC:
            first = self._since.setdefault(-1, (now, 0))
            return now - first[0] >= self.idle_s
        settled = True
        for pid in pids:
            seen = sample(pid)
            if seen is None:
                self._since.pop(pid, None)
                settled = False
                continue
            running, ticks = seen
            since = self._since.get(pid)
            if running or (since is not None and ticks - since[1] > IDLE_TICKS):
                self._since.pop(pid, None)
                settled = False
            elif since is None:
                self._since[pid] = (now, ticks)
                settled = False
            elif now - since[0] < self.idle_s:
                settled = False
        return settled

"""How the launcher tells a rank at work from a rank asleep in a collective, after a peer failed
(ddpprobe/launch/_activity.py): on processes of known behaviour, in this process."""

import subprocess
import sys
import time

import pytest

from ddpprobe.launch import _activity

pytestmark = [
    pytest.mark.skipif(not _activity.HAS_PROC, reason="reads Linux's /proc"),
    pytest.mark.not_a_fact("tests the launcher's reading of /proc, not a fact about DDP"),
]

IDLE_S = 0.3


def _watch_for(pids: list, seconds: float) -> bool:
    """Sample ``pids`` every 50 ms for ``seconds``; whether the last sample said all were asleep."""
    watch, asleep = _activity.Watch(IDLE_S), False
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        asleep = watch.asleep(pids)
        time.sleep(0.05)
    return asleep


def test_a_process_blocked_in_a_read_counts_as_asleep_after_the_idle_window():
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        time.sleep(1.0)  # let the interpreter start and block
        watch = _activity.Watch(IDLE_S)
        assert not watch.asleep([sleeper.pid]), "asleep at the first look, before any idle window"
        assert _watch_for([sleeper.pid], 3 * IDLE_S)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_at_work_never_counts_as_asleep():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert not _watch_for([busy.pid], 4 * IDLE_S)
    finally:
        busy.kill()
        busy.wait()


def test_a_process_that_has_ended_is_not_asleep_its_death_is_still_to_be_reported():
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # reaped: /proc no longer shows it
    assert _activity.sample(ended.pid) is None
    assert not _watch_for([ended.pid], 3 * IDLE_S)

"""One clear message: a guard error reaches the user once, first, with the ranks that raised it.

A rank whose guard error nobody catches (under torchrun or SLURM the rank's process ends with it) prints
it through the guard's ``sys.excepthook`` (ddpprobe/guard/_errors.py ``excepthook``): the lowest rank
that raised it prints the message and the user's frame it was raised under, every other rank one line
pointing to it, instead of Lightning's full traceback on every rank. ``run_world`` (ddpprobe/launch/)
names the ranks that raised the same error on one line and quotes it once.
"""

import threading

import pytest
import torch.distributed as dist

from ddpprobe import RankFailed
from ddpprobe.guard import CollectiveMismatch, _entries
from ddpprobe.guard._errors import FULL_TRACEBACK_ENV, excepthook
from ddpprobe.guard._exchange import Exchange
from tests.support import guarded

pytestmark = pytest.mark.not_a_fact("tests how the guard's errors are printed, not a fact about DDP")

FIRST_LINE = "CollectiveMismatch: CollectiveGuard, check #0 of trainer.validate: the ranks are not making"


def _mismatch_on_both_ranks() -> dict:
    """``{rank: CollectiveMismatch}`` of two threads' exchanges syncing different keys at check 0."""
    store, errors = dist.HashStore(), {}

    def run(rank):
        ex = Exchange(store, 0, rank, 2, 60.0, 120.0, "validate")
        fields = {"op": "all_reduce", "dtype": "float32", "shape": [], "group_size": 2, "source": "self.log"}
        fields.update(key="ab"[rank], hook="validation_step", call_site="model.py:12 in validation_step")
        try:
            ex.check(_entries.collective(0, rank, fields))
        except CollectiveMismatch as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(errors) == [0, 1], errors
    return errors


def _printed(capsys, exc, previous=None) -> str:
    excepthook(type(exc), exc, exc.__traceback__, previous=previous)
    return capsys.readouterr().err


def test_an_uncaught_guard_error_is_printed_in_full_by_the_lowest_rank_and_in_one_line_by_the_others(
    capsys, monkeypatch
):
    """Rank 0 prints ``CollectiveMismatch: <the message>`` first, then the frame outside the libraries it
    was raised under (this file) and that rank 1 raised the same; rank 1 prints one line naming rank 0.
    No traceback: the message is what the user reads first."""
    monkeypatch.delenv(FULL_TRACEBACK_ENV, raising=False)
    errors = _mismatch_on_both_ranks()

    rank0 = _printed(capsys, errors[0])
    assert rank0.startswith(FIRST_LINE), rank0
    assert rank0.count(FIRST_LINE) == 1 and "Traceback" not in rank0, rank0
    assert "raised under " in rank0 and "test_guard_messages.py" in rank0, rank0
    assert "(the same on rank 1; full traceback: DDPPROBE_GUARD_TRACEBACK=1)" in rank0, rank0
    rank1 = _printed(capsys, errors[1])
    assert rank1 == "rank 1: CollectiveMismatch at check #0 (rank 0 prints the guard's message)\n", rank1


def test_an_error_raised_while_handling_a_guard_error_prints_the_guard_report_then_its_own_traceback(
    capsys, monkeypatch
):
    """Lightning's teardown may raise while a guard error propagates: the guard's report comes first, then
    the later exception goes to the previous hook as usual."""
    monkeypatch.delenv(FULL_TRACEBACK_ENV, raising=False)
    guard_error = _mismatch_on_both_ranks()[0]
    try:
        try:
            raise guard_error
        except CollectiveMismatch:
            raise RuntimeError("teardown failed")
    except RuntimeError as exc:
        later = exc
    passed_on = []
    printed = _printed(capsys, later, previous=lambda *args: passed_on.append(args[1]))
    assert printed.startswith(FIRST_LINE), printed
    assert passed_on == [later]


def test_the_full_traceback_is_printed_when_asked(capsys, monkeypatch):
    """``DDPPROBE_GUARD_TRACEBACK=1``: the guard error goes to the previous hook (Python's full traceback)."""
    monkeypatch.setenv(FULL_TRACEBACK_ENV, "1")
    error = _mismatch_on_both_ranks()[0]
    passed_on = []
    assert _printed(capsys, error, previous=lambda *args: passed_on.append(args[1])) == ""
    assert passed_on == [error]


def test_run_world_quotes_an_error_every_rank_raised_once_with_the_ranks_that_raised_it(run_world):
    """Keys named after the rank at W = 2 (tests/support/guarded.py ``rank_keys``): both ranks raise the
    same ``CollectiveMismatch``; the world's error names ``ranks 0, 1`` on one line and quotes the
    message's first line once (before: once per rank and once more at the end of each traceback)."""
    with pytest.raises(RankFailed) as info:
        run_world(guarded.rank_keys, 2, pg_timeout=10, timeout=60)

    text = str(info.value)
    first = info.value.rank_errors[0].splitlines()[0]
    assert first.startswith("CollectiveMismatch: CollectiveGuard, check #"), first
    assert info.value.rank_errors[0] == info.value.rank_errors[1]
    assert f"ranks 0, 1 raised {first}" in text, text
    assert text.count(first.split(": ", 1)[1]) == 1, text

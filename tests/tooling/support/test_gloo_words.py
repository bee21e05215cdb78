"""``tests/support/gloo.py`` ``error_kind``, which the failure-mode facts use to say which error a rank
got, on texts in the formats gloo and NCCL write (gloo/transport/tcp/pair.cc and unbound_buffer.cc;
torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp ``WorkNCCL::checkTimeout``), in this process."""

import pytest

from tests.support import gloo

#: gloo's and NCCL's messages as a rank reports them (``WorldError.rank_errors``), by the kind they are.
TEXTS = {
    gloo.PEER_GONE: [
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:28585",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:40217: "
        "Connection reset by peer",
    ],
    gloo.TIMED_OUT: [
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms "
        "for recv operation to complete",
        "RuntimeError: Application timeout caused pair closure",
        "DistBackendError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=10000) ran for 10004 milliseconds before timing out.",
        "ended with signal SIGABRT (exit code -6) without reporting a result; its stderr says:\n"
        "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with "
        "exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLGATHER, "
        "NumelIn=1, NumelOut=2, Timeout(ms)=10000) ran for 10087 milliseconds before timing out.",
    ],
    gloo.SIZE_MISMATCH: [
        "ended with signal SIGABRT (exit code -6) without reporting a result; its stderr says:\n"
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
        "op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected size",
    ],
    None: [
        "did not finish",
        "MisconfigurationException: `ModelCheckpoint(monitor='val_score')` could not find the monitored key "
        "in the returned metrics",
    ],
}


@pytest.mark.parametrize("kind, text", [(kind, text) for kind, texts in TEXTS.items() for text in texts])
def test_error_kind_names_the_failure_each_backend_message_reports(kind, text):
    assert gloo.error_kind(text) == kind, text


def test_a_text_with_timeout_words_is_a_timeout_whatever_else_it_holds():
    """A text that shows a timeout next to a lost partner or a size mismatch is a timeout: "peer gone"
    and "size mismatch" therefore also mean "did not wait for the process-group timeout"."""
    timeout = TEXTS[gloo.TIMED_OUT][0]
    for other in (*TEXTS[gloo.PEER_GONE], *TEXTS[gloo.SIZE_MISMATCH]):
        assert gloo.error_kind(f"{other}\n{timeout}") == gloo.TIMED_OUT
    assert gloo.error_kind(f"{TEXTS[gloo.PEER_GONE][0]}\n{TEXTS[gloo.SIZE_MISMATCH][0]}") == gloo.SIZE_MISMATCH


#: A stack the launcher captures from a rank it ends (faulthandler's format, most recent call first).
ENDED_STACK = """Thread 0x00007f3ddebff6c0 (most recent call first):
  File "/usr/lib/python3.11/multiprocessing/connection.py", line 250 in recv
  File "/work/ddpprobe/launch/_rank.py", line 118 in watch

Current thread 0x00007f3dfd43ab80 (most recent call first):
  File "/venv/torch/distributed/distributed_c10d.py", line 3890 in all_gather
  File "/venv/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/venv/torchmetrics/utilities/distributed.py", line 140 in gather_all_tensors
  File "/work/ddpprobe/launch/_rank.py", line 185 in rank_main
"""


def test_where_waiting_reads_a_raised_ranks_traceback_and_an_ended_ranks_main_thread_stack():
    from ddpprobe.launch import RankFailed, RankMessage, build_result

    traceback = 'Traceback:\n  File "/venv/torch/distributed/distributed_c10d.py", line 3252, in all_reduce\n'
    messages = [
        RankMessage(rank=0, status="error", pid=1, exc_type="RuntimeError", error="Timed out", traceback=traceback),
        RankMessage(rank=1, status="stuck", pid=2, stack=ENDED_STACK),
    ]
    with pytest.raises(RankFailed) as failure:
        build_result(messages, "world of 2")

    assert gloo.where_waiting(failure.value, 0) == traceback
    ended = gloo.where_waiting(failure.value, 1)
    assert gloo.collective_in(ended) == "all_gather" and "gather_all_tensors" in ended, ended
    assert "watch" not in ended and ended.splitlines()[0].endswith("in rank_main"), ended

"""The trace names the ``Callback`` whose hook made a collective, and the public call the hook made.

Lightning runs the callbacks' hooks before the module's (pytorch_lightning/loops/fit_loop.py
``_FitLoop.on_advance_end`` -> ``call._call_callback_hooks``), so a collective a callback makes lies under a
loop frame. The default progress bar reads ``trainer.progress_bar_metrics`` in its ``on_train_epoch_end`` on
global rank 0 only (pytorch_lightning/callbacks/progress/tqdm_progress.py, ``ProgressBar.setup`` disables it
elsewhere), which runs the epoch sync of a key logged with ``on_epoch=True, sync_dist=True`` there (the fact
in tests/facts/test_hidden_collectives_progress_bar.py); ``ModelCheckpoint.setup`` broadcasts its directory
from rank 0 (pytorch_lightning/callbacks/model_checkpoint.py ``__resolve_ckpt_dir``). The trace's
``callback`` field names that hook (``"TQDMProgressBar.on_train_epoch_end"``, the instance's class) and
``call`` the public call it made, not the loop step alone. A user's callback is the user's code: its line is
the call site and the callback names it. The names expected are written out from the libraries' sources,
not read from a run. Source: ddpprobe/trace/_classify.py ``CallClassifier._callback_call``,
ddpprobe/trace/_words.py ``describe_call``, ``describe_collective``.

The ranks' trace events are read from their recording (tests/tooling/trace/recorded_traces.py) and grouped
(``split_trace``) and worded here.
"""

import inspect

import torch

from ddpprobe._lightning import pl
from ddpprobe.probes.common import ddp_trainer, id_loader
from ddpprobe.trace import CollectiveTrace, describe_call, describe_collective, read_trace, split_trace

#: The line of ``ReadsMetrics.on_train_epoch_end`` that reads the metrics (found by ``_line``).
READ = "self.read = dict(trainer.callback_metrics)"


class LogsEpochValue(pl.LightningModule):
    """Logs ``train_v`` (the batch's ids summed) with ``on_epoch=True, sync_dist=True``; makes no collective
    of its own."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        self.log("train_v", batch["value"].sum(), on_step=False, on_epoch=True, sync_dist=True)
        return self.layer(batch["value"].float().view(-1, 1)).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class ReadsMetrics(pl.Callback):
    """A user's callback: reads ``trainer.callback_metrics`` on every rank at the training epoch's end."""

    def on_train_epoch_end(self, trainer, pl_module):
        self.read = dict(trainer.callback_metrics)


def _line(text: str) -> str:
    lines, start = inspect.getsourcelines(ReadsMetrics.on_train_epoch_end)
    offset = next(i for i, line in enumerate(lines) if line.strip() == text)
    return f"test_trace_callbacks.py:{start + offset} in on_train_epoch_end"


def _log_line() -> str:
    lines, start = inspect.getsourcelines(LogsEpochValue.training_step)
    offset = next(i for i, line in enumerate(lines) if line.strip().startswith('self.log("train_v"'))
    return f"test_trace_callbacks.py:{start + offset} in training_step"


def traced(info, progress_bar: bool, user_callback: bool, n: int = 8, batch_size: int = 2) -> dict:
    """Scenario: ``trainer.fit`` one epoch of ``LogsEpochValue`` under a ``CollectiveTrace``, with the progress
    bar and ``ModelCheckpoint`` (``progress_bar``) and/or ``ReadsMetrics`` (``user_callback``). Record:
    ``events`` (this rank's trace as it wrote it, ``read_trace``, but its ``file`` events: the checkpoint
    ``ModelCheckpoint`` writes differs byte for byte from run to run, so its ``sha1`` would make a recording of the
    scenario differ from every fresh one; the tests group the events with ``split_trace``)."""
    torch.manual_seed(0)  # the layer's gradients are in the trace: the same on every run of the scenario
    model = LogsEpochValue()
    path = f"{info.rank_dir}/trace.jsonl"
    with CollectiveTrace(path, model) as trace:
        callbacks = [trace.batch_recorder()] + ([ReadsMetrics()] if user_callback else [])
        trainer = ddp_trainer(
            info,
            max_epochs=1,
            callbacks=callbacks,
            enable_progress_bar=progress_bar,
            enable_checkpointing=progress_bar,
        )
        trainer.fit(model, train_dataloaders=id_loader(n, batch_size))
    return {"events": [event for event in read_trace(path) if event.get("event") != "file"]}


def test_the_progress_bars_sync_on_rank_zero_is_named_by_its_hook_and_the_property_it_reads(traced_world):
    """W=2, the default ``TQDMProgressBar`` and ``ModelCheckpoint``: on rank 0 the epoch sync of ``train_v``
    carries ``callback`` ``TQDMProgressBar.on_train_epoch_end`` and ``call`` ``Trainer.progress_bar_metrics``
    (a property), and is worded "`TQDMProgressBar.on_train_epoch_end` reads `Trainer.progress_bar_metrics`,
    which runs the epoch sync of 'train_v' (barrier), for the value logged at ..."; on rank 1 (bar disabled)
    the same sync is made by the next callback that reads the metrics, ``ModelCheckpoint.on_train_epoch_end``
    reading ``Trainer.callback_metrics`` (``_monitor_candidates``). On every rank the directory broadcast of
    ``ModelCheckpoint.setup`` names that hook and ``DDPStrategy.broadcast``."""
    records = [split_trace(rank["events"]) for rank in traced_world(traced, 2, progress_bar=True, user_callback=False)]
    logged_at = _log_line()
    syncs = [[c for c in r["collectives"] if c.get("key") == "train_v"] for r in records]
    assert syncs[0] and syncs[1], syncs
    bar = ("TQDMProgressBar.on_train_epoch_end", "Trainer.progress_bar_metrics", "property")
    assert all((c["callback"], c["call"], c["call_kind"]) == bar for c in syncs[0]), syncs[0]
    assert describe_call(syncs[0][0], "on rank 0 only") == (
        "`TQDMProgressBar.on_train_epoch_end` reads `Trainer.progress_bar_metrics`, which runs the epoch sync "
        f"of 'train_v' (barrier), for the value logged at {logged_at} on rank 0 only"
    ), describe_call(syncs[0][0])
    assert describe_collective(syncs[0][0], calls=True).endswith(
        "run by `TQDMProgressBar.on_train_epoch_end` reading `Trainer.progress_bar_metrics`"
    ), describe_collective(syncs[0][0], calls=True)
    checkpoint_read = ("ModelCheckpoint.on_train_epoch_end", "Trainer.callback_metrics", "property")
    assert all((c["callback"], c["call"], c["call_kind"]) == checkpoint_read for c in syncs[1]), syncs[1]
    for rank, record in enumerate(records):
        checkpoint = [c for c in record["collectives"] if (c.get("callback") or "").startswith("ModelCheckpoint.")]
        assert any(
            (c["callback"], c["call"], c["op"])
            == ("ModelCheckpoint.setup", "DDPStrategy.broadcast", "broadcast_object_list")
            for c in checkpoint
        ), f"rank {rank}: {checkpoint}"
        assert all(c["source"] != "user" for c in checkpoint), f"rank {rank}: {checkpoint}"


def test_a_users_callback_is_named_at_its_own_line_with_the_call_it_made(traced_world):
    """W=2, a user's ``ReadsMetrics`` reading ``trainer.callback_metrics`` in ``on_train_epoch_end``, no
    progress bar: on every rank the epoch sync of ``train_v`` has the callback's line as ``call_site``,
    ``callback`` ``ReadsMetrics.on_train_epoch_end``, ``call`` ``Trainer.callback_metrics``, no loop step,
    and reads "line N of test_trace_callbacks.py (`ReadsMetrics.on_train_epoch_end`) reads
    `Trainer.callback_metrics`, which runs the epoch sync of 'train_v' (barrier)"."""
    records = [split_trace(rank["events"]) for rank in traced_world(traced, 2, progress_bar=False, user_callback=True)]
    site = _line(READ)
    line = site.split(":")[1].split(" ")[0]
    for rank, record in enumerate(records):
        syncs = [c for c in record["collectives"] if c.get("key") == "train_v"]
        assert syncs, f"rank {rank}: no sync of train_v"
        got = [(c["call_site"], c["callback"], c["call"], c["loop_step"]) for c in syncs]
        assert set(got) == {(site, "ReadsMetrics.on_train_epoch_end", "Trainer.callback_metrics", None)}, got
        assert describe_call(syncs[0]) == (
            f"line {line} of test_trace_callbacks.py (`ReadsMetrics.on_train_epoch_end`) reads "
            "`Trainer.callback_metrics`, which runs the epoch sync of 'train_v' (barrier)"
        ), describe_call(syncs[0])

"""LightningModules and scenarios for DDP's gradient all-reduces under the trace and the guard
(tests/tooling/trace/test_trace_gradients.py, tests/tooling/guard/test_guard_gradients.py).

``TwoLayers`` has two ``Linear`` layers and runs with ``DDPStrategy(bucket_cap_mb=BUCKET_CAP_MB)``, so DDP
splits its gradients in more than one bucket. ``counting_hook`` is a user's own communication hook: torch's
default all-reduce (``default_hooks.allreduce_hook``) that also counts its calls per batch; ``summing_hook``
all-reduces the sum without dividing by the world size (weights then differ from the default's).
"""

import datetime
import time

import torch
import torch.distributed
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddpprobe._lightning import pl
from ddpprobe.probes.common import ddp_trainer, id_loader
from ddpprobe.trace import CollectiveTrace, read_trace, split_trace

#: DDP's bucket size cap (MiB): small enough that each layer's gradients get their own bucket.
BUCKET_CAP_MB = 1e-6


def counting_hook(state, bucket):
    """Torch's default hook, counting its calls in ``state["calls"]`` by the batch in ``state["batch"]``."""
    state["calls"].setdefault(state["batch"], []).append(bucket.index())
    return default_hooks.allreduce_hook(None, bucket)


def summing_hook(state, bucket):
    """All-reduce the bucket's sum, not its mean: each gradient is the world size times DDP's."""
    return torch.distributed.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


class TwoLayers(pl.LightningModule):
    """``Linear(2, 4)`` then ``Linear(4, 1)``, SGD; ``hook``: a user's comm hook (``"counting"`` /
    ``"summing"``) registered in ``on_fit_start``; ``skip`` = ``(rank, batch_idx)``: with manual
    optimization, that rank leaves out ``self.manual_backward(loss)`` at that batch (a ``training_step``
    returning None is refused by Lightning under DDP), so its peers enter the batch's gradient all-reduce
    alone."""

    def __init__(self, skip=None, hook=None):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Linear(2, 4), torch.nn.Linear(4, 1)
        self.skip, self.hook = tuple(skip) if skip else None, hook
        self.hook_state = {"calls": {}, "batch": None}
        self.automatic_optimization = skip is None

    def on_fit_start(self):
        if self.hook is not None:
            hook = {"counting": counting_hook, "summing": summing_hook}[self.hook]
            self.trainer.strategy.model.register_comm_hook(self.hook_state, hook)

    def training_step(self, batch, batch_idx):
        self.hook_state["batch"] = batch_idx
        loss = ((self.second(self.first(batch["x"])).squeeze(-1) - batch["value"]) ** 2).mean()
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        if self.skip != (self.global_rank, batch_idx):
            self.manual_backward(loss)
        optimizer.step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(
    info, under: str = "none", hook=None, skip=None, n: int = 12, batch_size: int = 2, events: bool = False
) -> dict:
    """Scenario: ``trainer.fit`` one epoch of ``TwoLayers(skip, hook)`` under nothing (``"none"``), a
    ``CollectiveTrace`` (``"trace"``) or a ``CollectiveGuard`` (``"guard"``). Record: ``weights`` (every
    parameter after the epoch, flattened), ``hook_calls`` (``{batch_idx: [bucket index, ...]}`` of the user's
    counting hook), ``gradients`` (the trace's ``gradient`` collectives: ``[batch_idx, bucket]`` each) and
    ``comm_hooks`` (the user's hooks they name); with ``events`` (under the trace) also ``events``: the trace as
    the rank wrote it (``read_trace``), for a test that groups it itself (tests/tooling/trace/recorded_traces.py)."""
    from ddpprobe.guard import CollectiveGuard

    model = TwoLayers(skip, hook)
    strategy = pl.strategies.DDPStrategy(
        process_group_backend=info.backend,
        timeout=datetime.timedelta(seconds=info.pg_timeout),
        bucket_cap_mb=BUCKET_CAP_MB,
    )
    callbacks = [CollectiveGuard(timeout=info.pg_timeout / 2)] if under == "guard" else []
    path = f"{info.rank_dir}/trace.jsonl"
    gradients = comm_hooks = None
    if under == "trace":
        with CollectiveTrace(path, model) as trace:
            trainer = ddp_trainer(info, strategy=strategy, max_epochs=1, callbacks=[trace.batch_recorder()])
            trainer.fit(model, train_dataloaders=id_loader(n, batch_size))
        split = split_trace(read_trace(path))
        grads = split["gradient_collectives"]
        assert not [c for c in split["collectives"] if c["source"] == "gradient"], "gradients among collectives"
        gradients = [[c["batch"][1], c["bucket"]] for c in grads]
        comm_hooks = sorted({c["comm_hook"] for c in grads if c.get("comm_hook")})
    else:
        trainer = ddp_trainer(info, strategy=strategy, max_epochs=1, callbacks=callbacks)
        trainer.fit(model, train_dataloaders=id_loader(n, batch_size))
    return {
        "weights": [float(v) for p in model.parameters() for v in p.detach().flatten()],
        "hook_calls": {str(k): v for k, v in model.hook_state["calls"].items()},
        "gradients": gradients,
        "comm_hooks": comm_hooks,
        **({"events": read_trace(path)} if events and under == "trace" else {}),
    }


#: The modes ``timed_fit`` times: no hook, the gradient hook with no listener, the guard's boundaries only
#: (``collectives=False``: no hook), the full guard (every bucket checked).
TIMED_MODES = ("off", "hook", "boundaries", "full")


class _HookOnly(pl.Callback):
    """Registers the trace's gradient hook (ddpprobe/trace/_gradients.py) with no listener attached."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        from ddpprobe.trace import _gradients

        _gradients.install(trainer.strategy.model)


class _Buckets(pl.Callback):
    """Reads how many gradient buckets the comm hook reduced, at the end of training (before Lightning's
    teardown unwraps the model from ``DistributedDataParallel``)."""

    def __init__(self):
        self.buckets = None

    def on_train_end(self, trainer, pl_module):
        from ddpprobe.trace import _gradients

        self.buckets = _gradients.buckets_reduced(trainer.strategy.model)


def timed_fit(info, batches: int, repeats: int) -> dict:
    """Scenario for benchmarks/bench_guard.py: ``trainer.fit`` of ``TwoLayers`` for ``batches`` optimizer
    steps in each of ``TIMED_MODES``, alternating, ``repeats`` rounds. Record: ``seconds`` (mode -> list of
    wall times of ``fit``), ``checks`` (mode -> the guard's checks in the last round; None unguarded),
    ``buckets`` (mode -> gradient buckets the comm hook reduced in the last round; None without it)."""
    from ddpprobe.guard import CollectiveGuard

    seconds = {mode: [] for mode in TIMED_MODES}
    checks: dict = {}
    buckets: dict = {}
    for _ in range(repeats):
        for mode in TIMED_MODES:
            strategy = pl.strategies.DDPStrategy(
                process_group_backend=info.backend,
                timeout=datetime.timedelta(seconds=info.pg_timeout),
                bucket_cap_mb=BUCKET_CAP_MB,
            )
            guard = CollectiveGuard(collectives=mode == "full") if mode in ("boundaries", "full") else None
            counter = _Buckets()
            callbacks = ([guard] if guard else [_HookOnly()] if mode == "hook" else []) + [counter]
            trainer = ddp_trainer(info, strategy=strategy, max_steps=batches, callbacks=callbacks)
            loader = id_loader(2 * batches * info.world_size, 2)
            if torch.distributed.is_initialized():  # line the ranks up before timing (none before the first fit)
                torch.distributed.barrier()
            started = time.perf_counter()
            trainer.fit(TwoLayers(), train_dataloaders=loader)
            seconds[mode].append(time.perf_counter() - started)
            checks[mode] = guard.checks if guard else None
            buckets[mode] = counter.buckets
    return {"seconds": seconds, "checks": checks, "buckets": buckets}

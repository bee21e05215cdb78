"""DDP's gradient all-reduces, seen from Python: a communication hook that reports each bucket.

``DistributedDataParallel`` all-reduces the gradients in buckets from C++ (its reducer, during
``backward``), so no wrapper of ``torch.distributed`` sees them. A communication hook
(``DistributedDataParallel.register_comm_hook``, torch/nn/parallel/distributed.py) is called from the reducer
once per bucket, with a ``GradBucket`` (``index()``, ``buffer()``), and returns a future of the reduced
bucket. While the trace or the guard is active:

- ``DistributedDataParallel.register_comm_hook`` is patched (:func:`watch`), so a hook registered during the
  run (the user's own, or Lightning's ``DDPStrategy(ddp_comm_hook=...)``, which it registers on CUDA only:
  pytorch_lightning/strategies/ddp.py ``_register_ddp_hooks``) is registered wrapped;
- :func:`install` (from the trace's and the guard's ``on_train_batch_start``) registers the wrapper around
  :func:`default_allreduce` where no hook was registered: the reducer's own arithmetic without a hook
  (torch/csrc/distributed/c10d/reducer.cpp ``mark_variable_ready_dense``: each gradient times ``1 / world
  size``, then an all-reduce of the sum), so the gradients are bit for bit those DDP computes without a hook
  (torch's Python ``default_hooks.allreduce_hook`` divides instead, which differs in the last bit at a world
  size that is not a power of two).

The wrapper (:func:`gradient_hook`) makes each bucket one call of the shared patch (ddpprobe/trace/_patch.py
``run``): every listener hears ``all_reduce`` with ``source`` ``"gradient"``, ``bucket`` (the index) and
``comm_hook`` (the user's hook's name; None for the default), before the wrapped hook runs; the wrapped
hook's own ``torch.distributed`` calls are not reported again. DDP registers one hook per model, once
(torch raises on a second ``register_comm_hook``): a hook the user registers after :func:`install` replaces
the one the wrapper runs instead.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed
from torch.nn.parallel import DistributedDataParallel

from ddpprobe.trace import _patch

#: ``DistributedDataParallel.register_comm_hook`` as torch defines it (restored by :func:`unwatch`).
_REGISTER = DistributedDataParallel.register_comm_hook
_watchers: list = []


def default_allreduce(process_group, bucket):
    """DDP's reduction without a hook, as a hook: the bucket times ``1 / group size``, then the sum's
    all-reduce (torch/csrc/distributed/c10d/reducer.cpp: ``at::mul_out(bucket_view, grad, 1. / div_factor_)``,
    then ``_AllReduceBySumCommHook``). Returns the future of the reduced bucket."""
    group = process_group if process_group is not None else torch.distributed.group.WORLD
    buffer = bucket.buffer()
    buffer.mul_(1.0 / torch.distributed.get_world_size(group))
    return torch.distributed.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda f: f.value()[0])


class HookState:
    """The state DDP passes to :func:`gradient_hook`: the hook it runs and that hook's own state.

    Attributes:
        hook: the wrapped hook, ``hook(state, bucket) -> Future[Tensor]``.
        state: the wrapped hook's state (None for :func:`default_allreduce`: the default process group).
        name: the wrapped hook's name (None for :func:`default_allreduce`).
        buckets: how many buckets the hook reduced on this rank.
    """

    def __init__(self, hook=None, state=None):
        self.hook = hook or default_allreduce
        self.state = state
        self.buckets = 0
        self.name = None if hook is None else getattr(hook, "__qualname__", getattr(hook, "__name__", repr(hook)))


def gradient_hook(state, bucket):
    """DDP communication hook: one bucket of gradients, reported to the patch's listeners, then reduced by
    ``state.hook`` (a ``HookState``). Returns the wrapped hook's future."""
    state.buckets += 1
    try:
        buffer = bucket.buffer()
        dtype, shape = str(buffer.dtype).replace("torch.", ""), [int(buffer.numel())]
    except Exception:  # noqa: BLE001 - a GradBucket without a readable buffer
        buffer, dtype, shape = None, None, None
    call = _patch.Call(
        "all_reduce",
        state.hook,
        (buffer,) if buffer is not None else (),
        {},
        _patch.caller_frame(),
        extra={"source": "gradient", "bucket": int(bucket.index()), "comm_hook": state.name},
    )
    call._fields = {"op": "all_reduce", "reduce_op": None, "dtype": dtype, "shape": shape}
    return _patch.run(call, state.state, bucket)


def _register(self, state, hook):
    """``DistributedDataParallel.register_comm_hook`` while watched: register ``hook`` wrapped, or, where the
    wrapper is registered already (:func:`install`), make it run ``hook``."""
    mine = _state_of(self)
    if hook is gradient_hook:
        return _REGISTER(self, state, hook)
    if mine is not None:
        mine.hook, mine.state = hook, state
        mine.name = getattr(hook, "__qualname__", getattr(hook, "__name__", repr(hook)))
        return None
    return _REGISTER(self, HookState(hook, state), gradient_hook)


def _state_of(model) -> Optional[HookState]:
    for hook, state in getattr(model, "_comm_hooks", []):
        if hook is gradient_hook and isinstance(state, HookState):
            return state
    return None


def watch(owner) -> None:
    """Patch ``DistributedDataParallel.register_comm_hook`` while ``owner`` (the trace, the guard) is active."""
    if owner not in _watchers:
        _watchers.append(owner)
    DistributedDataParallel.register_comm_hook = _register


def unwatch(owner) -> None:
    """Stop watching for ``owner``; the last one puts torch's ``register_comm_hook`` back (where it is still
    this module's)."""
    if owner in _watchers:
        _watchers.remove(owner)
    if not _watchers and DistributedDataParallel.register_comm_hook is _register:
        DistributedDataParallel.register_comm_hook = _REGISTER


def install(model) -> bool:
    """Make ``model`` (the strategy's ``DistributedDataParallel``) report its gradient buckets: register the
    wrapper around torch's default hook where no hook is registered. Returns whether the buckets are
    reported (False: not DDP, or a hook registered before the trace or the guard was active)."""
    if not isinstance(model, DistributedDataParallel):
        return False
    if _state_of(model) is not None:
        return True
    if getattr(model, "_comm_hooks", None):
        return False
    _REGISTER(model, HookState(), gradient_hook)
    return True


def buckets_reduced(model) -> Optional[int]:
    """How many gradient buckets the wrapper reduced on ``model`` so far (None where it is not registered)."""
    state = _state_of(model)
    return None if state is None else state.buckets


def is_gradient(call: _patch.Call) -> bool:
    """Whether ``call`` is a gradient bucket reported by :func:`gradient_hook`."""
    return call.extra.get("source") == "gradient"

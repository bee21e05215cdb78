"""``CollectiveGuard``: the Lightning callback that checks, through the world's store, that every rank is
about to make the same collective call (ddpprobe/guard/_exchange.py, ddpprobe/guard/_entries.py)."""

from __future__ import annotations

import datetime
import functools
import inspect
import itertools
import numbers
import sys
import threading
import weakref
from typing import Optional

import torch
import torch.distributed

from ddpprobe import trace
from ddpprobe._lightning import pl
from ddpprobe._support import require
from ddpprobe.guard import _entries, _state, _writers
from ddpprobe.guard._errors import CollectiveMismatch, install_excepthook
from ddpprobe.guard._exchange import Exchange
from ddpprobe.trace import CallClassifier, _gradients

#: The guard's timeout when none is given: half the process-group timeout, at most this many seconds.
DEFAULT_TIMEOUT_CAP_S = 300.0
#: The process-group timeout assumed when the strategy does not say (torch's and Lightning's default).
DEFAULT_PG_TIMEOUT_S = 1800.0

#: One number per guarded ``Trainer`` stage in this process, equal on every rank that runs the same stages.
_SESSIONS = itertools.count()
#: Marks "the module had no ``log`` of its own" (``CollectiveGuard._log_before``).
_NONE = object()


def _seconds(value) -> Optional[float]:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None


#: The argument naming a rooted collective's source or destination rank, by its global and group name.
_ROOTS = (("src", "group_src"), ("dst", "group_dst"))


def _root(original, args, kwargs) -> Optional[str]:
    """``"src=1"`` / ``"dst=0"``: the source or destination rank a rooted collective (``broadcast``,
    ``reduce``, ``gather``, ``scatter`` and their ``_object`` forms) names on this rank, from its arguments
    (torch/distributed/distributed_c10d.py signatures); None for an unrooted one or where unreadable. On
    the whole world a group rank is the global rank."""
    try:
        bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return None
    for names in _ROOTS:
        for name in names:
            if isinstance(bound.get(name), int):
                return f"{names[0]}={bound[name]}"
    return None


#: Collectives whose tensor lists must match on every rank (the lists of a rooted ``gather``/``scatter`` are
#: given on their root only), and those whose object list length must (``broadcast_object_list``).
_LISTS = ("all_gather", "all_to_all", "reduce_scatter", "all_gather_object", "broadcast_object_list")


def _lists(op: str, args, kwargs) -> Optional[list]:
    """Every list argument of a call of ``op`` (``_LISTS``) as the ranks must agree on it: its length and each
    tensor's dtype and shape (``all_to_all``'s without the first dimension, its split size, which may differ
    between ranks: uneven splits); for an object list its length. None for other collectives or no list."""
    if op not in _LISTS:
        return None
    out = []
    for value in list(args) + list(kwargs.values()):
        if not isinstance(value, (list, tuple)):
            continue
        if op.endswith("_object") or op.endswith("_object_list"):
            out.append(len(value))
            continue
        tensors = [t for t in value if isinstance(t, torch.Tensor)]
        shapes = [list(t.shape)[1:] if op == "all_to_all" else list(t.shape) for t in tensors]
        out.append([len(value), *(f"{str(t.dtype).replace('torch.', '')}{s}" for t, s in zip(tensors, shapes))])
    return out or None


def _last_batch(trainer, hook: str) -> Optional[bool]:
    """Whether the running loop runs no batch after the current one: its data fetcher has none (it fetches
    one batch ahead: pytorch_lightning/loops/fetchers.py ``_PrefetchDataFetcher``), or, in fit, the
    optimizer step of this batch reaches ``max_steps`` (``_stops_at_max_steps``); None where it cannot say:
    at ``on_train_batch_start`` under manual optimization with ``max_steps`` (whether ``training_step``
    steps an optimizer, and so reaches ``max_steps``, shows only at the batch's end), on every rank alike,
    so shards of different lengths are compared at ``on_train_batch_end``, before the next batch's
    gradient all_reduce."""
    if hook == "on_train_batch_start" and _steps_known_at_end_only(trainer):
        return None
    try:
        fetcher = trainer._active_loop._data_fetcher
        if fetcher is None or type(fetcher).__name__ == "_DataLoaderIterDataFetcher":
            return None
        done = bool(fetcher.done)
    except Exception:  # noqa: BLE001 - another release's loop layout
        return None
    return done or (hook in ("on_train_batch_start", "on_train_batch_end") and _stops_at_max_steps(trainer, hook))


def _steps_known_at_end_only(trainer) -> bool:
    """Manual optimization with ``max_steps`` set: ``global_step`` counts the optimizer steps the user's
    ``training_step`` makes (pytorch_lightning/loops/optimization/manual.py), known after the batch only."""
    try:
        max_steps = trainer.fit_loop.epoch_loop.max_steps
        return not trainer.lightning_module.automatic_optimization and max_steps is not None and max_steps >= 0
    except Exception:  # noqa: BLE001 - another release's loop layout
        return False


def _stops_at_max_steps(trainer, hook: str) -> bool:
    """Whether fit's epoch loop stops after this batch because ``global_step`` reaches ``max_steps``
    (pytorch_lightning/loops/training_epoch_loop.py ``_is_training_done``): at ``on_train_batch_end``,
    reached; at ``on_train_batch_start``, this batch steps the optimizer (``_should_accumulate`` is False;
    automatic optimization only, where Lightning makes the step) and the step reaches it. So ranks whose
    loaders have different lengths but that all stop at ``max_steps`` agree on the last batch."""
    try:
        loop = trainer.fit_loop.epoch_loop
        if loop.max_steps is None or loop.max_steps < 0:
            return False
        if hook == "on_train_batch_end":
            return loop.global_step >= loop.max_steps
        if not trainer.lightning_module.automatic_optimization:
            return False
        return not loop._should_accumulate() and loop.global_step + 1 >= loop.max_steps
    except Exception:  # noqa: BLE001 - another release's loop layout
        return False


class CollectiveGuard(_state.StateHooks, pl.Callback):
    """Check, before each collective a rank makes from Python and at each hook boundary, that every rank
    is about to do the same thing; raise one clear error on every rank at the first difference.

    ``Trainer(strategy="ddp", callbacks=[CollectiveGuard()])``, in any world Lightning runs in (ddpprobe's
    ``run_world``, torchrun, SLURM) and with any backend (gloo, NCCL): the ranks compare through the world's
    c10d store (``torch.distributed.distributed_c10d._get_default_store()``), never through a collective,
    so a rank that never arrives cannot hang the check, and the process group sees exactly the
    collectives it sees without the guard.

    Checked: the ``torch.distributed`` functions the trace wraps (``ddpprobe.trace.COLLECTIVES``),
    called on the main thread on the whole world: ``self.log(..., sync_dist=True)`` syncs, torchmetrics
    state syncs at ``compute()``, ``self.all_gather``, ``strategy.reduce`` / ``barrier`` / ``broadcast``,
    ``reduce_boolean_decision``; compared by op, reduce op, dtype, shape, src/dst rank, source, Lightning
    key (and the hook it was logged in) and torchmetrics class (ddpprobe/guard/_entries.py). And the hook
    boundaries ``setup``, ``on_*_batch_start``, ``on_*_batch_end``, ``on_*_epoch_end`` and ``teardown``,
    compared by hook, epoch, batch and dataloader index, so ranks with uneven numbers of batches are
    stopped before DistributedDataParallel's gradient all_reduce pairs different steps. That all_reduce
    is made from C++; the guard's DDP comm hook checks it bucket by bucket (op, dtype, shape, bucket index)
    like any other collective (``collectives=True`` only). Predict's batch boundaries are not compared:
    Lightning gives ranks unequal predict shards by design (``UnrepeatedDistributedSamplerWrapper``) and
    the predict loop makes no collective per batch.

    Args:
        timeout: seconds a rank waits for its peers at a check before raising ``GuardTimeout``; must be
            below the process-group timeout. Default: half the process-group timeout
            (``DDPStrategy(timeout=...)``, 30 min when unset), at most ``DEFAULT_TIMEOUT_CAP_S`` (300 s).
            A peer writing a checkpoint (``Trainer.save_checkpoint``) is waited for beyond it, up to the
            process-group timeout (docs/guard.md, "Lightning's slow steps").
        collectives: check every Python-level collective (default); ``False`` checks the hook boundaries
            only (cheaper; catches uneven batches and a peer that raised, not keys or metrics).
        state: compare the DDP contract's must-be-equal fields (ddpprobe/contract/) at the start, after the
            first optimizer step, at each epoch's end and at the end (ddpprobe/guard/_state.py): ``True``
            (default) the fields of ``_state.DEFAULT_FIELDS``, ``False`` none, a tuple of path prefixes
            (``("optimizer", "param.")``) those only. A digest crosses the store, no collective.

    Raises (on the ranks, from the hook or the collective where the difference shows):
        CollectiveMismatch: different collectives or boundaries at the same check, on every rank.
        StateDiverged: a must-be-equal field differs between the ranks at a state check, on every rank.
        PeerFailed: a peer raised before the check (its error is named), on the ranks that wait for it.
        GuardTimeout: a peer did not arrive within ``timeout`` (named with its last check).
        ValueError: ``timeout`` not a positive number below the process-group timeout (at ``setup``), or
            ``state`` not True, False or a tuple of prefixes.

    Attributes:
        checks: number of checks this rank passed in the current or last stage.

    A world of one rank, or a run without an initialised process group, is not checked. Collectives on a
    sub-group smaller than the world, and those of other threads, pass unchecked.
    """

    def __init__(self, timeout: Optional[float] = None, collectives: bool = True, state=True):
        require("CollectiveGuard", pl.__name__)  # a release below the support range: refused (ddpprobe/_support.py)
        if timeout is not None and not (_seconds(timeout) is not None and _seconds(timeout) > 0):
            raise ValueError(f"CollectiveGuard(timeout={timeout!r}): use a positive number of seconds")
        if not isinstance(collectives, bool):
            raise ValueError(f"CollectiveGuard(collectives={collectives!r}): use True or False")
        self.timeout = None if timeout is None else _seconds(timeout)
        self.collectives = collectives
        self.state = state
        self._state_fields = _state.fields_option(state)
        self._step_fields = _state.step_fields(self._state_fields)
        self.checks = 0
        self._exchange: Optional[Exchange] = None
        self._listener = _GuardListener(self)
        self._model = None
        self._log_before = _NONE
        self._classifier: Optional[CallClassifier] = None
        self._thread = threading.get_ident()
        self._trainer = None
        self._eval = _EvalBatches()
        self._writers: Optional[_writers.Writers] = None
        _patch_prepare_data_barrier()
        _writers.patch_hook_runners()
        if collectives:
            # Armed from here on: the first collective of a Trainer holding this guard, once its strategy made the
            # process group (the log-dir broadcast of the Trainer's setup, or a collective in prepare_data), starts
            # the stage's session before any hook (``_start``); detached when the guard is collected.
            trace.attach(self._listener)
            weakref.finalize(self, trace.detach, self._listener)

    def __getstate__(self) -> dict:
        # Only the settings cross a pickle (``strategy="ddp_spawn"`` sends the callbacks to new processes).
        return {"timeout": self.timeout, "collectives": self.collectives, "state": self.state}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    # -- session ---------------------------------------------------------------------------------

    def _timeouts(self, trainer) -> tuple:
        pg = _seconds(getattr(trainer.strategy, "_timeout", None)) or DEFAULT_PG_TIMEOUT_S
        timeout = self.timeout if self.timeout is not None else min(DEFAULT_TIMEOUT_CAP_S, pg / 2)
        if timeout >= pg:
            raise ValueError(
                f"CollectiveGuard(timeout={self.timeout:g}) is not below the process-group timeout ({pg:g} s): "
                "a rank left alone in a collective would raise the backend's timeout first. Use a smaller "
                "timeout, or a larger DDPStrategy(timeout=...)"
            )
        return timeout, pg

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self._exchange is not None and self._trainer is trainer:  # started before the first hook (``_start``)
            self._boundary("setup", trainer)
            return
        self._start(trainer, pl_module, stage)
        self._boundary("setup", trainer)

    def _start(self, trainer, pl_module, stage: Optional[str] = None) -> None:
        """Start the stage's session: at ``setup``, or earlier, at the first collective of a Trainer holding this
        guard once its process group exists (:class:`_GuardListener`), so the hooks Lightning runs before a
        callback's ``setup`` (``prepare_data``, the datamodule's ``setup``) are checked too."""
        self._uninstall()
        self.checks = 0
        self._eval = _EvalBatches()
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        timeout, pg = self._timeouts(trainer)
        store = dist.distributed_c10d._get_default_store()
        fn = getattr(getattr(trainer.state, "fn", None), "value", stage)
        self._exchange = Exchange(
            store, next(_SESSIONS), dist.get_rank(), dist.get_world_size(), timeout, pg, fn, dist.get_backend()
        )
        install_excepthook()  # a guard error nobody catches prints as one short report (ddpprobe/guard/_errors.py)
        self._model = pl_module
        self._classifier = CallClassifier(pl_module)
        self._thread = threading.get_ident()
        self._trainer = trainer
        if self._state_fields:  # where a field that breaks was last written (ddpprobe/guard/_writers.py)
            self._writers = _writers.Writers(self._classifier, pl_module)
            self._writers.watch(trainer)
            self._exchange.annotate = self._writers.annotate
        self._install_log(pl_module)
        if self.collectives:
            self._install_collectives()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        try:
            if self._exchange is not None:
                self._boundary("teardown", trainer)
        finally:
            self._uninstall()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self._exchange is not None:
            hook = getattr(pl_module, "_current_fx_name", None)
            self._exchange.post_raised(f"{type(exception).__name__}: {exception}", hook)
        self._uninstall()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        # Trainer.save_checkpoint: every rank builds the checkpoint, the global-zero rank alone writes it
        # (Strategy.save_checkpoint), then all meet in a barrier (pytorch_lightning/trainer/trainer.py): the
        # peers wait for the writer at the barrier's check as long as the write takes, within the
        # process-group timeout (docs/guard.md, "Lightning's slow steps").
        if self._exchange is not None and trainer.strategy.is_global_zero:
            self._exchange.busy("writing a checkpoint (Trainer.save_checkpoint)")

    def _uninstall(self) -> None:
        _gradients.unwatch(self)
        if self._writers is not None:
            self._writers.unwatch()
            self._writers = None
        self._trainer = None
        if self._model is not None:  # put back the instance's own log (another wrapper's), or none
            if self._log_before is _NONE:
                vars(self._model).pop("log", None)
            else:
                self._model.log = self._log_before
        self._model = None
        self._exchange = None

    # -- checks ----------------------------------------------------------------------------------

    def _check(self, entry: dict) -> None:
        self._exchange.check(entry)
        self.checks += 1
        if entry.get("record") and self._writers is not None:  # its fields are equal on every rank here
            self._writers.passed(entry["n"], entry["record"])
        if entry["kind"] == "collective" and self._eval.in_batch:
            self._eval.collectives += 1

    def _boundary(
        self, hook: str, trainer, batch_idx: Optional[int] = None, dataloader_idx: int = 0, state=None
    ) -> None:
        if self._exchange is None:
            return
        ex = self._exchange
        if hook in _EVAL_BATCH_HOOKS:
            self._eval.in_batch = hook.endswith("_batch_start")
            if self._eval.skip(hook, ex):
                return
        last = _last_batch(trainer, hook) if batch_idx is not None else None
        entry = _entries.boundary(ex.n, ex.rank, hook, trainer.current_epoch, batch_idx, dataloader_idx, last, state)
        try:
            self._check(entry)
        except CollectiveMismatch as exc:
            if not (hook in _EVAL_BATCH_HOOKS and self._eval.defer(exc, ex)):
                raise
        if hook in ("on_validation_epoch_end", "on_test_epoch_end"):
            self._eval = _EvalBatches()

    def _install_log(self, model) -> None:
        original, classifier = model.log, self._classifier

        @functools.wraps(original)
        def log(name, value, *args, **kwargs):
            classifier.note_log(name, model._current_fx_name, classifier.user_frame(sys._getframe(1)))
            return original(name, value, *args, **kwargs)

        self._log_before = vars(model).get("log", _NONE)
        model.log = log

    def _install_collectives(self) -> None:
        trace.attach(self._listener)
        _gradients.watch(self)  # a comm hook registered from here on is registered wrapped

    def _whole_world(self, args, kwargs) -> bool:
        groups = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.distributed.ProcessGroup)]
        return not groups or torch.distributed.get_world_size(groups[0]) == self._exchange.world_size

    # -- hook boundaries -------------------------------------------------------------------------

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.collectives and self._exchange is not None:  # before the batch's backward: check each bucket
            _gradients.install(trainer.strategy.model)
        self._state_before_batch(trainer, pl_module)
        self._boundary("on_train_batch_start", trainer, batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # The small must-be-equal fields (optimizer settings, loop state, schedulers) ride on this boundary's check
        # after every batch: a rate changed on one rank is named at the next step, at no store request of its own.
        state = None if self._exchange is None else _state.step_record(trainer, pl_module, self._step_fields)
        self._boundary("on_train_batch_end", trainer, batch_idx, state=state)
        self._state_after_batch(trainer, pl_module)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._boundary("on_validation_batch_start", trainer, batch_idx, dataloader_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._ran("val")
        self._boundary("on_validation_batch_end", trainer, batch_idx, dataloader_idx)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._boundary("on_test_batch_start", trainer, batch_idx, dataloader_idx)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._ran("test")
        self._boundary("on_test_batch_end", trainer, batch_idx, dataloader_idx)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._ran("predict")  # no boundary (below); its dataset may have changed its own state

    # No predict batch boundaries: ``trainer.predict`` shards with ``UnrepeatedDistributedSamplerWrapper``
    # (pytorch_lightning/trainer/connectors/data_connector.py ``_get_distributed_sampler``), so ranks may
    # run different numbers of batches by design; the model is not wrapped in DistributedDataParallel
    # outside fit (pytorch_lightning/strategies/ddp.py ``DDPStrategy.setup``), so no C++ collective pairs
    # batches. A collective in ``predict_step`` is still checked (against a peer at on_predict_epoch_end).

    def on_train_epoch_end(self, trainer, pl_module):
        self._boundary("on_train_epoch_end", trainer)
        self._state_check(trainer, pl_module, "train_epoch_end", "on_train_epoch_end")

    def on_validation_epoch_end(self, trainer, pl_module):
        self._boundary("on_validation_epoch_end", trainer)
        if not trainer.sanity_checking:
            self._state_check(trainer, pl_module, "val_epoch_end", "on_validation_epoch_end")

    def on_test_epoch_end(self, trainer, pl_module):
        self._boundary("on_test_epoch_end", trainer)
        self._state_check(trainer, pl_module, "test_epoch_end", "on_test_epoch_end")

    def on_predict_epoch_end(self, trainer, pl_module, *args):
        self._boundary("on_predict_epoch_end", trainer)


#: The evaluation loops' batch hooks: their boundaries are compared only while they pair a collective (below).
_EVAL_BATCH_HOOKS = ("on_validation_batch_start", "on_validation_batch_end", "on_test_batch_start", "on_test_batch_end")


class _EvalBatches:
    """Uneven batches in an evaluation loop are a hazard only where a collective is made per batch: shards of 5
    and 3 batches (``use_distributed_sampler=False``) synced at the epoch's end only are exact evaluation, and
    pass (tests/tooling/guard/test_guard_forms_let_through.py). So where the ranks differ only in which has its
    last batch at a batch's start (``defer``), the mismatch is raised at once if the loop already made a
    collective in a batch, at that batch's end if the batch makes one (the message is the start's), and
    otherwise the loop's remaining batch boundaries are not compared (``skip``), on every rank alike: every rank
    saw the same entries, and a collective check passes only where every rank made it. Reset at the loop's
    epoch end."""

    def __init__(self):
        self.collectives = 0  # collectives checked inside the loop's batches since its epoch began
        self.in_batch = False  # between a batch's start and end boundaries
        self.at_start = 0  # ... at the start of the batch of a deferred mismatch
        self.pending = None  # the deferred CollectiveMismatch
        self.off = False  # the loop's batch boundaries are no longer compared

    def defer(self, exc: CollectiveMismatch, exchange) -> bool:
        entries = getattr(exc, "entries", [])
        ids = {repr(e["id"][:-1]) for e in entries}
        starts = all(e["kind"] == "boundary" and e["id"][1].endswith("_batch_start") for e in entries)
        if not (entries and starts and len(ids) == 1):
            return False
        if self.collectives:  # the loop makes a collective per batch: the ranks with more batches would be alone
            return False
        self.pending, self.at_start, exchange.error = exc, self.collectives, None
        return True

    def skip(self, hook: str, exchange) -> bool:
        if self.pending is not None and hook.endswith("_batch_end"):
            if self.collectives > self.at_start:  # this batch made a collective: the next one has no partner
                exchange.error = self.pending
                raise self.pending
            self.pending, self.off = None, True
        return self.off


#: Where Lightning's barrier around ``prepare_data`` is, in the words of a side: every rank but those running
#: ``prepare_data`` waits there (pytorch_lightning/trainer/connectors/data_connector.py ``prepare_data``).
PREPARE_DATA_BARRIER = "Lightning's barrier after prepare_data"
_PREPARE_DATA_TEXT = (
    f"is at {PREPARE_DATA_BARRIER} (`_InfiniteBarrier`, pytorch_lightning/trainer/connectors/data_connector.py), "
    "which waits for prepare_data: Lightning runs that hook on local rank 0 only (prepare_data_per_node) or global "
    "rank 0 only"
)


def _guard_of(frame) -> tuple:
    """``(guard, trainer)``: the ``CollectiveGuard`` of the Trainer whose method is on the stack from ``frame``, or
    ``(None, None)``."""
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, pl.Trainer):
            guard = next((c for c in owner.callbacks if isinstance(c, CollectiveGuard)), None)
            return guard, owner
        frame = frame.f_back
    return None, None


def _session(guard: CollectiveGuard, trainer) -> Optional[Exchange]:
    """The guard's session for ``trainer``, started here if its process group exists and none is (the hooks before
    a callback's ``setup``)."""
    if guard._exchange is None or guard._trainer is not trainer:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        guard._start(trainer, trainer.lightning_module)
    return guard._exchange


def _barrier_enter(original):
    @functools.wraps(original)
    def __enter__(self):
        entered = original(self)
        guard, trainer = _guard_of(sys._getframe(1))
        ex = None if guard is None else _session(guard, trainer)
        if ex is not None:  # the ranks that run prepare_data may take long: the others wait for them, as Lightning
            ex.busy("in prepare_data's step (Lightning's barrier after it has no timeout)", unbounded=True)
        return entered

    return __enter__


def _barrier_exit(original):
    @functools.wraps(original)
    def __exit__(self, exc_type, exc, tb):
        guard, trainer = _guard_of(sys._getframe(1))
        ex = None if guard is None or guard._trainer is not trainer else guard._exchange
        if ex is not None:
            try:
                if exc is None:  # a collective prepare_data made on its ranks alone meets this check on the others
                    epoch = trainer.current_epoch
                    guard._check(
                        dict(_entries.boundary(ex.n, ex.rank, PREPARE_DATA_BARRIER, epoch), text=_PREPARE_DATA_TEXT)
                    )
                elif ex.error is None:
                    return original(self, exc_type, exc, tb)
            except BaseException:
                _drop_group(self)
                raise
            if ex.error is not None:  # the guard stopped the ranks: none waits in the barrier for the others
                _drop_group(self)
                return None
        return original(self, exc_type, exc, tb)

    return __exit__


def _drop_group(barrier) -> None:
    group = getattr(barrier, "group", None)
    if group is not None:
        try:
            torch.distributed.destroy_process_group(group)
        except Exception:  # noqa: BLE001 - the group of a world that is ending
            pass


_BARRIER_PATCHED = []


def _patch_prepare_data_barrier() -> None:
    """Wrap ``__enter__`` and ``__exit__`` of Lightning's ``_InfiniteBarrier`` (lightning_fabric/utilities/
    distributed.py), the barrier without a timeout every rank passes around ``prepare_data``, once per process: for
    a Trainer holding a ``CollectiveGuard`` the ranks note at its start that they may wait for ``prepare_data``
    as long as Lightning does, and at its end meet at a check (:data:`PREPARE_DATA_BARRIER`), so a collective made
    in ``prepare_data`` on its ranks alone is a ``CollectiveMismatch`` at once instead of a wait for the guard's
    timeout; where the guard raised, no rank waits in the barrier. A Trainer without a guard passes through
    unchanged. Left installed for the life of the process (a pass-through without a guard)."""
    if _BARRIER_PATCHED:
        return
    _BARRIER_PATCHED.append(True)
    try:
        import importlib

        connector = importlib.import_module(f"{pl.__name__}.trainer.connectors.data_connector")
        barrier = connector._InfiniteBarrier
    except (ImportError, AttributeError):  # a release without it: the guard's timeout applies
        return
    barrier.__enter__ = _barrier_enter(barrier.__enter__)
    barrier.__exit__ = _barrier_exit(barrier.__exit__)


def _start_early(guard: CollectiveGuard, call: trace.Call) -> None:
    """Start ``guard``'s session at this collective where a Trainer holding it runs it (a frame of the call's
    stack is one of its methods) and its process group exists: the first hook of a callback comes later."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    frame = call.frame
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, pl.Trainer) and any(c is guard for c in owner.callbacks):
            guard._start(owner, owner.lightning_module)
            return
        frame = frame.f_back


class _GuardListener(trace.Listener):
    """Checks each collective of the guard's thread on the whole world before it enters the backend (the
    shared patch of ``torch.distributed``, ddpprobe/trace/_patch.py)."""

    def __init__(self, guard: CollectiveGuard):
        self._guard = weakref.ref(guard)  # the patch holds the listener: the guard is still collected

    def before(self, call: trace.Call) -> None:
        guard = self._guard()
        if guard is None:
            return
        if guard._exchange is None and threading.get_ident() == guard._thread:
            _start_early(guard, call)
        ex = guard._exchange
        gradient = _gradients.is_gradient(call)  # DDP's reducer may call its hook from an autograd thread
        if ex is None or not (gradient or threading.get_ident() == guard._thread):
            return
        if not guard._whole_world(call.args, call.kwargs):
            return
        fields = {
            **call.fields,
            "group_size": ex.world_size,
            "root": None if gradient else _root(call.original, call.args, call.kwargs),
            "lists": None if gradient else _lists(call.name, call.args, call.kwargs),
            **guard._classifier.context(call.frame, call.name),
        }
        fields.update(call.extra)
        if fields.get("source") == "user":
            fields["reads_rank"] = reads_rank(call.frame, guard._classifier)
        guard._check(_entries.collective(ex.n, ex.rank, fields))


#: What reads the rank in the user's code, besides the trace's ``RANK_NAMES``: Lightning's zero-rank flags and the
#: launchers' environment variables (``os.environ["LOCAL_RANK"]``, a string constant of the code).
RANK_READS = trace.RANK_NAMES | {"is_global_zero", "is_local_zero", "rank_zero_only"}
RANK_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "GLOBAL_RANK", "NODE_RANK", "SLURM_PROCID", "GROUP_RANK"})


def reads_rank(frame, classifier) -> list:
    """What the user's frames of a collective's call read of the rank (sorted names), from the collective's
    caller out to the hook Lightning ran (the first frame of a Lightning loop or of the Trainer): the names of
    :data:`RANK_READS` their code uses, the environment variables of :data:`RANK_VARIABLES` it names, and
    ``rank_zero_only`` where a ``@rank_zero_only`` function lies between. Empty where none reads the rank: the
    condition that let only some ranks make the call is of another kind (a clock, the rank's own data, a hook
    Lightning runs on some ranks only)."""
    found = set()
    loops = classifier._loop_types
    while frame is not None:
        code = frame.f_code
        if isinstance(frame.f_locals.get("self"), loops):
            break
        if classifier._is_user(frame):
            found |= set(code.co_names) & RANK_READS
            found |= {c for c in code.co_consts if isinstance(c, str) and c in RANK_VARIABLES}
        elif code.co_name == "wrapped_fn" and "rank_zero" in code.co_filename:
            found.add("rank_zero_only")
        frame = frame.f_back
    return sorted(found)

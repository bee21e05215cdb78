"""Audit your own LightningModule: which logged values are rank-local, wrong or unsafe under DDP, and why.

:func:`audit` first checks the factories in this process (import, call, types, which Lightning
package the module is written for), then runs one stage (``validate``, ``fit``, ``test`` or
``predict``) of your module on your data twice, in fresh worlds started by
:func:`ddpprobe.run_world`: once in a single process (W=1), once on ``world_size`` ranks (W=N, gloo on
CPUs by default). Each rank writes a trace as it runs (ddpprobe/trace/): every collective in
order with the hook, the logged key, op, dtype, shape and the user's line; every ``self.log`` call with
its value and batch size; every batch's sample ids (or content hashes). Each rank also records the
final ``trainer.callback_metrics``, what it printed, the removed Lightning 1.x hooks the module
defines, and what reached the logger. The result has one row per logged key, e.g. for
``examples/seed_f1_module.py`` at W=2::

    key     hook                     step  epoch  sync_dist  reduce_fx  W=1  rank 0    rank 1  verdict
    val_f1  on_validation_epoch_end  no    yes    no         mean       0.8  0.857143  0.75    ! rank-divergent ...

with one of these verdicts (``ddpprobe.audit.SYNCED_EQUAL`` etc.):

- ``synced, equals single-process``;
- ``synced, differs from single-process``, with the cause only where the records prove it: samples the
  ranks really ran twice (padding), every rank running every sample (unsharded data), the floored
  count of upstream issue #21859 (the synced mean recomputed from the logged values with a floored
  count equals the measured one), a non-decomposable metric (the same samples with the same weights
  average to another number), else ``unknown`` with the evidence;
- ``rank-divergent (not synced)``: each rank keeps its own value, the logger writes rank 0's; the cause says
  what a sync of the ranks' values gives and, on the same weights, whether that is the single-process value;
- ``synced; not compared with single-process (the weights trained apart)``: a training key of a ``fit`` whose
  W=1 and W=N weights differ (validation keys are then compared with a single process validating the W=N
  weights);
- ``logged on some ranks only (collective-mismatch hazard)``;
- for values logged ``on_step``: ``step values synced`` or ``step values rank-local``;
- ``no value on any rank`` when the distributed run ended before the epoch's values existed; ``no value on the
  ranks whose stage did not complete`` when some ranks finished (their values are shown) and others never did.
- ``no value under this key`` when neither run stored one (e.g. several dataloaders: Lightning stores
  ``key/dataloader_idx_N`` instead); never counted as equal.

The ranks' collective sequences are aligned and the first divergence is reported: a collective some
ranks never enter (who waits, at which line), different op/dtype/shape, the same op carrying different
keys, or serving different purposes (a step sync with an epoch sync), on different ranks; then the call
site whose collectives the ranks made a different number of times, and a fix chosen from how the counts
differ. The callbacks' end state and ``self.all_gather`` leaves that came back unchanged are reported per
rank. Every fix line names the fact test that shows the fix works; where no fact proves one, only the
evidence is printed.

Command line: ``python -m ddpprobe audit mypkg.models:make_model --data mypkg.data:make_data``.

The path from records to report reads one way: ``_pipeline.py`` (which worlds run, in which order, and the
assembly of the result) at the top, then four rooms, each a subpackage: ``worlds`` (run one world, the rank side),
``evidence`` (what the records prove), ``causes`` (the contract and the registry: verdicts and causes) and
``report`` (the result and its text); this module is the entry point and the public names.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional, Union

from ddpprobe._support import require
from ddpprobe.audit.causes._fixes import FIXES
from ddpprobe.audit.causes._kinds import (
    FLOORED_COUNT_ISSUE,
    NO_VALUE,
    NO_VALUE_ON_SOME,
    NOT_AT_SINGLE,
    NOT_IN_WORLD,
    NOT_STORED,
    RANK_DIVERGENT,
    SOME_RANKS_ONLY,
    STEP_EQUAL_UNSYNCED,
    STEP_LEVEL,
    STEP_RANK_LOCAL,
    STEP_SYNCED,
    SYNCED_DIFFERS,
    SYNCED_EQUAL,
    TRAINED_APART,
    KeyRow,
)
from ddpprobe.audit.evidence._experiment import (
    EXPERIMENT_DIFFERS,
    EXPERIMENT_DIVERGENT,
    EXPERIMENT_EQUAL,
    EXPERIMENT_LOCAL,
)
from ddpprobe.audit.report._result import AuditResult
from ddpprobe.audit.worlds._inputs import AuditInputError, _ref, check_options, preflight

__all__ = [
    "AuditInputError",
    "AuditResult",
    "EXPERIMENT_DIFFERS",
    "EXPERIMENT_DIVERGENT",
    "EXPERIMENT_EQUAL",
    "EXPERIMENT_LOCAL",
    "FIXES",
    "FLOORED_COUNT_ISSUE",
    "KeyRow",
    "NOT_AT_SINGLE",
    "NOT_IN_WORLD",
    "NOT_STORED",
    "NO_VALUE",
    "NO_VALUE_ON_SOME",
    "STEP_RANK_LOCAL",
    "STEP_EQUAL_UNSYNCED",
    "STEP_SYNCED",
    "RANK_DIVERGENT",
    "SOME_RANKS_ONLY",
    "STEP_LEVEL",
    "SYNCED_DIFFERS",
    "SYNCED_EQUAL",
    "TRAINED_APART",
    "audit",
]


def audit(
    model_factory: Union[str, Callable],
    data_factory: Union[str, Callable, None] = None,
    world_size: int = 2,
    stage: str = "validate",
    *,
    backend: str = "gloo",
    limit_batches: Optional[int] = None,
    max_epochs: int = 1,
    seed: int = 0,
    timeout: Optional[float] = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    progress: Optional[Callable[[str], None]] = None,
) -> AuditResult:
    """Run ``stage`` of ``model_factory()`` on ``data_factory()`` at W=1 and at W=``world_size``; compare.

    Args:
        model_factory: a top-level callable (or ``"package.module:function"``) taking no arguments and
            returning a ``LightningModule`` of ``pytorch_lightning`` or ``lightning.pytorch`` (the audit
            runs that package's Trainer). Called once here to check it, then once in every rank of both
            worlds, after ``seed_everything(seed)``.
        data_factory: the same for the data (None: the module's own ``*_dataloader`` methods, e.g.
            ``pytorch_lightning.demos.boring_classes:BoringModel``): returns a ``LightningDataModule``, a
            ``DataLoader`` (the stage's loader), or ``{"train": DataLoader, "val": DataLoader}`` (also
            ``"test"``, ``"predict"``).
        world_size: ranks of the distributed run, 2 or more (1 would compare a single process with itself).
        stage: ``"validate"`` (default), ``"fit"``, ``"test"`` or ``"predict"``. In ``fit`` the weights
            train differently at W=N (gradients averaged over W batches), so values computed from them can
            differ from single-process for that reason alone; ``validate`` isolates logging.
        backend: ``"gloo"`` (CPU processes) or ``"nccl"`` (one CUDA device per rank).
        limit_batches: ``limit_*_batches`` for the Trainer (None: every batch).
        max_epochs: epochs for ``fit``.
        seed: ``seed_everything`` seed used before the factories run in every rank.
        timeout: seconds each world may run (default ``DDPPROBE_TIMEOUT`` or 120); a collective that
            never completes fails after half of it (the process-group timeout).
        rtol, atol: tolerance for two values being equal.
        progress: called with one line before each world starts (which world, its time limit), e.g.
            ``print`` to stderr, so a module that hangs is not waited for in silence (the command line
            passes one).

    Returns:
        An :class:`AuditResult`; ``result.exit_code`` is 1 when it found a problem (see
        ``AuditResult.exit_code``).

    Raises:
        AuditInputError: a factory cannot be imported, raises or returns the wrong type, a bad option,
            or ``world_size`` below 2; raised before any world starts.
        ddpprobe.WorldError: the single-process world failed (the module cannot run at all).
    """
    from ddpprobe.audit._pipeline import assemble

    worlds, inputs = audit_worlds(
        model_factory,
        data_factory,
        world_size,
        stage,
        backend=backend,
        limit_batches=limit_batches,
        max_epochs=max_epochs,
        seed=seed,
        timeout=timeout,
        progress=progress,
    )
    return assemble(worlds, inputs, rtol, atol)


def audit_worlds(
    model_factory: Union[str, Callable],
    data_factory: Union[str, Callable, None] = None,
    world_size: int = 2,
    stage: str = "validate",
    *,
    backend: str = "gloo",
    limit_batches: Optional[int] = None,
    max_epochs: int = 1,
    seed: int = 0,
    timeout: Optional[float] = None,
    progress: Optional[Callable[[str], None]] = None,
):
    """The live part of :func:`audit` (same arguments but the tolerances): check the inputs, run the worlds.

    Returns ``(worlds, inputs)``: the :class:`~ddpprobe.audit.worlds._worlds.Worlds` the audit ran (every world's
    records, traces and prints: ``worlds.to_dict()`` is JSON, ``Worlds.from_dict`` reads it back) and the inputs
    the result names (``model``, ``data``, ``stage``, ``world_size``, ``backend``, ``lightning``).
    ``ddpprobe.audit._pipeline.assemble(worlds, inputs, rtol, atol)`` turns them into the :class:`AuditResult`,
    pure Python, in this process: what the tooling's tests run on a recording (tests/support/recordings.py).

    Raises:
        AuditInputError, ddpprobe.WorldError: as :func:`audit`.
    """
    require("ddpprobe audit")  # a Lightning release below the support range: refused (ddpprobe/_support.py)
    from ddpprobe.audit._pipeline import run_worlds

    settings = check_options(stage, world_size, limit_batches, max_epochs, seed, backend, timeout)
    model_ref, data_ref = _ref(model_factory, "model"), _ref(data_factory, "data")
    sys_path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    package = preflight(model_ref, data_ref, stage)
    params = dict(
        model_ref=model_ref,
        data_ref=data_ref,
        stage=stage,
        limit_batches=limit_batches,
        max_epochs=max_epochs,
        seed=seed,
        sys_path=sys_path,
    )
    worlds = run_worlds(params, world_size, settings, progress)
    data = data_ref or "(the module's own *_dataloader methods)"
    inputs = dict(model=model_ref, data=data, stage=stage, world_size=world_size, backend=backend, lightning=package)
    return worlds, inputs

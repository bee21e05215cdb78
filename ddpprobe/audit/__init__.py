"""Audit your own LightningModule: which logged values are rank-local, wrong or unsafe under DDP, and why.

:func:`audit` first checks the factories in this process (import, call, types, which Lightning
package the module is written for), then runs one stage (``validate``, ``fit``, ``test`` or
``predict``) of your module on your data twice, in fresh worlds started by
:func:`ddpprobe.run_world`: once in a single process (W=1), once on ``world_size`` ranks (W=N, gloo on
CPUs by default). Each rank writes a trace as it runs (ddpprobe/probes/trace.py): every collective in
order with the hook, the logged key, op, dtype, shape and the user's line; every ``self.log`` call with
its value and batch size; every batch's sample ids (or content hashes). Each rank also records the
final ``trainer.callback_metrics``, what it printed, the removed Lightning 1.x hooks the module
defines, and what reached the logger. The result has one row per logged key, e.g. for
``examples/seed_f1_module.py`` at W=2::

    key     hook                     step  epoch  sync_dist  reduce_fx  W=1  rank 0    rank 1  verdict
    val_f1  on_validation_epoch_end  no    yes    no         mean       0.8  0.857143  0.75    ! rank-divergent (not synced)

with one of these verdicts (``ddpprobe.audit.SYNCED_EQUAL`` etc.):

- ``synced, equals single-process``;
- ``synced, differs from single-process``, with the cause only where the records prove it: samples the
  ranks really ran twice (padding), every rank running every sample (unsharded data), the floored
  count of upstream issue #21859 (the synced mean recomputed from the logged values with a floored
  count equals the measured one), a non-decomposable metric (the same samples with the same weights
  average to another number), else ``unknown`` with the evidence;
- ``rank-divergent (not synced)``: each rank keeps its own value, the logger writes rank 0's;
- ``logged on some ranks only (collective-mismatch hazard)``;
- for values logged ``on_step``: ``step values synced`` or ``step values rank-local``;
- ``no value on any rank`` when the distributed run ended before the epoch's values existed.
- ``no value under this key`` when neither run stored one (e.g. several dataloaders: Lightning stores
  ``key/dataloader_idx_N`` instead); never counted as equal.

The ranks' collective sequences are aligned and the first divergence is reported: a collective some
ranks never enter (who waits, at which line), different op/dtype/shape, or the same op carrying
different keys on different ranks. Every fix line names the fact test that shows the fix works.

Command line: ``python -m ddpprobe audit mypkg.models:make_model --data mypkg.data:make_data``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Callable, Optional, Union

from ddpprobe.audit._experiment import (
    EXPERIMENT_DIFFERS,
    EXPERIMENT_DIVERGENT,
    EXPERIMENT_EQUAL,
    EXPERIMENT_LOCAL,
    experiment_rows,
)
from ddpprobe.audit._fixes import FIXES, REMOVED_HOOKS
from ddpprobe.audit._verdict import (
    FLOORED_COUNT_ISSUE,
    NO_VALUE,
    NOT_AT_SINGLE,
    NOT_IN_WORLD,
    NOT_STORED,
    RANK_DIVERGENT,
    SOME_RANKS_ONLY,
    STEP_LEVEL,
    STEP_RANK_LOCAL,
    STEP_SYNCED,
    SYNCED_DIFFERS,
    SYNCED_EQUAL,
    KeyRow,
    padding_duplicates,
    rows as _rows,
)

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
    "STEP_RANK_LOCAL",
    "STEP_SYNCED",
    "RANK_DIVERGENT",
    "SOME_RANKS_ONLY",
    "STEP_LEVEL",
    "SYNCED_DIFFERS",
    "SYNCED_EQUAL",
    "audit",
]


STAGES = ("validate", "fit", "test", "predict")

#: Largest seed ``seed_everything`` accepts (2**32 - 1, numpy's limit; lightning_fabric/utilities/seed.py).
MAX_SEED = 2**32 - 1


class AuditInputError(ValueError):
    """The audit cannot run what it was given: a factory that cannot be imported, or that returns the
    wrong type, or a bad option. The message names the bad value and the fix. (CLI exit code 2.)"""


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """What :func:`audit` found.

    Attributes:
        model, data: the factories as ``"module:qualname"``.
        stage: ``"validate"``, ``"fit"`` or ``"test"``.
        world_size, backend: the W=N world.
        rows: one :class:`KeyRow` per logged key, in first-logged order.
        stdout_lines: ``{"single": [n], "world": [n_rank0, n_rank1, ...]}``, lines each rank wrote to
            stdout (the user's ``print``\\ s; the audit itself prints nothing in the ranks).
        stdout_samples: the first stdout lines of each W=N rank (up to 5 each).
        removed_hooks: ``[{"hook", "effect"}]`` for each removed 1.x hook the module defines.
        loaders: ``{kind: {"dataset_size", "per_rank", "padding_duplicates"}}`` at W=N, for the loaders
            the stage used (``"train"``, ``"val"``, ``"test"``).
        raised: ``{"single": ..., "world": [...]}``: ``{"type", "message"}`` where the stage raised, else None.
        experiment_calls: calls made on ``self.logger.experiment`` in the W=N run; recorded on rank 0
            only, because every other rank's experiment is a no-op ``_DummyExperiment``.
        logger_metrics: what Lightning sent to the logger in the W=N run (``[{"step", "metrics"}]``,
            rank 0 only, as with any Lightning logger).
        sync_dist_warnings: Lightning's "It is recommended to use sync_dist=True" warnings (W=N, rank 0).
        counts: ``{loop: Counts.to_dict()}`` (ddpprobe/audit/_evidence.py): batches and samples each W=N rank's
            loop really ran, duplicates across ranks, whether every rank ran every sample, the sampler.
        trace: the W=N collective trace (``TRACE_SCHEMA`` below): ``{"level", "ranks", "first_divergence"}``.
        world_error: ``{"type", "message"}`` when the W=N world failed (a rank died, raised outside the
            stage, or hung past the timeout), else None; the trace still holds what every rank did.
        lightning: the Lightning package the audit ran (``"pytorch_lightning"`` or ``"lightning"``),
            chosen from what the model's class derives from.
        predictions: ``predict`` only: prediction batches each W=N rank returned, else None.
        experiment_rows: one entry per value the module wrote to ``self.logger.experiment`` itself
            (``add_scalar(tag, value, ...)``): what each W=N rank's code wrote (only rank 0's reaches the
            logger; every other rank's experiment is a no-op), the single-process value, a verdict
            (``EXPERIMENT_DIVERGENT``, ``EXPERIMENT_LOCAL``, ``EXPERIMENT_DIFFERS``, ``EXPERIMENT_EQUAL``),
            cause and fixes.

    The ``trace`` schema (version 1): ``level`` is ``"flight_recorder"`` when every rank left torch's
    Flight Recorder entries (the backend's own sequence, DDP's gradient all_reduces included) or
    ``"python"`` (the ``torch.distributed`` calls made from Python); ``ranks[r]`` has ``collectives``
    (each ``{"seq", "op", "reduce_op", "dtype", "shape", "group_size", "source", "key", "metric",
    "states", "hook", "call_site", "origin", "pg_seq", "status"}``, ``status`` ``"done"``, ``"raised"`` (with
    ``error``) or ``"pending"``: entered and never left), ``stage`` (``"end"``, ``"raised"`` or None:
    the rank never finished), ``stage_error``, ``flight_recorder_entries``; ``first_divergence`` is None
    or ``{"kind": "missing" | "mismatch" | "keys", "index", "ranks", "entries", "message"}``. The event
    format each rank writes is documented in ddpprobe/probes/trace.py.
    """

    model: str
    data: str
    stage: str
    world_size: int
    backend: str
    rows: list
    stdout_lines: dict
    stdout_samples: list
    removed_hooks: list
    loaders: dict
    raised: dict
    experiment_calls: list
    logger_metrics: list
    sync_dist_warnings: list
    counts: dict = dataclasses.field(default_factory=dict)
    trace: dict = dataclasses.field(default_factory=dict)
    world_error: Optional[dict] = None
    lightning: str = "pytorch_lightning"
    predictions: Optional[list] = None
    experiment_rows: list = dataclasses.field(default_factory=list)

    @property
    def problems(self) -> list:
        """Sentences, one per finding that makes the audit fail."""
        out = [f"{row.key}{' (step values)' if row.level == 'step' else ''}: {row.verdict}"
               for row in self.rows if row.problem]
        tags = list(dict.fromkeys(f"{r['tag']}: {r['verdict']}" for r in self.experiment_rows if r["problem"]))
        out += [f"logger.experiment {t}" for t in tags]
        divergence = (self.trace or {}).get("first_divergence")
        if divergence:
            out.append(f"the ranks' collectives diverge: {divergence['message']}")
        if self.world_error:
            out.append(f"the {self.world_size}-rank world failed: {self.world_error['type']}")
        for kind, info in self.counts.items():
            if self.stage == "predict" and kind == "predict" and info.get("identified") and not info.get("unsharded"):
                if info.get("duplicates") or info.get("missing_vs_single"):
                    out.append(f"predict ran {info['duplicates']} repeated and {info['missing_vs_single'] or 0} "
                               "missing sample(s) compared with the single process")
            if info.get("unsharded"):
                out.append(f"every rank ran all {info['samples'][0]} samples of the {kind} set (the data is not "
                           "sharded: each rank repeats the others' work)")
        for where, info in [("W=1", self.raised["single"])] + [
            (f"rank {r}", info) for r, info in enumerate(self.raised["world"])
        ]:
            if info:
                out.append(f"the {self.stage} stage raised {info['type']} ({where})")
        return out

    @property
    def exit_code(self) -> int:
        """1 when any epoch-level key is rank-divergent, differs from single-process or is logged on some
        ranks only, a step value logged with sync_dist (or a Metric) is rank-local, the ranks'
        collectives diverge, the world failed, the data is not sharded, or the stage raised; else 0."""
        return 1 if self.problems else 0

    def row(self, key: str, level: Optional[str] = None) -> KeyRow:
        """The row of ``key`` (its epoch row when it has both, unless ``level="step"``). Raises
        ``KeyError`` naming the logged keys."""
        for row in self.rows:
            if row.key == key and (level is None or row.level == level):
                return row
        raise KeyError(f"{key!r} was not logged; logged keys: {[r.key for r in self.rows]}")

    def to_dict(self) -> dict:
        """JSON-ready form (what ``--json`` prints), with ``problems`` and ``exit_code`` added."""
        out = dataclasses.asdict(self)
        out["problems"] = self.problems
        out["exit_code"] = self.exit_code
        return out

    def to_json(self) -> str:
        """``to_dict()`` as standard JSON (RFC 8259): a logged NaN or infinity, which JSON cannot hold,
        is written as the string ``"nan"``, ``"inf"`` or ``"-inf"``."""
        return json.dumps(_finite(self.to_dict()), indent=2, allow_nan=False)

    def format(self) -> str:
        """The plain-text report the command line prints."""
        from ddpprobe.audit._format import format_result

        return format_result(self)

    def __str__(self) -> str:
        return self.format()


def _finite(value):
    """``value`` with every non-finite float (in dicts, lists, tuples) replaced by ``str(float)``."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def resolve_ref(ref: str):
    """Import ``"package.module:qualname"`` (or ``"package.module.name"``) and return the object.

    Raises:
        ImportError / AttributeError: the module or the name inside it does not exist.
    """
    import importlib

    module_name, sep, qualname = ref.partition(":")
    if not sep:
        module_name, _, qualname = ref.rpartition(".")
    if not module_name or not qualname:
        raise ImportError(f"{ref!r} is not of the form 'package.module:function'")
    obj = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _ref(factory: Union[str, Callable], what: str) -> str:
    """``"module:qualname"`` of a factory given as a string or an importable top-level callable."""
    if isinstance(factory, str):
        ref = factory if ":" in factory else ":".join(factory.rsplit(".", 1))
    elif callable(factory):
        module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
        if module in (None, "__main__") or "<" in qualname:
            raise AuditInputError(
                f"the {what} factory {qualname or factory!r} (module {module!r}) cannot be imported by name in the "
                "rank processes; define it with `def` at the top level of an importable module, or pass "
                "'package.module:function'"
            )
        ref = f"{module}:{qualname}"
    else:
        raise AuditInputError(f"the {what} factory must be a callable or 'package.module:function', got "
                              f"{type(factory).__name__} {factory!r}")
    return ref


def _call(ref: str, what: str):
    try:
        found = resolve_ref(ref)
    except Exception as exc:  # noqa: BLE001 - ImportError, AttributeError, or the module raising on import
        raise AuditInputError(
            f"cannot import the {what} factory {ref!r}: {type(exc).__name__}: {exc}. Give it as "
            "'package.module:function', importable from the current directory or PYTHONPATH"
        ) from None
    if not callable(found):
        raise AuditInputError(f"the {what} factory {ref!r} is a {type(found).__name__}, not a callable; point "
                              "at a function (or class) that takes no arguments")
    try:
        return found()
    except SystemExit as exc:  # e.g. argparse in the factory reading the audit's own command line
        raise AuditInputError(f"the {what} factory {ref!r} called sys.exit({exc.code!r}) (argparse's parse_args() "
                              "reading the audit's command line does); it must build its object with no "
                              "arguments and without reading sys.argv") from None
    except Exception as exc:  # noqa: BLE001 - the user's factory raising is bad input
        raise AuditInputError(f"the {what} factory {ref!r} raised {type(exc).__name__}: {exc}; it must build "
                              "its object with no arguments") from None


def declared_package(ref: str) -> Optional[str]:
    """The Lightning package the factory's module imports, read from its source without running it:
    ``"lightning"`` or ``"pytorch_lightning"`` when its top-level import statements name exactly one of
    them, else None (both, neither, or no source to read)."""
    import ast
    import importlib.util

    module_name = ref.partition(":")[0]
    try:
        spec = importlib.util.find_spec(module_name)
        with open(spec.origin, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except Exception:  # noqa: BLE001 - not found, not a source file: the import will tell
        return None
    found = set()
    for node in tree.body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        for name in names:
            top = name.split(".")[0]
            if top in ("lightning", "pytorch_lightning"):
                found.add(top)
    return found.pop() if len(found) == 1 else None


#: The methods a LightningModule must override for each stage, each entry a group of alternatives
#: (pytorch_lightning/trainer/configuration_validator.py ``_verify_loop_configurations``: training_step and
#: configure_optimizers for fit, validation_step for validate, test_step for test; predict_step or forward
#: for predict, since the default predict_step calls ``self(batch)``).
STAGE_STEPS = {"fit": (("training_step",), ("configure_optimizers",)), "validate": (("validation_step",),),
               "test": (("test_step",),), "predict": (("predict_step", "forward"),)}


def missing_step(cls, stage: str) -> Optional[str]:
    """None when ``cls`` (a LightningModule subclass) overrides what ``stage`` needs, else the first missing
    method's name (``"predict_step (or forward)"`` for predict)."""
    base = next((b for b in cls.__mro__ if b.__name__ == "LightningModule" and b.__module__.endswith("core.module")),
                None)
    if base is None:
        return None
    for group in STAGE_STEPS[stage]:
        if all(getattr(cls, name, None) is getattr(base, name, None) for name in group):
            return group[0] + "".join(f" (or {name})" for name in group[1:])
    return None


def preflight(model_ref: str, data_ref: str, stage: str) -> str:
    """Check the factories in this process, before any world starts; return the Lightning package to run.

    Chooses the package the model's module imports (:func:`declared_package`) before importing it,
    imports both factories, calls each once, confirms the package from what the model's class derives
    from (``ddpprobe._lightning.trainer_package_of``), chooses it for this process and every world it
    launches (``ddpprobe._lightning.use``), and checks the data factory's return value for ``stage``.

    Raises:
        AuditInputError: a factory cannot be imported, raises, or returns the wrong type; the model
            mixes both Lightning packages; or this process already runs the other package.
    """
    from ddpprobe import _lightning

    declared = declared_package(model_ref)
    if declared is not None:
        try:  # before the user's module runs: it may import ddpprobe, which imports the chosen package
            _lightning.use(declared)
        except ValueError:
            pass  # another package already runs here; the check below says so
    model = _call(model_ref, "model")
    try:
        package = _lightning.trainer_package_of(type(model))
    except ValueError as exc:
        raise AuditInputError(f"the model factory {model_ref} returned a module that mixes both Lightning packages: "
                              f"{exc}") from None
    if package is None:
        raise AuditInputError(
            f"the model factory {model_ref} returned {type(model).__module__}.{type(model).__qualname__} "
            f"{model!r:.80}, not a LightningModule; make the factory return an instance of your LightningModule "
            "subclass, e.g. `return MyModel()`")
    data = _call(data_ref, "data")
    data_package = _lightning.trainer_package_of(type(data))
    if data_package is not None and data_package != package:
        raise AuditInputError(
            f"the model ({model_ref}) is a {package} LightningModule but the data factory {data_ref} returned a "
            f"{data_package} LightningDataModule; import every Lightning class from one package")
    try:
        _lightning.use(package)
    except ValueError as exc:
        raise AuditInputError(f"{exc}: the model {model_ref} needs {package}; run the audit in a fresh process "
                              "(python -m ddpprobe audit ...)") from None
    from ddpprobe.audit._scenario import InputError, _as_loaders

    missing = missing_step(type(model), stage)
    if missing:
        others = [s for s in STAGES if s != stage and not missing_step(type(model), s)]
        raise AuditInputError(
            f"the model factory {model_ref} returned a {type(model).__qualname__} without {missing}, which "
            f"Trainer.{stage} needs (Lightning raises MisconfigurationException); define it, or audit a stage "
            f"the module has: {', '.join('--stage ' + s for s in others) or 'none'}")
    try:
        _as_loaders(data, stage)
    except InputError as exc:
        raise AuditInputError(f"{data_ref}: {exc}") from None
    return package


def _stdout_lines(text: str) -> list:
    return [line for line in text.splitlines() if line.strip()]


def audit(
    model_factory: Union[str, Callable],
    data_factory: Union[str, Callable],
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
        data_factory: the same for the data: returns a ``LightningDataModule``, a ``DataLoader`` (the
            stage's loader), or ``{"train": DataLoader, "val": DataLoader}`` (also ``"test"``, ``"predict"``).
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
    import shutil
    import tempfile

    from ddpprobe.audit import _evidence
    from ddpprobe.launch import (MAX_WORLD_SIZE, SettingsError, WorldError, cuda_device_count, resolve_settings,
                                 run_world)

    if stage not in STAGES:
        raise AuditInputError(f"stage={stage!r} is not supported; use one of {', '.join(STAGES)}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise AuditInputError(f"world_size={world_size!r} must be an int of 2 or more ranks")
    if world_size == 1:
        raise AuditInputError("world_size=1 would run the single-process world twice and compare nothing; "
                              "use --world-size 2 or more")
    if world_size > MAX_WORLD_SIZE:
        raise AuditInputError(f"world_size={world_size} (--world-size) is more ranks than a world can have; "
                              f"use 2 <= world_size <= {MAX_WORLD_SIZE}")
    if limit_batches is not None and (isinstance(limit_batches, bool) or not isinstance(limit_batches, int)
                                      or limit_batches < 1):
        raise AuditInputError(f"limit_batches={limit_batches!r} must be a positive int number of batches")
    if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
        # Lightning reads max_epochs=-1 as "train forever": the world would only end at its timeout.
        raise AuditInputError(f"max_epochs={max_epochs!r} (--max-epochs) must be an int of 1 or more epochs")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        # seed_everything raises for these in every rank (lightning_fabric/utilities/seed.py).
        raise AuditInputError(f"seed={seed!r} (--seed) must be an int from 0 to {MAX_SEED}")
    try:  # the same check run_world makes, made before the factories run instead of after the W=1 world
        settings = resolve_settings(backend=backend, timeout=timeout,
                         names={"backend": "backend= / --backend", "timeout": "timeout= / --timeout"})
    except SettingsError as exc:
        raise AuditInputError(str(exc)) from None
    if settings.backend == "nccl" and cuda_device_count() < world_size:
        raise AuditInputError(
            f"backend='nccl' (--backend) needs one CUDA device per rank: --world-size {world_size} but this machine "
            f"has {cuda_device_count()} CUDA device(s); use --backend gloo or a --world-size of at most "
            f"{cuda_device_count()} (2 or more)")
    model_ref, data_ref = _ref(model_factory, "model"), _ref(data_factory, "data")
    sys_path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    package = preflight(model_ref, data_ref, stage)
    from ddpprobe.audit._scenario import audit_rank, trace_path
    from ddpprobe.probes.trace import FLIGHT_RECORDER_ENV, read_trace

    params = dict(model_ref=model_ref, data_ref=data_ref, stage=stage, limit_batches=limit_batches,
                  max_epochs=max_epochs, seed=seed, sys_path=sys_path)
    trace_root = tempfile.mkdtemp(prefix="ddpprobe-audit-")
    try:
        runs, traces, errors, outputs = {}, {}, {}, {}
        for label, size in (("single", 1), ("world", world_size)):
            if progress is not None:
                ranks = "single process" if size == 1 else f"{size} ranks"
                progress(f"running {stage} of {model_ref} at W={size} ({ranks}, at most {settings.timeout:g} s; "
                         "--timeout changes it)")
            folder = os.path.join(trace_root, label)
            os.makedirs(folder)
            try:
                runs[label] = run_world(audit_rank, size, backend=backend, timeout=timeout, env=FLIGHT_RECORDER_ENV,
                                        trace_dir=folder, **params)
            except WorldError as exc:
                if label == "single":
                    raise
                runs[label] = None
                errors[label] = {"type": type(exc).__name__, "message": str(exc)}
                outputs = exc.outputs
            traces[label] = [_evidence.split(read_trace(trace_path(folder, r))) for r in range(size)]
            for rank in runs[label] or []:
                if rank.record.get("input_error"):
                    raise AuditInputError(rank.record["input_error"])
    finally:
        shutil.rmtree(trace_root, ignore_errors=True)

    single = runs["single"][0].record
    world = runs["world"].records if runs["world"] is not None else [
        _record_from_trace(t) for t in traces["world"]]
    loop = _evidence.STAGE_LOOP[stage]
    counts = {}
    for kind in ([loop, "val"] if stage == "fit" else [loop]):
        found = _evidence.counts(traces["world"], traces["single"][0], kind)
        if found is not None:
            counts[kind] = found
    loaders = {}
    for kind, entries in (world[0].get("loaders") or {}).items():
        if entries:
            size = entries[0]["dataset_size"]
            loaders[kind] = {"dataset_size": size, "per_rank": entries[0]["per_rank"],
                             "padding_duplicates": padding_duplicates(size, world_size),
                             "sampler": entries[0].get("sampler")}
    completed = all(t["stage"] == "end" for t in traces["world"])
    hint = "It is recommended to use `self.log("
    world_stdout = ([r.stdout for r in runs["world"]] if runs["world"] is not None
                    else [outputs.get(r, ("", ""))[0] for r in range(world_size)])
    return AuditResult(
        model=model_ref,
        data=data_ref,
        stage=stage,
        world_size=world_size,
        backend=backend,
        rows=_rows(single, world, world_size, stage, limit_batches, rtol=rtol, atol=atol,
                   world_logs=[t["logs"] for t in traces["world"]], single_logs=traces["single"][0]["logs"],
                   counts=counts, completed=completed, collectives=[t["collectives"] for t in traces["world"]]),
        stdout_lines={"single": [len(_stdout_lines(runs["single"][0].stdout))],
                      "world": [len(_stdout_lines(text)) for text in world_stdout]},
        stdout_samples=[_stdout_lines(text)[:5] for text in world_stdout],
        removed_hooks=[{"hook": h, "effect": REMOVED_HOOKS[h]} for h in (world[0].get("removed_hooks")
                                                                         or single["removed_hooks"])],
        loaders=loaders,
        raised={"single": single["raised"], "world": [rec.get("raised") for rec in world]},
        experiment_calls=world[0].get("experiment_calls") or [],
        logger_metrics=world[0].get("logger_metrics") or [],
        sync_dist_warnings=sorted({w["message"] for w in world[0].get("warnings") or [] if hint in w["message"]}),
        counts={kind: c.to_dict() for kind, c in counts.items()},
        trace=_evidence.trace_summary(traces["world"]),
        world_error=errors.get("world"),
        lightning=package,
        predictions=[rec.get("predictions") for rec in world] if stage == "predict" else None,
        experiment_rows=experiment_rows(single.get("experiment_attempts") or [],
                                        [rec.get("experiment_attempts") or [] for rec in world],
                                        [t["collectives"] for t in traces["world"]],
                                        {kind: c.to_dict() for kind, c in counts.items()}, rtol, atol),
    )


def _record_from_trace(rank: dict) -> dict:
    """A stand-in for the record of a rank whose world failed: what its trace holds."""
    from ddpprobe.audit._scenario import _summarise_calls

    return {"log_calls": _summarise_calls(rank["logs"]), "callback_metrics": {}, "loaders": {},
            "raised": ({"type": rank["stage_error"].partition(":")[0], "message": rank["stage_error"].partition(": ")[2]}
                       if rank["stage_error"] else None),
            "removed_hooks": [], "experiment_calls": [], "experiment_attempts": [], "logger_metrics": [],
            "warnings": []}

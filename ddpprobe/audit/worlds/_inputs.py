"""What the audit checks in the calling process before any world starts: the stage, the factories (import,
call, return types), which Lightning package the model is written for, and the step methods the stage
needs. Bad input raises :class:`AuditInputError` naming the value and the fix (command-line exit code 2)."""

from __future__ import annotations

from typing import Callable, Optional, Union

from ddpprobe.audit.evidence._stages import STAGES
from ddpprobe.audit.worlds._errors import AuditInputError

__all__ = ["AuditInputError", "MAX_SEED", "STAGES", "check_options", "preflight", "resolve_ref"]

#: Largest seed ``seed_everything`` accepts (2**32 - 1, numpy's limit; lightning_fabric/utilities/seed.py).
MAX_SEED = 2**32 - 1


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


def _ref(factory: Union[str, Callable, None], what: str) -> Optional[str]:
    """``"module:qualname"`` of a factory given as a string or an importable top-level callable; None for
    no data factory (the module's own ``*_dataloader`` methods)."""
    if factory is None and what == "data":
        return None
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
        raise AuditInputError(
            f"the {what} factory must be a callable or 'package.module:function', got "
            f"{type(factory).__name__} {factory!r}"
        )
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
        raise AuditInputError(
            f"the {what} factory {ref!r} is a {type(found).__name__}, not a callable; point "
            "at a function (or class) that takes no arguments"
        )
    try:
        return found()
    except SystemExit as exc:  # e.g. argparse in the factory reading the audit's own command line
        raise AuditInputError(
            f"the {what} factory {ref!r} called sys.exit({exc.code!r}) (argparse's parse_args() "
            "reading the audit's command line does); it must build its object with no "
            "arguments and without reading sys.argv"
        ) from None
    except TypeError as exc:
        if _called_without_arguments(exc, found):
            raise AuditInputError(
                f"the {what} factory {ref!r} cannot be called with no arguments ({exc}); point at a function that "
                "takes none, e.g. `def make_model(): return MyModel(hidden=32)`"
            ) from None
        raise AuditInputError(_own_error(what, ref, exc)) from None
    except Exception as exc:  # noqa: BLE001 - the user's factory raising is bad input
        raise AuditInputError(_own_error(what, ref, exc)) from None


def _called_without_arguments(exc: TypeError, factory) -> bool:
    """The ``TypeError`` is the call's own (the factory needs arguments), not one raised inside the factory."""
    import inspect

    try:
        inspect.signature(factory).bind()
    except TypeError:
        return exc.__traceback__ is not None and exc.__traceback__.tb_next is None
    except ValueError:  # no signature to read (a builtin)
        return False
    return False


def _own_error(what: str, ref: str, exc: BaseException) -> str:
    """The factory's own error as it raised it, with the traceback's frames in the user's own files."""
    import traceback

    from ddpprobe.audit.report._format import user_frames

    frames = user_frames(traceback.format_exception(exc))
    where = ("\n" + "\n".join("  " + line for line in frames)) if frames else ""
    return f"the {what} factory {ref!r} raised {type(exc).__name__}: {exc}{where}"


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
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        for name in names:
            top = name.split(".")[0]
            if top in ("lightning", "pytorch_lightning"):
                found.add(top)
    return found.pop() if len(found) == 1 else None


#: The methods a LightningModule must override for each stage, each entry a group of alternatives
#: (pytorch_lightning/trainer/configuration_validator.py ``_verify_loop_configurations``: training_step and
#: configure_optimizers for fit, validation_step for validate, test_step for test; predict_step or forward
#: for predict, since the default predict_step calls ``self(batch)``).
STAGE_STEPS = {
    "fit": (("training_step",), ("configure_optimizers",)),
    "validate": (("validation_step",),),
    "test": (("test_step",),),
    "predict": (("predict_step", "forward"),),
}


def missing_step(cls, stage: str) -> Optional[str]:
    """None when ``cls`` (a LightningModule subclass) overrides what ``stage`` needs, else the first missing
    method's name (``"predict_step (or forward)"`` for predict)."""
    base = next(
        (b for b in cls.__mro__ if b.__name__ == "LightningModule" and b.__module__.endswith("core.module")), None
    )
    if base is None:
        return None
    for group in STAGE_STEPS[stage]:
        if all(getattr(cls, name, None) is getattr(base, name, None) for name in group):
            return group[0] + "".join(f" (or {name})" for name in group[1:])
    return None


def suggestible(cls, stage: str) -> Optional[str]:
    """Like :func:`missing_step`, but a stage a refusal may suggest needs its own step method: ``predict``
    without ``predict_step`` would call ``forward`` on whatever the batch is, which need not work."""
    if stage == "predict" and missing_step(cls, stage) is None:
        base = next((b for b in cls.__mro__ if b.__name__ == "LightningModule"), None)
        if base is not None and getattr(cls, "predict_step", None) is getattr(base, "predict_step", None):
            return "predict_step"
    return missing_step(cls, stage)


def preflight(model_ref: str, data_ref: Optional[str], stage: str) -> str:
    """Check the factories in this process, before any world starts; return the Lightning package to run.

    Chooses the package the model's module imports (:func:`declared_package`) before importing it,
    imports both factories, calls each once, confirms the package from what the model's class derives
    from (``ddpprobe._lightning.trainer_package_of``), chooses it for this process and every world it
    launches (``ddpprobe._lightning.use``), and checks the data factory's return value for ``stage`` (without
    a data factory, that the module defines the stage's ``*_dataloader`` method). A refusal suggests only
    the stages the module and its data can run.

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
        raise AuditInputError(
            f"the model factory {model_ref} returned a module that mixes both Lightning packages: {exc}"
        ) from None
    if package is None:
        raise AuditInputError(
            f"the model factory {model_ref} returned {type(model).__module__}.{type(model).__qualname__} "
            f"{model!r:.80}, not a LightningModule; make the factory return an instance of your LightningModule "
            "subclass, e.g. `return MyModel()`"
        )
    data = _call(data_ref, "data") if data_ref is not None else None
    data_package = _lightning.trainer_package_of(type(data))
    if data_package is not None and data_package != package:
        raise AuditInputError(
            f"the model ({model_ref}) is a {package} LightningModule but the data factory {data_ref} returned a "
            f"{data_package} LightningDataModule; import every Lightning class from one package"
        )
    try:
        _lightning.use(package)
    except ValueError as exc:
        raise AuditInputError(
            f"{exc}: the model {model_ref} needs {package}; run the audit in a fresh process "
            "(python -m ddpprobe audit ...)"
        ) from None
    from ddpprobe.audit.worlds._loaders import as_loaders, has_loader, no_loader_error, runnable_stages

    missing = missing_step(type(model), stage)
    if missing:
        others = [s for s in runnable_stages(model, data, lambda s: suggestible(type(model), s)) if s != stage]
        raise AuditInputError(
            f"the model factory {model_ref} returned a {type(model).__qualname__} without {missing}, which "
            f"Trainer.{stage} needs (Lightning raises MisconfigurationException); define it, or audit a stage "
            f"the module and its data can run: {', '.join('--stage ' + s for s in others) or 'none'}"
        )
    try:
        as_loaders(data, stage)
    except AuditInputError as exc:
        raise AuditInputError(f"{data_ref}: {exc}") from None
    if not has_loader(model, data, stage):
        raise AuditInputError(no_loader_error(model_ref, data_ref, stage))
    return package


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_options(stage: str, world_size, limit_batches, max_epochs, seed, backend: str, timeout: Optional[float]):
    """Check the audit's options before any factory runs; return the launcher's resolved settings.

    Raises:
        AuditInputError: naming the bad value and the range it must be in.
    """
    from ddpprobe.launch import MAX_WORLD_SIZE, SettingsError, cuda_device_count, resolve_settings

    if stage not in STAGES:
        raise AuditInputError(f"stage={stage!r} is not supported; use one of {', '.join(STAGES)}")
    if not _is_int(world_size) or world_size < 1:
        raise AuditInputError(f"world_size={world_size!r} must be an int of 2 or more ranks")
    if world_size == 1:
        raise AuditInputError(
            "world_size=1 would run the single-process world twice and compare nothing; use --world-size 2 or more"
        )
    if world_size > MAX_WORLD_SIZE:
        raise AuditInputError(
            f"world_size={world_size} (--world-size) is more ranks than a world can have; "
            f"use 2 <= world_size <= {MAX_WORLD_SIZE}"
        )
    if limit_batches is not None and (not _is_int(limit_batches) or limit_batches < 1):
        raise AuditInputError(f"limit_batches={limit_batches!r} must be a positive int number of batches")
    if not _is_int(max_epochs) or max_epochs < 1:
        # Lightning reads max_epochs=-1 as "train forever": the world would only end at its timeout.
        raise AuditInputError(f"max_epochs={max_epochs!r} (--max-epochs) must be an int of 1 or more epochs")
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        # seed_everything raises for these in every rank (lightning_fabric/utilities/seed.py).
        raise AuditInputError(f"seed={seed!r} (--seed) must be an int from 0 to {MAX_SEED}")
    try:  # the same check run_world makes, made before the factories run instead of after the W=1 world
        settings = resolve_settings(
            backend=backend,
            timeout=timeout,
            names={"backend": "backend= / --backend", "timeout": "timeout= / --timeout"},
        )
    except SettingsError as exc:
        raise AuditInputError(str(exc)) from None
    if settings.backend == "nccl" and cuda_device_count() < world_size:
        raise AuditInputError(
            f"backend='nccl' (--backend) needs one CUDA device per rank: --world-size {world_size} but this machine "
            f"has {cuda_device_count()} CUDA device(s); use --backend gloo or a --world-size of at most "
            f"{cuda_device_count()} (2 or more)"
        )
    return settings

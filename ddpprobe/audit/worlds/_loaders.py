"""What the data factory returned (or the module's own ``*_dataloader`` methods), as ``Trainer`` keyword
arguments for a stage; and which stages a module and its data can run. Used in the calling process (to
check the input before any world starts) and in every rank (to run the stage)."""

from __future__ import annotations

from typing import Optional

from torch.utils.data import DataLoader

from ddpprobe._lightning import pl
from ddpprobe.audit.evidence._stages import DATA_KEY, LOADER_METHOD, STAGES
from ddpprobe.audit.worlds._errors import AuditInputError


def describe(value) -> str:
    """``"module.Class repr"`` of a value, cut to 200 characters, for an error message."""
    return f"{type(value).__module__}.{type(value).__qualname__} {value!r}"[:200]


def as_loaders(data, stage: str) -> dict:
    """Turn what the data factory returned into ``Trainer`` keyword arguments for ``stage``.

    Accepted: None (no data factory: the module's own ``*_dataloader`` methods, so no keyword); a
    ``LightningDataModule``; a ``DataLoader`` (the stage's loader: validation for ``validate``, training for
    ``fit``, test for ``test``, prediction for ``predict``); a dict with keys ``"train"``, ``"val"``,
    ``"test"``, ``"predict"``; for ``fit`` a ``(train, val)`` tuple.

    Raises:
        AuditInputError: anything else, or a dict without the stage's loader.
    """
    if data is None:
        return {}
    if isinstance(data, pl.LightningDataModule):
        return {"datamodule": data}
    if isinstance(data, DataLoader):
        return {("train_dataloaders" if stage == "fit" else "dataloaders"): data}
    if isinstance(data, (tuple, list)) and stage == "fit" and len(data) == 2:
        data = {"train": data[0], "val": data[1]}
    if isinstance(data, dict) and data and set(data) <= set(DATA_KEY.values()):
        key = DATA_KEY[stage]
        if key not in data:
            needs = "a training loader" if stage == "fit" else "it"
            raise AuditInputError(f"the data factory returned a dict without {key!r}; stage {stage!r} needs {needs}")
        if stage == "fit":
            return {"train_dataloaders": data["train"], **({"val_dataloaders": data["val"]} if "val" in data else {})}
        return {"dataloaders": data[key]}
    raise AuditInputError(
        f"the data factory returned {describe(data)}; return a LightningDataModule, a DataLoader, or a dict "
        "{'train': DataLoader, 'val': DataLoader}"
        + (
            "; several loaders of one stage go in the dict, e.g. {'val': [DataLoader, DataLoader]}"
            if isinstance(data, (list, tuple))
            else ""
        )
    )


def _overrides(obj, method: str) -> bool:
    """``obj``'s class defines ``method`` itself, not only Lightning's base hook ``DataHooks`` (which raises;
    pytorch_lightning/core/hooks.py)."""
    for cls in type(obj).__mro__:
        if method in vars(cls):
            return not (cls.__name__ == "DataHooks" and cls.__module__.endswith("core.hooks"))
    return False


def has_loader(model, data, stage: str) -> bool:
    """``stage`` finds a loader: in the data (a ``DataLoader`` for that stage, the dict's key, a
    ``LightningDataModule`` defining the method), or, without data, in the module's own method."""
    if data is None:
        return _overrides(model, LOADER_METHOD[stage])
    if isinstance(data, pl.LightningDataModule):
        return _overrides(data, LOADER_METHOD[stage])
    try:
        as_loaders(data, stage)
    except AuditInputError:
        return False
    return True


def runnable_stages(model, data, steps_missing) -> list:
    """The stages (other than none) whose step method the module has (``steps_missing(stage)`` is None)
    and whose loader the data or the module gives: the only stages a refusal may suggest."""
    return [s for s in STAGES if not steps_missing(s) and has_loader(model, data, s)]


def no_loader_error(model_ref: str, data_ref: Optional[str], stage: str) -> str:
    """The message for a stage that finds no loader."""
    method = LOADER_METHOD[stage]
    if data_ref is None:
        return (
            f"the model factory {model_ref} returned a module without {method} and no --data was given; pass "
            f"--data with the {DATA_KEY[stage]!r} loader, or define {method} on the module"
        )
    return f"{data_ref}: the data gives no {DATA_KEY[stage]!r} loader for stage {stage!r}; define {method} on it"

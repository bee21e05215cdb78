"""The user-sampler probe: validate or test when the user, not Lightning, decides how samples are dealt out.

``evaluate_with_sampler`` runs a ``ValidationProbe`` (ddpprobe/probes/validation.py) over
``IdDataset(n)`` through a ``DataLoader`` whose sampler the scenario picks, under
``Trainer(use_distributed_sampler=...)``:

========================  ===========================================================================
``sampler``               the user's ``DataLoader(sampler=...)``
========================  ===========================================================================
``None``                  none (the loader's default ``SequentialSampler``)
``"drop_last"``           ``torch.utils.data.DistributedSampler(shuffle=False, drop_last=True)`` for
                          this rank
``"unrepeated"``          Lightning's ``UnrepeatedDistributedSampler(shuffle=False)`` for this rank
                          (pytorch_lightning/overrides/distributed.py), the sampler predict uses
========================  ===========================================================================

Lightning replaces the sampler only when ``use_distributed_sampler`` is on, the run is distributed and
the loader's sampler is not already a ``DistributedSampler``
(pytorch_lightning/trainer/connectors/data_connector.py ``_DataConnector._requires_distributed_sampler``).
"""

from __future__ import annotations

from torch.utils.data import DataLoader, DistributedSampler

from ddpprobe._lightning import pl
from ddpprobe.launch import RankInfo
from ddpprobe.probes.common import ddp_trainer, floats, only_loader, recorded_warnings, trainer_metrics
from ddpprobe.probes.data import IdDataset
from ddpprobe.probes.validation import ValidationProbe

#: The samplers a scenario may give its ``DataLoader`` (see the module docstring).
USER_SAMPLERS = (None, "drop_last", "unrepeated")
#: Evaluation stage -> (``Trainer`` method, the ``Trainer`` attribute holding the loader it used).
_EVALUATIONS = {"validate": ("validate", "val_dataloaders"), "test": ("test", "test_dataloaders")}


def user_sampler(kind, dataset, info: RankInfo):
    """The sampler ``kind`` (one of ``USER_SAMPLERS``) over ``dataset`` for this rank, or ``None``.

    Raises:
        ValueError: an unknown ``kind``; the message lists the choices.
    """
    if kind is None:
        return None
    if kind == "drop_last":
        return DistributedSampler(dataset, num_replicas=info.world_size, rank=info.rank, shuffle=False, drop_last=True)
    if kind == "unrepeated":
        return pl.overrides.distributed.UnrepeatedDistributedSampler(
            dataset, num_replicas=info.world_size, rank=info.rank, shuffle=False
        )
    raise ValueError(f"sampler={kind!r}; use one of {USER_SAMPLERS}")


def evaluate_with_sampler(
    info: RankInfo,
    n: int,
    batch_size: int = 2,
    sampler=None,
    use_distributed_sampler: bool = True,
    stage: str = "validate",
    logs: list = (),
) -> dict:
    """Scenario: ``trainer.validate`` or ``trainer.test`` a ``ValidationProbe`` over ``IdDataset(n)`` with
    the user's ``sampler`` and ``Trainer(use_distributed_sampler=use_distributed_sampler)``.

    Record keys: ``seen_ids`` (per-batch id lists), ``sampler`` (class name of the sampler in the loader
    Lightning used), ``drop_last`` (that sampler's ``drop_last``, or ``None``), ``same_sampler`` (whether
    it is the very object the user passed), ``callback_metrics`` / ``logged_metrics`` /
    ``progress_bar_metrics``, ``returned``, ``warnings``.

    Raises:
        ValueError: ``stage`` not ``"validate"`` or ``"test"``, or an unknown ``sampler``.
    """
    if stage not in _EVALUATIONS:
        raise ValueError(f"stage={stage!r}; use one of {tuple(_EVALUATIONS)}")
    method, loaders_attr = _EVALUATIONS[stage]
    dataset = IdDataset(n)
    given = user_sampler(sampler, dataset, info)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=given, num_workers=0)
    model = ValidationProbe(logs=logs)
    with recorded_warnings() as warnings:
        trainer = ddp_trainer(info, use_distributed_sampler=use_distributed_sampler)
        returned = getattr(trainer, method)(model, dataloaders=loader, verbose=False)
    used = only_loader(getattr(trainer, loaders_attr)).sampler
    return {
        "seen_ids": model.seen_ids,
        "sampler": type(used).__name__,
        "drop_last": getattr(used, "drop_last", None),
        "same_sampler": given is not None and used is given,
        **trainer_metrics(trainer),
        "returned": [floats(d) for d in returned],
        "warnings": warnings,
    }

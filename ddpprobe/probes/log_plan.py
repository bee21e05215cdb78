"""The probes' one vocabulary for *what to log and how*: a log plan is a list of ``log_spec(...)`` dicts.

Every probe that calls ``self.log`` on a plan (``ValidationProbe``, ``ReductionProbe``, ...) takes its
entries from ``log_spec`` and logs them with ``log_entry``, so an entry means the same in every probe:

================  =====================================================================================
``what``          the value logged for a batch
================  =====================================================================================
``batch_mean``    the batch mean of ``IdDataset``'s ``value`` (``id ** 2``), a float32 tensor
``python_float``  the same number as a Python ``float``
``python_int``    the sum of the batch's sample ids as a Python ``int``
``int_tensor``    the sum of the batch's sample ids as an int64 tensor
``mean_metric``   a ``torchmetrics.MeanMetric`` object, updated with the batch's values before logging
``sum_metric``    a ``torchmetrics.SumMetric`` object, updated with the batch's values before logging
================  =====================================================================================

An entry with ``hook="epoch_end"`` is logged once in ``on_validation_epoch_end`` instead; its only value
is ``metric_compute`` (``compute()`` of a ``MeanMetric`` fed every batch's values). Which values and
hooks a probe supports is the probe's to say (see its docstring); it rejects the others when built.
"""

from __future__ import annotations

#: ``self.log`` options a log plan entry may carry (pytorch_lightning/core/module.py ``LightningModule.log``).
LOG_OPTIONS = (
    "sync_dist",
    "reduce_fx",
    "on_step",
    "on_epoch",
    "rank_zero_only",
    "prog_bar",
    "logger",
    "add_dataloader_idx",
)
#: Values a step-level entry may log (see the module docstring).
STEP_VALUES = ("batch_mean", "python_float", "python_int", "int_tensor", "mean_metric", "sum_metric")
#: Values an ``hook="epoch_end"`` entry may log.
EPOCH_END_VALUES = ("metric_compute",)
#: Where an entry is logged: every batch's step hook, or once in ``on_validation_epoch_end``.
HOOKS = ("step", "epoch_end")
#: How an entry is logged: ``self.log(name, value)`` or ``self.log_dict({name: value})``.
VIAS = ("log", "log_dict")


def log_spec(
    name: str,
    what: str = "batch_mean",
    *,
    via: str = "log",
    hook: str = "step",
    ranks=None,
    subgroup: bool = False,
    **options,
) -> dict:
    """One entry of a log plan: log ``what`` as ``name`` with these ``self.log`` options.

    Args:
        name: the key passed to ``self.log`` (or the single key of the ``self.log_dict`` dict).
        what: which value to log, one of ``STEP_VALUES`` (or ``EPOCH_END_VALUES`` with ``hook="epoch_end"``).
        via: ``"log"`` for ``self.log(name, value, ...)``, ``"log_dict"`` for ``self.log_dict({name: value}, ...)``.
        hook: ``"step"`` (every batch) or ``"epoch_end"`` (once, in ``on_validation_epoch_end``).
        ranks: global ranks that log this entry; ``None`` means every rank.
        subgroup: pass the probe's sub process group as ``sync_dist_group``.
        **options: ``self.log`` options, any of ``LOG_OPTIONS``.

    Returns:
        A JSON-ready dict ``{"name", "what", "via", "hook", "ranks", "subgroup", "options"}``.

    Raises:
        ValueError: an unknown ``what``, ``via``, ``hook`` or option; the message names it and the choices.
    """
    allowed = STEP_VALUES if hook == "step" else EPOCH_END_VALUES if hook == "epoch_end" else None
    if allowed is None:
        raise ValueError(f"log_spec({name!r}): hook={hook!r}; use one of {HOOKS}")
    if what not in allowed:
        raise ValueError(f"log_spec({name!r}): what={what!r} is not one of {allowed} for hook={hook!r}")
    if via not in VIAS:
        raise ValueError(f"log_spec({name!r}): via={via!r}; use one of {VIAS}")
    unknown = sorted(set(options) - set(LOG_OPTIONS))
    if unknown:
        raise ValueError(f"log_spec({name!r}): unknown option(s) {unknown}; use any of {LOG_OPTIONS}")
    return {
        "name": name,
        "what": what,
        "via": via,
        "hook": hook,
        "ranks": ranks,
        "subgroup": subgroup,
        "options": options,
    }


def check_plan(plan, probe: str, values=STEP_VALUES, hooks=HOOKS, subgroup: bool = True) -> list:
    """``plan`` as a list, after checking that the probe named ``probe`` can log every entry.

    Args:
        plan: iterable of ``log_spec(...)`` dicts.
        probe: the probe's class name, for the error message.
        values: the ``what`` values the probe can produce.
        hooks: the hooks the probe logs from.
        subgroup: whether the probe has a sub process group to pass as ``sync_dist_group``.

    Raises:
        ValueError: an entry that is not a ``log_spec`` dict, or that the probe cannot log; the message
            names the entry and what the probe supports.
    """
    plan = list(plan)
    for entry in plan:
        if not isinstance(entry, dict) or set(entry) != {"name", "what", "via", "hook", "ranks", "subgroup", "options"}:
            raise ValueError(f"{probe}: log plan entry {entry!r} is not a log_spec(...) dict; build it with log_spec")
        if entry["hook"] not in hooks or (entry["hook"] == "step" and entry["what"] not in values):
            raise ValueError(
                f"{probe}: cannot log {entry['name']!r} (what={entry['what']!r}, "
                f"hook={entry['hook']!r}); it logs {values} from hooks {hooks}"
            )
        if entry["subgroup"] and not subgroup:
            raise ValueError(f"{probe}: {entry['name']!r} asks for subgroup=True; this probe has no sub process group")
    return plan


def logs_here(entry: dict, hook: str, global_rank: int) -> bool:
    """Whether ``entry`` is logged from ``hook`` on the rank ``global_rank`` (its ``hook`` and ``ranks``)."""
    return entry["hook"] == hook and (entry["ranks"] is None or global_rank in entry["ranks"])


def log_entry(module, entry: dict, value, batch_size=None, group=None) -> None:
    """Log ``value`` from ``module`` (a LightningModule) as ``entry`` says.

    Calls ``module.log(entry["name"], value, **options)`` or ``module.log_dict({name: value}, **options)``,
    where ``options`` are the entry's ``self.log`` options plus ``batch_size=batch_size`` (when not
    ``None``) and ``sync_dist_group=group`` (when the entry has ``subgroup=True``).
    """
    options = dict(entry["options"])
    if entry["subgroup"]:
        options["sync_dist_group"] = group
    if batch_size is not None:
        options["batch_size"] = batch_size
    if entry["via"] == "log_dict":
        module.log_dict({entry["name"]: value}, **options)
    else:
        module.log(entry["name"], value, **options)

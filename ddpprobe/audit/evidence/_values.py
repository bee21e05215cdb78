"""Small rules on recorded values the verdicts share: equality within a tolerance, DistributedSampler's
padding, which loader a hook reads, a key's log events and their batch-size-weighted sums. Pure Python."""

from __future__ import annotations

import math
from typing import Optional

from ddpprobe import hazards
from ddpprobe.audit.evidence._stages import STAGE_LOOP, loop_of_hook


def as_float(value) -> Optional[float]:
    """A recorded value back to a float (records hold ``"nan"``/``"inf"`` as strings)."""
    if value is None:
        return None
    return float(value)


def close(a: Optional[float], b: Optional[float], rtol: float, atol: float) -> bool:
    """``a`` equals ``b`` to ``rtol``/``atol`` (two NaNs are equal; None equals only None)."""
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def padding_duplicates(dataset_size: Optional[int], world_size: int) -> Optional[int]:
    """Samples ``DistributedSampler(drop_last=False)`` repeats so every rank gets as many:
    ``ceil(N / W) * W - N``. Source: torch/utils/data/distributed.py ``DistributedSampler.__init__``."""
    if dataset_size is None:
        return None
    return math.ceil(dataset_size / world_size) * world_size - dataset_size


def loader_kind(hook: str, stage: str) -> str:
    """Which loader a hook's values come from: ``"train"``, ``"val"``, ``"test"`` or ``"predict"``; for a
    hook of no loop (``on_fit_end``), the stage's loop."""
    return loop_of_hook(hook) or STAGE_LOOP[stage]


def _key_logs(logs: list, name: str) -> list:
    return [entry for entry in logs if entry["key"] == name]


def epoch_logs(logs: list, name: str) -> list:
    """The log events of ``name`` that make its epoch value after the stage (what ``callback_metrics`` holds): the
    sanity check's left out (Lightning resets its results after it), and of a ``fit``'s epochs the last one each
    event's ``epoch`` names (events of traces without these fields are all kept)."""
    events = [e for e in _key_logs(logs, name) if not e.get("sanity")]
    epochs = [e["epoch"] for e in events if e.get("epoch") is not None]
    if epochs:
        last = max(epochs)
        events = [e for e in events if e.get("epoch") in (None, last)]
    return events


def _weighted(logs: list) -> Optional[tuple]:
    """``(sum of value * batch_size, sum of batch_size)`` of one key's epoch-level log events, or None
    when a value or batch size is unknown."""
    total, count = 0.0, 0
    for entry in logs:
        if entry.get("value") is None or entry.get("batch_size") is None:
            return None
        total += entry["value"] * entry["batch_size"]
        count += entry["batch_size"]
    return total, count


def _step_values(logs: list, name: str) -> list:
    return [e.get("step_value", e.get("value")) for e in _key_logs(logs, name) if e["on_step"]]


def applicable(names: list, evidence: dict) -> list:
    """The registry entries among ``names`` whose fix's preconditions hold in ``evidence``
    (ddpprobe/hazards/ ``Hazard.applies``)."""
    return [name for name in dict.fromkeys(names) if hazards.HAZARDS[name].applies(evidence)]

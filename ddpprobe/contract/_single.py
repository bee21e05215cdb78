"""Equivalence with one process: the first optimizer step of W ranks of batch b against one process stepping on
the W*b samples the ranks ran first, from the same initial weights.

DDP averages the ranks' gradients (``torch/nn/parallel/distributed.py``, the reducer divides the bucket sum by
the world size), so with a loss averaged over the batch the two gradients are equal; a loss summed over the
batch gives the W-rank run 1/W of the one-process gradient (fact:
``SINGLE_PROCESS_STEP.facts``). The comparison is meaningless where the module computes with batch statistics
or draws random numbers (:func:`not_comparable_reason`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

#: Relative tolerance of "equal" and of "the same ratio on every parameter" (float32 sums in another order).
RTOL = 1e-4
#: The same for gradients of lower precision (a bfloat16 value has about 3 significant digits).
_RTOL_OF = {"bfloat16": 2e-2, "float16": 2e-3}


def not_comparable_reason(module) -> Optional[str]:
    """Why the first step of W ranks cannot equal one process's for ``module`` (a ``torch.nn.Module`` in training
    mode), or None: a BatchNorm normalising with batch statistics (each rank's b samples against one process's
    W*b; SyncBatchNorm excepted) or a dropout with ``p > 0`` (each process draws its own masks)."""
    import torch

    for name, sub in module.named_modules():
        if not sub.training:
            continue
        if isinstance(sub, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(sub, torch.nn.SyncBatchNorm):
            return f"{name} ({type(sub).__name__}) normalises with each rank's own batch statistics"
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd) and sub.p > 0:
            return f"{name} ({type(sub).__name__}, p={sub.p:g}) draws its masks from each process's random state"
    return None


@dataclasses.dataclass(frozen=True)
class FirstStep:
    """The first step's comparison.

    Attributes:
        status: ``"equal"``, ``"scaled"`` (every parameter's gradient is the one-process one times the same
            ``ratio``), ``"differs"`` (``parameters`` names those whose gradient is neither), ``"not comparable"``
            (``reason``) or ``"not recorded"`` (``reason``).
        ratio: the common ratio (W-rank gradient / one-process gradient) where ``status`` is ``"scaled"``.
        ratios: per parameter, its own ratio (None where a gradient is zero or missing).
        parameters: the parameters whose gradient differs (``"differs"``), or all of them (``"scaled"``).
        world_size: W.
    """

    status: str
    ratio: Optional[float] = None
    ratios: dict = dataclasses.field(default_factory=dict)
    parameters: tuple = ()
    reason: Optional[str] = None
    world_size: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _ratio(world: list, single: list) -> tuple:
    """``(r, residual)``: the least-squares ``r`` with ``world ≈ r * single`` and the largest ``|world - r*single|``
    relative to the largest ``|world|``; ``(None, None)`` when ``single`` is all zeros."""
    ss = sum(s * s for s in single)
    if ss == 0:
        return None, None
    r = sum(w * s for w, s in zip(world, single)) / ss
    scale = max((abs(w) for w in world), default=0.0) or 1.0
    return r, max((abs(w - r * s) for w, s in zip(world, single)), default=0.0) / scale


def compare_first_step(world: Optional[dict], single: Optional[dict], world_size: int) -> FirstStep:
    """Compare the ``first_step`` records (ddpprobe/contract/_recorder.py) of rank 0 of the W-rank run and of the
    one-process reference run on the same samples and weights.

    Args:
        world, single: the records (``{"fields": {"grad.<name>": value}, "not_comparable": reason}``), or None
            where a run made no optimizer step.
        world_size: W.
    """
    if world is None or single is None:
        which = "the distributed run" if world is None else "the one-process reference run"
        return FirstStep("not recorded", reason=f"{which} made no optimizer step", world_size=world_size)
    reason = world.get("not_comparable") or single.get("not_comparable")
    if reason:
        return FirstStep("not comparable", reason=reason, world_size=world_size)
    ratios: dict = {}
    tol: dict = {}
    off: list = []
    for path, value in sorted(world["fields"].items()):
        other = single["fields"].get(path)
        name = path[len("grad.") :]
        if value is None or other is None:
            if (value is None) != (other is None):
                off.append(name)
            continue
        if "unreadable" in value or "unreadable" in other:
            continue
        tol[name] = _RTOL_OF.get(value.get("dtype"), RTOL)
        r, residual = _ratio(value["head"], other["head"])
        ratios[name] = r
        if r is None:
            if any(value["head"]):
                off.append(name)
        elif residual > tol[name] * 10 or not math.isfinite(r):
            off.append(name)
    apart = [n for n, r in ratios.items() if r is not None and abs(r - 1) > tol[n]]
    if off:
        also = [n for n in apart if n not in off]
        return FirstStep("differs", ratios=ratios, parameters=tuple(off + also), world_size=world_size)
    if not apart:
        return FirstStep("equal", ratio=1.0, ratios=ratios, world_size=world_size)
    known = [r for r in ratios.values() if r is not None]
    first = known[0]
    if all(abs(r - first) <= tol[n] * max(1.0, abs(first)) for n, r in ratios.items() if r is not None):
        return FirstStep("scaled", ratio=first, ratios=ratios, parameters=tuple(ratios), world_size=world_size)
    return FirstStep("differs", ratios=ratios, parameters=tuple(apart), world_size=world_size)

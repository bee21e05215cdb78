"""What every key's verdict reads: the reference run a key is compared with, the key's calls and values,
and the inputs all keys share. Pure Python."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ddpprobe.audit.evidence._values import close


@dataclasses.dataclass(frozen=True)
class Reference:
    """What the W=N values are compared with.

    Attributes:
        record, logs: the W=1 run's ``audit_rank`` record and ``log`` trace events.
        trained_apart: a ``fit`` whose final weights differ between W=1 and W=N.
        same_weights, same_weights_logs: the record and log events of W=1 validating the weights the W=N
            ``fit`` trained (None when not run).
        steps: optimizer steps of the W=1 and W=N runs (``[13, 7]``), for the report.
        weights_equal: both runs ended with the same weights (equal ``weights_digest``), so a difference
            is not the training's.
    """

    record: dict
    logs: list = dataclasses.field(default_factory=list)
    trained_apart: bool = False
    same_weights: Optional[dict] = None
    same_weights_logs: Optional[list] = None
    steps: list = dataclasses.field(default_factory=lambda: [None, None])
    weights_equal: bool = False

    @property
    def weights_may_differ(self) -> bool:
        """Values computed from the weights may differ for that reason alone (a ``fit`` whose final
        weights were not shown equal)."""
        return not self.weights_equal

    def of(self, hooks: list) -> tuple:
        """``(record, logs)`` to compare a key logged from ``hooks`` with, or ``(None, None)`` when no W=1
        run had the same weights (a training key of a ``fit`` trained apart)."""
        if not self.trained_apart:
            return self.record, self.logs
        if self.same_weights is not None and all("validation" in h for h in hooks):
            return self.same_weights, self.same_weights_logs or []
        return None, None


@dataclasses.dataclass
class _Key:
    """One logged key as :func:`rows` sees it: the ``self.log`` calls and values of every rank and of the
    reference run, and the evidence that goes with them."""

    name: str
    calls: list  # every W=N rank's call summaries (the reference's when no rank logged it)
    ref_calls: list
    logged_on: list
    hooks: list
    single: Optional[float]
    per_rank: list
    counts: object
    compared: bool  # a reference run on the same weights exists

    @property
    def on_epoch(self) -> bool:
        return any(c["on_epoch"] for c in self.calls)

    @property
    def on_step(self) -> bool:
        return any(c["on_step"] for c in self.calls)

    @property
    def sync_dist(self) -> bool:
        return any(c["sync_dist"] for c in self.calls)

    @property
    def metric_object(self) -> bool:
        return any(c["metric_object"] for c in self.calls)

    def common(self) -> dict:
        return dict(
            key=self.name,
            hooks=self.hooks,
            on_step=self.on_step,
            on_epoch=self.on_epoch,
            sync_dist=self.sync_dist,
            reduce_fx="/".join(dict.fromkeys(c["reduce_fx"] for c in self.calls)),
            metric_object=self.metric_object,
            logged_on=self.logged_on,
        )


@dataclasses.dataclass
class _Inputs:
    """What every key's verdict reads besides the key itself: the audit's :class:`~ddpprobe.audit.worlds._worlds.Worlds`
    and the tolerance for two values being equal."""

    worlds: object  # ddpprobe.audit.worlds._worlds.Worlds
    rtol: float
    atol: float

    @property
    def reference(self) -> Reference:
        return self.worlds.reference

    @property
    def world(self) -> list:
        """The W=N ranks' records."""
        return self.worlds.records

    @property
    def world_size(self) -> int:
        return self.worlds.world_size

    @property
    def stage(self) -> str:
        return self.worlds.stage

    @property
    def limit_batches(self) -> Optional[int]:
        return self.worlds.limit_batches

    @property
    def world_logs(self) -> list:
        return self.worlds.world_logs

    @property
    def counts(self) -> dict:
        return self.worlds.counts

    @property
    def completed(self) -> bool:
        return self.worlds.completed

    @property
    def collectives(self) -> list:
        return self.worlds.collectives

    @property
    def ended(self) -> list:
        return self.worlds.ended

    @property
    def unmoved(self) -> list:
        return self.worlds.unmoved

    def close(self, a, b) -> bool:
        return close(a, b, self.rtol, self.atol)

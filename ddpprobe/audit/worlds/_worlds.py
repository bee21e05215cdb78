"""The worlds one audit ran, as one value: :class:`World` (one world's records, traces and prints) and
:class:`Worlds` (the single process, the distributed run, and after a ``fit`` trained apart, the single
process validating the distributed run's weights), with what the verdicts read from them computed once:
the per-loop :class:`~ddpprobe.audit.evidence._counts.Counts`, the reference run each key is compared with, each
rank's collectives, log events and how its stage ended, the shards' recorded lengths, the ``all_gather``
leaves that came back unchanged. Pure Python on recorded events."""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from ddpprobe.audit.evidence._counts import counts, shards_of, unmoved_leaves
from ddpprobe.audit.evidence._keys import Reference
from ddpprobe.audit.evidence._stages import STAGE_LOOP


def _samples(traces: list, loop: str) -> Optional[list]:
    """Per rank, the labels (ids, else content hashes) of the samples its ``loop`` ran outside the sanity check, or
    None where a batch carried neither."""
    out = []
    for trace in traces:
        labels = []
        for batch in trace.get("batches") or []:
            if batch.get("stage") != loop or batch.get("sanity"):
                continue
            found = batch.get("ids") if batch.get("ids") is not None else batch.get("hashes")
            if found is None:
                return None
            labels += [str(x) for x in found]
        out.append(labels)
    return out


def _same_multiset(a: Optional[list], b: Optional[list]) -> bool:
    """Two runs' samples, all ranks together, are the same multiset (None: unknown, never the same)."""
    if a is None or b is None:
        return False
    return sorted(x for rank in a for x in rank) == sorted(x for rank in b for x in rank)


def empty_trace() -> dict:
    """A rank's split trace that recorded nothing (``ddpprobe.trace.split_trace([])``)."""
    return {
        "collectives": [],
        "logs": [],
        "batches": [],
        "all_gathers": [],
        "flight_recorder": None,
        "flight_recorder_unavailable": None,
        "stage": "end",
        "stage_error": None,
        "callback_metrics": None,
    }


@dataclasses.dataclass
class World:
    """One world's outcome.

    Attributes:
        records: each rank's ``audit_rank`` record; in a failed world, the records of the ranks that finished
            (``WorldError.records``) and, for a rank that gave none, what its trace shows.
        traces: each rank's trace, split (ddpprobe/trace/ ``split_trace``).
        stdout: what each rank printed.
        error: ``{"type", "message"}`` when the world failed, else None.
        weights: the weights file rank 0 saved after ``fit``, while the audit's folder exists, else None.
        folder: the world's trace folder, while the audit's folder exists (None for hand-built worlds).
    """

    records: list
    traces: list
    stdout: list
    error: Optional[dict] = None
    weights: Optional[str] = None
    folder: Optional[str] = None

    @property
    def digest(self) -> Optional[str]:
        return self.records[0].get("weights_digest")

    def to_dict(self) -> dict:
        """``{"records", "traces", "stdout", "error"}``, JSON: what the verdicts read (the weights file and the
        trace folder are left out: they exist only while the audit runs)."""
        return {"records": self.records, "traces": self.traces, "stdout": self.stdout, "error": self.error}

    @classmethod
    def from_dict(cls, found: dict) -> "World":
        """The :class:`World` ``to_dict`` gave."""
        return cls(found["records"], found["traces"], found["stdout"], found.get("error"))


@dataclasses.dataclass
class Worlds:
    """The worlds of one audit and what every verdict reads from them.

    Attributes:
        single: the W=1 world; ``world``: the W=N world; ``same_weights``: W=1 validating the W=N weights
            (after a ``fit`` trained apart), else None.
        stage: the audited stage; ``limit_batches``: the Trainer's ``limit_*_batches`` (None: all).
        compared_with: the :class:`Reference` to compare keys with, where given (hand-built worlds of the
            tests); by default built from the worlds (:attr:`reference`).
        first_step: after a ``fit``, W=1 making one optimizer step on the W=N ranks' first batches put
            together, from the W=N initial weights (ddpprobe/audit/worlds/_reference.py), else None.
        partition: the W=N world again with each rank a contiguous block of the same samples, and ``padded``: one
            process running the ranks' samples, repeats included (ddpprobe/audit/worlds/_partitions.py); None where
            not run (ddpprobe/audit/_pipeline.py runs them where a row's verdict rests on them).
        process: the user's single process (``Trainer(devices=1)``, no process group) where ``single`` is not it,
            and ``one_rank_ddp``: the one-rank DDP world (DDP's wrap, one rank) where it ran, else None.
    """

    single: World
    world: World
    same_weights: Optional[World] = None
    stage: str = "validate"
    limit_batches: Optional[int] = None
    compared_with: Optional[Reference] = None
    first_step: Optional[World] = None
    partition: Optional[World] = None
    padded: Optional[World] = None
    process: Optional[World] = None
    one_rank_ddp: Optional[World] = None

    @property
    def proof(self):
        """The proving runs' values (:class:`~ddpprobe.audit.causes._proven.Proof`), from the worlds that
        completed."""
        from ddpprobe.audit.causes._proven import Proof

        def done(world):
            return world is not None and world.error is None and not any(r.get("raised") for r in world.records)

        loop = STAGE_LOOP[self.stage]
        ran = _samples(self.world.traces, loop)
        partition = None
        if done(self.partition):
            split = _samples(self.partition.traces, loop)
            # A second split proves something only where it ran the same samples, assigned otherwise (a drop_last,
            # limit_batches, an iterable dataset or a sampler of the user's own can defeat it).
            if _same_multiset(split, ran) and [sorted(r) for r in split] != [sorted(r) for r in ran]:
                partition = [r["callback_metrics"] for r in self.partition.records]
        padded = self.padded if done(self.padded) else None
        if padded is not None and not _same_multiset(_samples(padded.traces, loop), ran):
            padded = None  # it did not run the ranks' samples with their repeats
        return Proof(
            partition=partition,
            padded=padded.records[0]["callback_metrics"] if padded else None,
            padded_logs=padded.traces[0]["logs"] if padded else None,
        )

    #: The fields holding a :class:`World` (or None), as ``to_dict`` names them.
    WORLD_FIELDS = ("single", "world", "same_weights", "first_step", "partition", "padded", "process", "one_rank_ddp")

    def to_dict(self) -> dict:
        """The worlds as JSON (each :class:`World`'s ``to_dict``, None where not run, ``stage`` and
        ``limit_batches``): the audit's recording, from which ``from_dict`` and
        ``ddpprobe.audit._pipeline.assemble`` give the same :class:`~ddpprobe.audit.AuditResult` in another
        process, without running a world. Hand-built worlds (``compared_with`` set) have none.

        Raises:
            ValueError: ``compared_with`` is set (a reference given by hand is not a recorded world)."""
        if self.compared_with is not None:
            raise ValueError("worlds with a hand-given reference (compared_with) are not recorded worlds")
        found = {name: getattr(self, name) for name in self.WORLD_FIELDS}
        return {
            "stage": self.stage,
            "limit_batches": self.limit_batches,
            **{name: None if world is None else world.to_dict() for name, world in found.items()},
        }

    @classmethod
    def from_dict(cls, found: dict) -> "Worlds":
        """The :class:`Worlds` ``to_dict`` gave."""
        worlds = {name: None if found.get(name) is None else World.from_dict(found[name]) for name in cls.WORLD_FIELDS}
        return cls(stage=found["stage"], limit_batches=found.get("limit_batches"), **worlds)

    @classmethod
    def of_records(cls, single: dict, world: list, stage: str = "validate", **fields) -> "Worlds":
        """Worlds of hand-written records (``audit_rank``'s), with traces that recorded nothing unless
        ``world_traces`` / ``single_trace`` are given; ``reference`` overrides the comparison."""
        traces = fields.pop("world_traces", None) or [empty_trace() for _ in world]
        single_trace = fields.pop("single_trace", None) or empty_trace()
        reference = fields.pop("reference", None)
        return cls(
            World([single], [single_trace], [""]),
            World(list(world), traces, [""] * len(world)),
            stage=stage,
            compared_with=reference,
            **fields,
        )

    @property
    def first_step_samples(self) -> Optional[int]:
        """How many samples the one-process first step ran (the W=N ranks' first batches together), or None."""
        if self.first_step is None:
            return None
        batches = [b for b in self.first_step.traces[0].get("batches") or [] if b.get("stage") == "train"]
        return batches[0].get("size") if batches else None

    @property
    def world_size(self) -> int:
        return len(self.world.records)

    @property
    def records(self) -> list:
        """The W=N ranks' records, ordered by rank."""
        return self.world.records

    @property
    def traces(self) -> list:
        return self.world.traces

    @property
    def collectives(self) -> list:
        """Each W=N rank's traced collectives (Python-level calls)."""
        return [t["collectives"] for t in self.traces]

    @property
    def world_logs(self) -> list:
        """Each W=N rank's ``self.log`` events."""
        return [t["logs"] for t in self.traces]

    @property
    def ended(self) -> list:
        """How each W=N rank's stage ended: ``"end"``, ``"raised"`` or None (it never finished)."""
        return [t["stage"] for t in self.traces]

    @property
    def completed(self) -> bool:
        return all(e == "end" for e in self.ended)

    @functools.cached_property
    def counts(self) -> dict:
        """``{loop: Counts}`` of the stage's loop (and ``"val"`` in ``fit``) at W=N."""
        loop = STAGE_LOOP[self.stage]
        found = {}
        for kind in [loop, "val"] if self.stage == "fit" else [loop]:
            c = counts(self.traces, self.single.traces[0], kind)
            if c is not None:
                found[kind] = c
        return found

    @functools.cached_property
    def unmoved(self) -> list:
        """The ``self.all_gather`` calls that returned non-tensor leaves unchanged (``unmoved_leaves``)."""
        return unmoved_leaves(self.traces)

    @property
    def shards(self) -> dict:
        """``{loop: [batches in each W=N rank's shard]}`` from the ranks' recorded loaders."""
        return shards_of(self.records)

    @property
    def trained_apart(self) -> bool:
        """The W=1 and W=N runs ended with different weights (``audit_rank``'s ``weights_digest``)."""
        digests = [self.single.digest, self.world.digest]
        return None not in digests and digests[0] != digests[1]

    @property
    def weights_equal(self) -> bool:
        digests = [self.single.digest, self.world.digest]
        return None not in digests and digests[0] == digests[1]

    @property
    def steps(self) -> list:
        """Optimizer steps of the W=1 and the W=N run."""
        return [self.single.records[0].get("global_step"), self.world.records[0].get("global_step")]

    @functools.cached_property
    def reference(self) -> Reference:
        """What each key is compared with: the W=1 run, or for a ``fit`` trained apart, the W=1 validation of
        the W=N weights for validation keys and nothing for training keys."""
        if self.compared_with is not None:
            return self.compared_with
        same = self.same_weights
        return Reference(
            record=self.single.records[0],
            logs=self.single.traces[0]["logs"],
            trained_apart=self.trained_apart,
            same_weights=same.records[0] if same else None,
            same_weights_logs=same.traces[0]["logs"] if same else None,
            steps=self.steps,
            weights_equal=self.weights_equal,
        )

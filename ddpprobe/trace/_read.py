"""Reading a rank's trace back: the events of its file (:func:`read_trace`) grouped (:func:`split_trace`)."""

from __future__ import annotations

import json
from typing import Optional

from ddpprobe.trace._batches import batch_samples, sample_label


def read_trace(path: str) -> list:
    """The events of a trace file, in order; a last line cut off by a killed rank is dropped."""
    events = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    except FileNotFoundError:
        pass
    return events


def _step_loop(hook: str) -> Optional[str]:
    """The loop whose batch a ``*_step`` hook is running (``"val"`` for ``validation_step``), else None."""
    if not hook.endswith("_step"):
        return None
    for part, loop in (("train", "train"), ("validation", "val"), ("test", "test"), ("predict", "predict")):
        if part in hook:
            return loop
    return None


class _Reader:
    """Folds one rank's events into :func:`split_trace`'s groups; one method per event."""

    def __init__(self):
        self.by_seq: dict = {}
        self.current: dict = {}  # loop -> the batch event it is running
        self.out = {
            "collectives": [],
            "logs": [],
            "batches": [],
            "flight_recorder": None,
            "flight_recorder_unavailable": None,
            "stage": None,
            "stage_error": None,
            "stage_error_t": None,
            "all_gathers": [],
            "gradients": [],
            "gradient_collectives": [],
            "states": [],
            "hooks": {},
            "hook_times": {},
            "files": [],
        }
        self._hooks_closed = False

    def on_collective(self, event: dict) -> None:
        entry = {k: v for k, v in event.items() if k not in ("event", "t")}
        entry["status"] = "pending"
        self.by_seq[event["seq"]] = entry
        if event.get("source") != "gradient":
            self.out["collectives"].append(entry)
        else:
            self.out["gradient_collectives"].append(entry)
            running = self.current.get("train") or {}
            entry["batch"] = [running.get("epoch"), running.get("batch_idx")]
            where = {"epoch": entry["batch"][0], "batch_idx": entry["batch"][1], "bucket": entry.get("bucket")}
            counts = self.out["gradients"]
            if counts and {k: counts[-1][k] for k in where} == where:
                counts[-1]["count"] += 1
            else:
                counts.append({**where, "count": 1})

    def on_done(self, event: dict) -> None:
        entry = self.by_seq.get(event.get("seq"))
        if entry is not None:
            entry["status"], entry["pg_seq_after"] = event["event"], event.get("pg_seq")
            if "values" in event:
                entry["values_out"] = event["values"]
            if event["event"] == "raised":
                entry["error"] = event.get("error")

    on_raised = on_done

    def on_log(self, event: dict) -> None:
        running = self.current.get(_step_loop(event.get("hook") or ""))
        samples = batch_samples([running]) if running else []
        self.out["logs"].append({**event, "batch_ids": [sample_label(s) for s in samples] or None})

    def on_file(self, event: dict) -> None:
        self.out["files"].append({k: v for k, v in event.items() if k not in ("event", "t")})

    def on_batch(self, event: dict) -> None:
        self.out["batches"].append(event)
        self.current[event.get("stage")] = event

    def on_metrics(self, event: dict) -> None:
        self.out["callback_metrics"] = event.get("values") or {}

    def on_hook(self, event: dict) -> None:
        self.out["hook_times"].setdefault(event["hook"], event.get("t"))
        if not self._hooks_closed:
            self.out["hooks"][event["hook"]] = self.out["hooks"].get(event["hook"], 0) + 1

    def on_hooks(self, event: dict) -> None:
        totals: dict = {}
        for label, n in (event.get("counts") or {}).items():
            hook = label.split(".", 1)[-1]
            totals[hook] = totals.get(hook, 0) + n
        self.out["hooks"], self._hooks_closed = totals, True

    def on_state(self, event: dict) -> None:
        self.out["states"].append({k: v for k, v in event.items() if k != "event"})

    def on_all_gather(self, event: dict) -> None:
        self.out["all_gathers"].append(event)

    def on_flight_recorder(self, event: dict) -> None:
        self.out["flight_recorder"] = event.get("entries") or []
        self.out["flight_recorder_unavailable"] = event.get("unavailable")

    def on_stage(self, event: dict) -> None:
        if event.get("status") in ("end", "raised"):
            self.out["stage"], self.out["stage_error"] = event["status"], event.get("error")
            self.out["stage_error_t"] = event.get("t") if event["status"] == "raised" else None


def split_trace(events: list) -> dict:
    """Group one rank's trace events (:func:`read_trace`): ``collectives`` (each ``collective`` event with
    ``status`` ``"done"``, ``"raised"`` (and ``error``) or ``"pending"``: entered and never left, and
    ``pg_seq_after``), ``logs`` (``log`` events; one from a ``*_step`` hook gets ``batch_ids``: the samples
    of the batch its loop was running, else None), ``batches``, ``flight_recorder`` (entries, or None when
    not written) and ``flight_recorder_unavailable``, ``stage`` (``"end"``, ``"raised"``, or None: the rank
    never finished its stage), ``stage_error``, ``callback_metrics`` (only when a ``metrics`` event was
    written), ``all_gathers`` (the ``all_gather`` events), and DDP's gradient all-reduces apart from the
    Python-level ``collectives``: ``gradient_collectives`` (the ``collective`` events of ``source``
    ``"gradient"``, each with ``status`` and ``batch``: ``[epoch, batch_idx]`` of the training batch it ran
    in) and ``gradients``, the same counted per bucket per training batch, ``[{"epoch", "batch_idx",
    "bucket", "count"}]`` in order; ``states``: the ``state`` records (ddpprobe/contract/), in order;
    ``hooks``: ``{hook: times entered}`` (a rank whose trace was cut before it closed counts 1 for each hook it
    was seen entering), ``hook_times``: ``{hook: time of its first entry}`` (seconds since the epoch), and ``files``:
    the files the rank's own code wrote (ddpprobe/trace/_files.py), in the order they were closed."""
    reader = _Reader()
    for event in events:
        handler = getattr(reader, f"on_{event.get('event')}", None)
        if handler is not None:
            handler(event)
    return reader.out

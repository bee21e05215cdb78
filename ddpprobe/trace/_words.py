"""The trace's events in words, as the audit's report and the guard's errors print them."""

from __future__ import annotations


def describe_collective(entry: dict) -> str:
    """One collective (a ``collective`` event of this trace, or an entry of the audit's sequences) in words, as
    the audit's divergence report and the guard's errors print it: ``all_reduce float32 [] (self.log epoch sync
    of 'val_loss', logged in validation_step) at module.py:12 in validation_step``; an entry without ``sync``
    (the guard's) leaves out whether it synced a step or an epoch value."""
    shape = "" if entry.get("shape") is None else f" {list(entry['shape'])}"
    text = f"{entry['op']}{(' ' + entry['dtype']) if entry.get('dtype') else ''}{shape}"
    source = entry.get("source")
    if source == "torchmetrics":
        text += f" ({entry.get('metric')} state sync at compute()"
        if entry.get("key"):
            text += f", logged as {entry['key']!r}"
        text += ")"
    elif source == "self.log":
        level = {"step": "step ", "epoch": "epoch "}.get(entry.get("sync"), "")
        text += f" (self.log {level}sync of {entry.get('key')!r}, logged in {entry.get('hook')})"
    elif source == "internal":
        text += " (not called from Python: e.g. DDP's gradient all_reduce in backward)"
    elif source == "library":
        text += f" (called by {entry.get('origin') or 'Lightning or torch'}" + (
            f", in {entry['hook']})" if entry.get("hook") else ")"
        )
    else:
        text += " (your code)"
    if entry.get("call_site"):
        text += f" at {entry['call_site']}"
    return text

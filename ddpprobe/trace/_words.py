"""The trace's events in words, as the audit's report and the guard's errors print them.

Every function here takes one ``collective`` event (or an entry built from one: the audit's sequences,
the guard's posts) and leaves out what the entry does not know, so no sentence has a hole: no ``None``,
no empty name, no article without its noun (checked by tests/tooling/trace/test_trace_words.py).
"""

from __future__ import annotations

import re
from typing import Optional


def describe_collective(entry: dict, calls: bool = False) -> str:
    """One collective (a ``collective`` event of this trace, or an entry of the audit's sequences) in words, as
    the audit's divergence report and the guard's errors print it: ``all_reduce float32 [] (self.log epoch sync
    of 'val_loss', logged in validation_step) at module.py:12 in validation_step``; an entry without ``sync``
    (the guard's) leaves out whether it synced a step or an epoch value.

    With ``calls``, the library call the user's line made is named after the line (the entry's ``call``,
    ``call_kind``), or, for a collective Lightning makes on its own, its loop step (``loop_step``):
    ``barrier (self.log epoch sync of 'v', logged in training_step) at m.py:34 in on_train_epoch_end, run
    by reading `Trainer.callback_metrics```; ``barrier at m.py:20 in validation_step, run by
    `DDPStrategy.barrier()```; ``barrier (self.log epoch sync of 'v', logged in training_step) at m.py:12
    in training_step, run by Lightning's `_FitLoop.on_advance_end```."""
    shape = "" if entry.get("shape") is None else f" {list(entry['shape'])}"
    text = f"{entry.get('op') or ''}{(' ' + entry['dtype']) if entry.get('dtype') else ''}{shape}"
    source = entry.get("source")
    inner = []
    if source == "torchmetrics":
        metric = f"{entry['metric']} state sync" if entry.get("metric") else "a Metric's state sync"
        inner.append(f"{metric} at compute()" + (f", logged as {entry['key']!r}" if entry.get("key") else ""))
    elif source == "self.log":
        level = {"step": "step ", "epoch": "epoch "}.get(entry.get("sync"), "")
        key = f" of {entry['key']!r}" if entry.get("key") else ""
        logged = f", logged in {entry['hook']}" if entry.get("hook") else ""
        inner.append(f"self.log {level}sync{key}{logged}")
    elif source == "gradient":
        inner.append(_gradient_words(entry))
    elif source == "internal":
        inner.append("not called from Python: e.g. DDP's gradient all_reduce in backward")
    elif source == "library" and not (calls and entry.get("loop_step")):
        origin = entry.get("origin") or "Lightning or torch"
        inner.append(f"called by {origin}" + (f", in {entry['hook']}" if entry.get("hook") else ""))
    chain = _run_by(entry) if calls else ""
    if source not in ("torchmetrics", "self.log", "gradient", "internal", "library") and not chain:
        inner.append("your code")
    if inner:
        text += f" ({'; '.join(inner)})"
    if entry.get("call_site"):
        text += f" at {entry['call_site']}"
    return (text + (f", {chain}" if chain else "")).strip()  # no op (the audit words a place alone): no space


def describe_call(entry: dict, where: Optional[str] = None) -> str:
    """The call chain of one collective as a sentence: who made the call, and what it runs; ``where``
    (``"on rank 0 only"``) is added after what it runs.

    - ``line 34 of module.py (on_train_epoch_end) reads `Trainer.callback_metrics`, which runs the epoch
      sync of 'train_v' (all_reduce) on rank 0 only`` (the user's line made a library call);
    - ``line 20 of module.py (validation_step) calls `torch.distributed.all_reduce()` on rank 0 only``;
    - ``Lightning's `_AutomaticOptimization.backward_fn` (in backward) runs DistributedDataParallel's gradient
      all_reduce of bucket 0`` (a collective Lightning makes on its own; a logged key's sync
      adds where the key was logged: ``, for the value logged at module.py:12 in validation_step``);
    - ``torch/nn/parallel/distributed.py:1580 in _sync_buffers runs a broadcast`` (no call chain known).
    """
    what = _what(entry)
    tail = f" {where}" if where else ""
    site = _site_words(entry.get("call_site"))
    call = entry.get("call")
    if entry.get("callback"):
        return _callback_words(entry, what, tail, site)
    if call and site:
        verb = "reads" if entry.get("call_kind") == "property" else "calls"
        name = call if entry.get("call_kind") == "property" else f"{call}()"
        if entry.get("call_kind") == "function" and call.startswith("torch.distributed."):
            return f"{site} {verb} `{name}`{tail}"
        return f"{site} {verb} `{name}`, which runs {what}{tail}"
    running = f" (in {entry['running']})" if entry.get("running") else ""
    if entry.get("loop_step"):
        subject = f"Lightning's `{entry['loop_step']}`{running}"
    elif site:  # a call site but no call: a synced key placed at its logging line
        subject = f"{site}"
    elif entry.get("origin"):
        subject = f"{entry['origin']}{running}"
    else:
        subject = f"Lightning or torch{running}"
    logged = ""
    if entry.get("loop_step") and entry.get("key") and entry.get("call_site"):
        logged = f", for the value logged at {entry['call_site']}"
    return f"{subject} runs {what}{logged}{tail}"


def _callback_words(entry: dict, what: str, tail: str, site: Optional[str]) -> str:
    """``describe_call`` of a collective made in a ``Callback``'s hook: ```TQDMProgressBar.on_train_epoch_end`
    reads `Trainer.progress_bar_metrics`, which runs the epoch sync of 'v' (all_reduce), for the value logged
    at m.py:12 in training_step`` (a library callback Lightning's loop ran); ``line 9 of cb.py
    (`MyCallback.on_train_epoch_end`) calls `DDPStrategy.barrier()`, which runs a barrier`` (a user's
    callback: its line)."""
    callback, call, kind = entry["callback"], entry.get("call"), entry.get("call_kind")
    own = entry.get("loop_step") or not site  # Lightning's loop ran a library callback: no line of the user's
    if own:
        subject = f"`{callback}`"
    else:
        found = re.match(r"^line (\d+) of (.+) \(.+\)$", site)
        subject = f"line {found.group(1)} of {found.group(2)} (`{callback}`)" if found else f"{site} (`{callback}`)"
    logged = f", for the value logged at {entry['call_site']}" if own and entry.get("key") and site else ""
    if not call:
        return f"{subject} runs {what}{logged}{tail}"
    verb = "reads" if kind == "property" else "calls"
    name = call if kind == "property" else f"{call}()"
    if kind == "function" and call.startswith("torch.distributed."):
        return f"{subject} {verb} `{name}`{tail}"
    return f"{subject} {verb} `{name}`, which runs {what}{logged}{tail}"


def _made_call(call: str, kind: Optional[str]) -> str:
    """``reading `Trainer.progress_bar_metrics``` / ``calling `DDPStrategy.broadcast()```."""
    return f"reading `{call}`" if kind == "property" else f"calling `{call}()`"


def _what(entry: dict) -> str:
    """What a collective does, as the object of "runs": ``the epoch sync of 'v' (all_reduce)``,
    ``MeanMetric's state sync (all_gather)``, ``a barrier``."""
    op = entry.get("op") or "collective"
    source = entry.get("source")
    if source == "self.log":
        level = {"step": "step ", "epoch": "epoch "}.get(entry.get("sync"), "")
        key = f" of {entry['key']!r}" if entry.get("key") else " of a logged value"
        return f"the {level}sync{key} ({op})"
    if source == "torchmetrics":
        metric = f"{entry['metric']}'s" if entry.get("metric") else "a Metric's"
        logged = f", logged as {entry['key']!r}" if entry.get("key") else ""
        return f"{metric} state sync ({op}{logged})"
    if source == "gradient":
        return _gradient_words(entry)
    return f"{_article(op)} {op}"


def _run_by(entry: dict) -> str:
    """``run by reading `Trainer.callback_metrics``` / ``run by `DDPStrategy.barrier()``` / ``run by
    Lightning's `_FitLoop.on_advance_end```; empty where the entry names no call chain, or the user's line
    calls ``torch.distributed`` itself."""
    call, kind = entry.get("call"), entry.get("call_kind")
    if entry.get("callback"):
        return f"run by `{entry['callback']}`" + (f" {_made_call(call, kind)}" if call else "")
    if call and entry.get("call_site"):
        if kind == "function" and call.startswith("torch.distributed."):
            return ""
        return f"run by reading `{call}`" if kind == "property" else f"run by `{call}()`"
    if entry.get("loop_step"):
        return f"run by Lightning's `{entry['loop_step']}`" + (
            f" in {entry['running']}" if entry.get("running") else ""
        )
    return ""


def _gradient_words(entry: dict) -> str:
    """``DistributedDataParallel's gradient all_reduce of bucket 0`` (``, through the comm hook my_hook`` for
    a user's own hook)."""
    bucket = entry.get("bucket")
    which = f" of bucket {bucket}" if isinstance(bucket, int) else ""
    hook = f", through the comm hook {entry['comm_hook']}" if entry.get("comm_hook") else ""
    return f"DistributedDataParallel's gradient {entry.get('op') or 'all_reduce'}{which}{hook}"


def _site_words(call_site: Optional[str]) -> Optional[str]:
    """``"line 34 of module.py (on_train_epoch_end)"`` from ``"module.py:34 in on_train_epoch_end"``."""
    if not call_site:
        return None
    found = re.match(r"^(.*):(\d+) in (.+)$", call_site)
    if not found:
        return call_site
    return f"line {found.group(2)} of {found.group(1)} ({found.group(3)})"


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"

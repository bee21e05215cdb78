"""No sentence with a hole: every kind of trace entry, with and without a Python call site, a key, a hook,
a metric, a call chain or a gradient bucket, is worded without ``None``, an empty name or an article (or a
preposition) left without its noun.

Fed to the trace's phrase functions (ddpprobe/trace/_words.py ``describe_collective``, ``describe_call``)
and to the guard's messages (ddpprobe/guard/_entries.py: each rank's side, the sides side by side, the
consequence with its fix lines), over the product of the fields' values, including the empty ones a
rank can record: a collective made from C++ has no call site, a sync in the loop no user's call, a
collective of the user's no key.
"""

import functools
import itertools
import re

from ddpprobe.guard import _entries
from ddpprobe.trace import describe_call, describe_collective

#: A hole: ``None``, an empty quoted name, empty brackets, an article or preposition before punctuation or
#: at the end, doubled spaces, a comma or semicolon that opens a bracket.
HOLES = (
    (r"\bNone\b", "None"),
    (r"''|\"\"|``", "an empty quoted name"),
    (r"(?<!\w)\(\s*\)|\[\s*\]|`\s*`", "empty brackets (a call's ``()`` aside)"),
    (r"\b(a|an|the|of|in|at|by|from|as|through)\s*([,.;:)\]]|$)", "a dangling article or preposition"),
    (r"\b(a|an|the) (a|an|the|of|in|at)\b", "an article without its noun"),
    (r"\S {2,}\S", "doubled spaces"),
    (r"\([,;]|[,;]\)", "punctuation opening or closing a bracket"),
)

SOURCES = ("self.log", "torchmetrics", "user", "library", "internal", "gradient", None)
CALLS = (
    {},
    {"call": "Trainer.callback_metrics", "call_kind": "property"},
    {"call": "DDPStrategy.barrier", "call_kind": "method"},
    {"call": "torch.distributed.all_reduce", "call_kind": "function"},
    {"loop_step": "_FitLoop.on_advance_end"},
)
OPTIONAL = {
    "key": (None, "", "val_loss"),
    "hook": (None, "validation_step"),
    "running": (None, "on_train_epoch_end"),
    "metric": (None, "MeanMetric"),
    "call_site": (None, "", "module.py:12 in validation_step"),
    "sync": (None, "epoch"),
    "bucket": (None, 0),
    "comm_hook": (None, "my_hook"),
}
SHAPES = ({"op": "all_reduce", "dtype": "float32", "shape": []}, {"op": "barrier"}, {"op": None, "dtype": ""})


def entries():
    """Every combination of the fields' values (the empty ones included), as a trace event would hold them."""
    names = list(OPTIONAL)
    for source, call, shape, values in itertools.product(
        SOURCES, CALLS, SHAPES, itertools.product(*(OPTIONAL[n] for n in names))
    ):
        yield {"source": source, "origin": None, **shape, **call, **dict(zip(names, values))}


def _holes(text: str) -> list:
    return list(_holes_of(text))


@functools.lru_cache(maxsize=None)
def _holes_of(text: str) -> tuple:
    """:func:`_holes`, looked up once per distinct sentence (the entries' combinations word many alike)."""
    text = re.sub(r"\b(u?int\d+|float\d+|bfloat16|bool) \[\]", r"\1 [scalar]", text)  # a scalar's shape is []
    return tuple(what for pattern, what in HOLES if re.search(pattern, text))


def test_the_trace_phrases_have_no_hole_for_any_entry():
    """``describe_collective`` (with and without the call chain) and ``describe_call`` (with and without
    where it ran) over every combination: no hole in any sentence."""
    checked = 0
    for entry in entries():
        for text in (
            describe_collective(entry),
            describe_collective(entry, calls=True),
            describe_call(entry),
            describe_call(entry, "on rank 0 only"),
        ):
            assert not _holes(text), f"{_holes(text)} in {text!r} from {entry}"
            checked += 1
    assert checked > 10_000, checked


def test_the_guards_messages_have_no_hole_for_any_entry():
    """Each entry as the guard posts it, paired with a peer at a hook boundary and with a peer at another
    collective: the ranks' sides and the consequence with its fix lines have no hole."""
    boundary = _entries.boundary(3, 1, "on_train_batch_end", 0, 2, 0, None)
    peer = _entries.collective(3, 1, {"op": "all_gather", "dtype": "float32", "shape": [2], "source": "user"})
    for entry in itertools.islice(entries(), 0, None, 13):
        mine = _entries.collective(3, 0, dict(entry, group_size=2, root=None))
        for pair in ([mine, boundary], [mine, peer]):
            text = _entries.sides_text(pair) + "\n" + _entries.consequence(pair, 10.0)
            assert not _holes(text), f"{_holes(text)} in {text!r} from {entry}"


def test_the_hole_patterns_find_the_holes_of_the_old_wording():
    """The patterns catch what the old wording printed (so the two tests above can fail): a key of None,
    a call site of None, and the audit's sentence about a collective without a Python call site."""
    assert _holes("all_reduce (self.log sync of None, logged in None)")
    assert _holes("what each rank logged in None after it")
    assert _holes("runs a  barrier") and _holes("calls `` at") and _holes("the epoch sync of ''")
    assert _holes("run by Lightning's `_FitLoop.step` in )") and _holes("runs the")

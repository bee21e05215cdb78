"""No sentence with a hole in the audit's report: every kind of trace entry, with and without a Python call
site, a key, a hook, a metric, a call chain or a gradient bucket, is worded without ``None``, an empty name
or an article (or a preposition) left without its noun, by the audit's functions that word the ranks'
collectives (the audit half of test_trace_words.py; the same hole patterns).

Fed, for each entry, to the worlds in which the audit words it:

- ``first_divergence`` (ddpprobe/audit/evidence/_sequences.py): the divergence's message, where the entry is on
  some ranks only (``_missing``, also as the last collective of a rank that never entered the next),
  against a collective of another op or shape (``_mismatch``), against a ``self.log`` sync of another key
  (``_keys``) or of another purpose (``_purpose``);
- ``diagnose`` (ddpprobe/audit/evidence/_culprit.py): the culprit's explanation (``culprit``, ``_alone_hazard``,
  ``_pairing``, ``_uneven_calls``, a count that follows the ranks' shards);
- ``_trace_section`` (ddpprobe/audit/report/_format.py): the report's trace section, the divergence with its
  explanation and its fix or no-fix line;
- the lone reads of the logged metrics (``lone_reads``): ``read_cause`` (_format.py) and the finding
  ``findings`` (ddpprobe/audit/causes/_findings.py) words for them.

The whole report is checked in one test, and ``_uneven_calls``, ``_alone_hazard``'s registry cause,
``read_cause`` and the lone read's finding each also on its own, over every entry that reaches it: a field an
entry lacks is worded by what is known (``a collective not called from Python``, ``torchmetrics.Metric``,
``self.log(...)``, ``the epoch sync of the logged metrics``), never left as a hole.
"""

import itertools
import re
import types

import pytest

from ddpprobe.audit.causes._findings import findings
from ddpprobe.audit.evidence import _culprit
from ddpprobe.audit.evidence._culprit import diagnose
from ddpprobe.audit.evidence._sequences import first_divergence, lone_reads, sequence
from ddpprobe.audit.report import _format
from ddpprobe.audit.report._format import read_cause
from tests.tooling.trace.test_trace_words import CALLS, _holes

SOURCES = ("self.log", "torchmetrics", "user", "library", "internal", "gradient", None)
OPTIONAL = {
    "key": (None, "", "val_loss"),
    "hook": (None, "validation_step"),
    "running": (None, "on_validation_epoch_end"),
    "metric": (None, "MeanMetric"),
    "call_site": (None, "", "module.py:12 in validation_step"),
    "sync": (None, "epoch"),
    "bucket": (None, 0),
    "origin": (None, "torch/nn/parallel/distributed.py:1580 in _sync_buffers"),
    "callback": (None, "TQDMProgressBar.on_validation_epoch_end"),
}
#: Every trace collective has an op (the wrapped function's name); dtype and shape where it has a tensor.
SHAPES = ({"op": "all_reduce", "dtype": "float32", "shape": []}, {"op": "barrier"})
#: Every n-th combination (about 3,000 entries, each worded in the scenarios below).
STEP = 23


def entries():
    """Combinations of the fields' values (the empty ones included), as the trace records a collective."""
    names = list(OPTIONAL)
    combos = itertools.product(SOURCES, CALLS, SHAPES, itertools.product(*(OPTIONAL[n] for n in names)))
    for source, call, shape, values in itertools.islice(combos, 0, None, STEP):
        yield {"source": source, "status": "done", **shape, **call, **dict(zip(names, values))}


def _rank(collectives: list, stage="end", batches=(), logs=()) -> dict:
    """One rank's split trace, as ``ddpprobe.trace.split_trace`` gives it to the audit."""
    return {
        "collectives": collectives,
        "stage": stage,
        "stage_error": None if stage != "raised" else "RuntimeError: boom",
        "flight_recorder": None,
        "flight_recorder_unavailable": None,
        "batches": list(batches),
        "logs": list(logs),
    }


def _other(entry: dict, **change) -> dict:
    return dict(entry, **change)


def _log_sync(key: str, op="all_reduce") -> dict:
    return {
        "op": op,
        "dtype": "float32",
        "shape": [],
        "source": "self.log",
        "key": key,
        "hook": "validation_step",
        "sync": "epoch",
        "call_site": "module.py:12 in validation_step",
        "status": "done",
    }


def _batches(n: int) -> list:
    return [{"stage": "val", "batch_idx": i, "epoch": 0} for i in range(n)]


def worlds(entry: dict):
    """``(name, world)``: the two-rank worlds in which the audit words ``entry``."""
    other_op = "all_gather" if entry["op"] != "all_gather" else "broadcast"
    log = [{"key": "val_loss", "hook": entry.get("hook") or "validation_step", "value": 0.5}]
    yield "on rank 0 only, rank 1 finished", [_rank([entry]), _rank([])]
    yield "on rank 0 only, rank 1 stopped", [_rank([entry]), _rank([], stage=None)]
    yield (
        "rank 1's last before the missing one",
        [_rank([entry, _log_sync("step_loss")]), _rank([entry], stage="raised")],
    )
    yield "against another op", [_rank([entry]), _rank([_other(entry, op=other_op, dtype="float32", shape=[2])])]
    yield "against another key", [_rank([entry, entry]), _rank([_log_sync("other_loss", entry["op"]), entry])]
    yield "against another purpose", [_rank([entry]), _rank([_log_sync("val_loss", entry["op"])])]
    yield "twice on rank 0", [_rank([entry, entry], logs=log), _rank([entry], logs=log)]
    yield (
        "one call syncs more",
        [_rank([entry, entry, _log_sync("step_loss")], logs=log), _rank([entry, _log_sync("step_loss")] * 2)],
    )
    yield (
        "per batch on uneven shards",
        [_rank([entry] * 3, batches=_batches(3)), _rank([entry] * 2, batches=_batches(2))],
    )


def _report(world: list, stage="validate", findings_too=True, report_too=True) -> list:
    """Every text the audit words from ``world``'s collectives: the divergence, its diagnosis, the trace
    section, and the lone reads' cause and finding."""
    sequences = [sequence(rank, False) for rank in world]
    ended = [rank["stage"] for rank in world]
    texts = []
    divergence = first_divergence(sequences, ended)
    if divergence is not None:
        texts.append(divergence["message"])
        divergence["diagnosis"] = diagnose(
            divergence, world, sequences, stage, {"val": [len(r["batches"]) for r in world]}
        )
        texts.append(divergence["diagnosis"]["explanation"])
    reads = lone_reads(world)
    texts += [_format.read_cause(read) for read in reads] if report_too else []
    trace = {"level": "python", "ranks": world, "first_divergence": divergence, "lone_reads": reads}
    result = types.SimpleNamespace(
        trace=trace,
        world_size=len(world),
        world_error=None,
        rows=[],
        experiment_rows=[],
        callbacks=[],
        counts={},
        stage=stage,
        raised={"single": None, "world": [None] * len(world)},
    )
    texts += _format._trace_section(result) if report_too else []
    if not report_too:
        texts = []
    for finding in findings(result) if findings_too else []:
        texts += [finding["problem"], *finding["consequences"]]
    return [t for t in texts if t]


#: An article before words that are no noun: a participle or an owner (``the culprit is the not called from
#: Python``, ``the your code``), where an entry's words stand as the culprit's name.
NO_NOUN = re.compile(r"\b(a|an|the) (not|called|your)\b")


def _audit_holes(text: str) -> list:
    return _holes(text) + (["an article before no noun"] if NO_NOUN.search(text) else [])


def _holes_in(texts, where: str) -> list:
    return [f"{_audit_holes(t)} in {t!r} ({where})" for t in texts if _audit_holes(t)]


@pytest.fixture
def one_line(monkeypatch):
    """The report with each sentence on one line (a line the wrap breaks after ``a`` is no hole)."""
    monkeypatch.setattr(_format, "_wrap", lambda text, indent: [indent + text])


def test_the_audits_words_have_no_hole_for_any_entry(one_line):
    """Each entry, in each world of :func:`worlds`: no sentence of the divergence, its explanation or the
    report's trace section has a hole."""
    checked = 0
    for entry in entries():
        for name, world in worlds(entry):
            texts = _report(world, findings_too=False)
            holes = _holes_in(texts, f"{name}, from {entry}")
            assert not holes, holes[0]
            checked += len(texts)
    assert checked > 20_000, checked


def _diagnoses():
    """``(name, world, sequences, found)`` of every world with a culprit."""
    for entry in entries():
        for name, world in worlds(entry):
            sequences = [sequence(rank, False) for rank in world]
            divergence = first_divergence(sequences, [rank["stage"] for rank in world])
            if divergence is None:
                continue
            found = _culprit.culprit(divergence, sequences, [r["stage"] for r in world], [r["logs"] for r in world])
            if found is not None:
                yield f"{name}, from {entry}", world, sequences, found


def test_one_call_that_syncs_a_different_number_of_times_is_worded_without_a_hole():
    """``_uneven_calls`` on every culprit whose ranks made it in runs of different lengths."""
    holes, checked = [], 0
    for where, world, sequences, found in _diagnoses():
        if len({len(b) for b in found["bursts"]}) == 1 and len({tuple(b) for b in found["bursts"]}) > 1:
            holes += _holes_in([_culprit._uneven_calls(found, world, sequences)], where)
            checked += 1
    assert checked > 500, checked
    assert not holes, f"{len(holes)} holes, the first: {holes[0]}"


def test_a_collective_some_ranks_skip_is_worded_without_a_hole():
    """``_alone_hazard``'s cause (the registry's template with the entry's fields) for every culprit."""
    holes, checked = [], 0
    for where, _, _, found in _diagnoses():
        name, cause, _ = _culprit._alone_hazard(found["entry"], found["ranks"])
        if name:
            holes += _holes_in([cause], where)
            checked += 1
    assert checked > 500, checked
    assert not holes, f"{len(holes)} holes, the first: {holes[0]}"


def _reads():
    for entry in entries():
        for name, world in worlds(entry):
            for read in lone_reads(world):
                yield f"{name}, from {entry}", world, read


def test_a_lone_read_of_the_logged_metrics_is_worded_without_a_hole():
    holes = [h for where, _, read in _reads() for h in _holes_in([read_cause(read)], where)]
    assert not holes, f"{len(holes)} holes, the first: {holes[0]}"


def test_the_finding_of_a_lone_read_is_worded_without_a_hole():
    holes = []
    for where, world, _ in _reads():
        holes += _holes_in(_report(world, report_too=False), where)
    assert not holes, f"{len(holes)} holes, the first: {holes[0]}"


def test_every_scenario_words_a_divergence_or_a_lone_read():
    """The worlds of :func:`worlds` reach the audit's words (so the test above can fail): every world of an
    entry with a key and a call site gives a divergence message or a lone read's finding, and together
    they reach a culprit, a registry cause, a pairing and a lone read."""
    entry = {
        **_log_sync("val_loss"),
        "call": "Trainer.callback_metrics",
        "call_kind": "property",
        "running": "on_validation_epoch_end",
        "call_site": "module.py:30 in on_validation_epoch_end",
    }
    said = []
    for name, world in worlds(entry):
        texts = _report(world)
        assert any(t.startswith("collective #") or "alone read the logged metrics" in t for t in texts), (
            f"{name}: {texts}"
        )
        said += texts
    joined = "\n".join(said)
    for words in ("the culprit is", "at the divergence", "reads `Trainer.callback_metrics`", "alone read the logged"):
        assert words in joined, f"{words!r} not in:\n{joined}"


@pytest.mark.parametrize(
    "text",
    [
        "the culprit is the : every rank made this call",
        "rank 0's all_reduce float32 [] (self.log sync of None) at None",
        "running the epoch sync of None on those ranks only",
        "the culprit is the not called from Python: e.g. DDP's gradient all_reduce in backward",
    ],
)
def test_the_hole_patterns_find_the_holes_an_audit_sentence_can_have(text):
    assert _audit_holes(text), text

"""The DDP contract (ddpprobe/contract/): the table's rows name facts that exist, ``breaks`` finds the first field
that must be equal and is not (and nothing else), ``compare_first_step`` tells equal, scaled and different
gradients apart, and ``snapshot`` records the documented schema, a field it cannot read as such.

``breaks`` and ``compare_first_step`` are functions of records: tested here on records written by hand."""

from __future__ import annotations

import ast
import os
import sys

import pytest

from ddpprobe import contract
from tests.support import generated_docs

pytestmark = pytest.mark.not_a_fact("tests the contract's table and comparisons, not a fact about DDP")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _defined_tests(path: str) -> set:
    with open(os.path.join(REPO, path), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


ROWS = [
    *contract.CONTRACT.values(),
    contract.SINGLE_PROCESS_STEP,
    contract.SINGLE_PROCESS_SCHEDULE,
    contract.SINGLE_PROCESS_FILES,
]


@pytest.mark.parametrize("fact", sorted({f for row in ROWS for f in row.facts}))
def test_every_fact_a_contract_row_names_is_a_test_of_tests_facts(fact):
    path, _, name = fact.partition("::")
    assert path.startswith("tests/facts/"), fact
    assert name in _defined_tests(path), f"{name} is not defined in {path}"


def test_every_row_has_a_fact_and_says_what_ddp_and_lightning_do_with_its_field():
    for row in ROWS:
        assert row.facts and row.keeps_it, row.name
        assert row.rule in (contract.EQUAL, contract.MAY_DIFFER), row.name
        assert row.rule == contract.MAY_DIFFER or row.boundaries, row.name


@pytest.mark.parametrize(
    "path, row",
    [
        ("param.layer.weight", "parameters"),
        ("buffer.bn.running_mean", "normalisation statistics"),
        ("buffer.total_seen", "buffers"),
        ("optimizer[0].group[0].lr", "optimizer settings"),
        ("scheduler[0].last_epoch", "LR schedulers"),
        ("trainer.global_step", "Trainer counters"),
        ("callback.ModelCheckpoint.best_model_path", "the best checkpoint's path"),
        ("callback.EarlyStopping.wait_count", "callback state"),
        ("module.attr.threshold", "module attributes"),
        ("loader.val[0].dataset", "datasets"),
    ],
)
def test_each_field_kind_has_its_row(path, row):
    assert contract.row_for(path).name == row


def _record(boundary: str, step: int, **fields) -> dict:
    hooks = {"setup": "setup", "start": "on_fit_start", "train_batch_end": "on_train_batch_end", "end": "on_fit_end"}
    return {"boundary": boundary, "hook": hooks[boundary], "step": step, "epoch": 0, "fields": fields}


def _run(per_rank_lr: list, per_rank_weight_after: list, buffer_after: list = None) -> list:
    """Two-boundary runs: ``start`` with each rank's lr and equal weights, then ``train_batch_end``."""
    return [
        [
            _record("start", 0, **{"optimizer[0].group[0].lr": lr, "param.w": {"digest": "a"}}),
            _record(
                "train_batch_end",
                1,
                **{
                    "optimizer[0].group[0].lr": lr,
                    "param.w": {"digest": w},
                    "buffer.bn.running_mean": {"digest": (buffer_after or ["b"] * 9)[r]},
                },
            ),
        ]
        for r, (lr, w) in enumerate(zip(per_rank_lr, per_rank_weight_after))
    ]


def test_the_first_field_that_breaks_is_the_root_and_later_breaks_name_it():
    found = contract.breaks(_run([0.1, 0.2], ["x", "y"]))

    assert [(b.field, b.boundary, b.root) for b in found] == [
        ("optimizer[0].group[0].lr", "start", None),
        ("param.w", "train_batch_end", "optimizer[0].group[0].lr"),
    ]
    assert found[0].per_rank == [0.1, 0.2] and found[0].hook == "on_fit_start" and found[0].step == 0


def test_equal_fields_and_fields_that_may_differ_there_break_nothing():
    """BatchNorm's running statistics may differ after a training batch (each rank's forward updates its own)."""
    assert contract.breaks(_run([0.1, 0.1], ["x", "x"], buffer_after=["b0", "b1"])) == []


def test_another_buffer_that_differs_after_a_batch_breaks_the_contract():
    runs = _run([0.1, 0.1], ["x", "x"])
    for r, rank in enumerate(runs):
        rank[1]["fields"]["buffer.total_seen"] = {"digest": f"t{r}"}
    assert [(b.field, b.boundary) for b in contract.breaks(runs)] == [("buffer.total_seen", "train_batch_end")]


def test_an_attribute_one_rank_set_and_another_never_did_differs_but_a_missing_parameter_does_not():
    runs = _run([0.1, 0.1], ["x", "x"])
    runs[0][0]["fields"]["module.attr.class_weights"] = {"digest": "w"}
    runs[1][0]["fields"]["module.attr.other"] = None
    found = [(b.field, b.per_rank) for b in contract.breaks(runs)]
    assert found == [
        ("module.attr.class_weights", [{"digest": "w"}, contract.MISSING]),
        ("module.attr.other", [contract.MISSING, None]),
    ]


def test_a_value_a_rank_could_not_read_or_does_not_have_is_no_difference():
    runs = _run([0.1, 0.1], ["x", "x"])
    runs[1][1]["fields"]["param.w"] = {"unreadable": "RuntimeError: boom"}
    del runs[0][1]["fields"]["optimizer[0].group[0].lr"]
    assert contract.breaks(runs) == []


def test_ranks_with_different_numbers_of_records_are_compared_where_both_have_one():
    runs = _run([0.1, 0.1], ["x", "x"])
    runs[0].append(_record("train_batch_end", 2, **{"param.w": {"digest": "only rank 0"}}))
    assert contract.breaks(runs) == []
    assert len(contract.aligned(runs)) == 2


def _first(grads: dict, reason=None) -> dict:
    return {"fields": {f"grad.{k}": {"head": v} for k, v in grads.items()}, "not_comparable": reason}


@pytest.mark.parametrize(
    "world, status, ratio",
    [
        ({"w": [1.0, -2.0], "b": [0.5]}, "equal", 1.0),
        ({"w": [0.5, -1.0], "b": [0.25]}, "scaled", 0.5),
        ({"w": [0.5, -1.0], "b": [0.5]}, "differs", None),
        ({"w": [1.0, 2.0], "b": [0.5]}, "differs", None),
    ],
)
def test_the_first_step_is_equal_scaled_or_different(world, status, ratio):
    single = _first({"w": [1.0, -2.0], "b": [0.5]})
    got = contract.compare_first_step(_first(world), single, world_size=2)
    assert got.status == status
    if ratio is not None:
        assert got.ratio == pytest.approx(ratio)
    if status == "differs":
        assert got.parameters


def test_a_module_that_draws_or_uses_batch_statistics_is_not_compared():
    got = contract.compare_first_step(_first({"w": [1.0]}, "drop (Dropout, p=0.5) draws"), _first({"w": [9.0]}), 2)
    assert (got.status, got.reason) == ("not comparable", "drop (Dropout, p=0.5) draws")
    missing = contract.compare_first_step(None, _first({"w": [1.0]}), 2)
    assert missing.status == "not recorded" and "distributed run" in missing.reason


def test_not_comparable_reason_names_dropout_and_batchnorm_but_not_a_module_in_eval_mode():
    import torch

    assert "Dropout" in contract.not_comparable_reason(torch.nn.Sequential(torch.nn.Dropout(0.1)))
    assert "BatchNorm1d" in contract.not_comparable_reason(torch.nn.Sequential(torch.nn.BatchNorm1d(3)))
    assert contract.not_comparable_reason(torch.nn.Sequential(torch.nn.Dropout(0.1)).eval()) is None
    assert contract.not_comparable_reason(torch.nn.Sequential(torch.nn.Dropout(0.0), torch.nn.Linear(2, 2))) is None


def test_object_value_records_values_small_tensors_and_digests():
    import torch

    assert contract.object_value(3) == 3 and contract.object_value(float("inf")) == "inf"
    small = contract.object_value(torch.tensor([1.0, 2.0]))
    assert small["values"] == [1.0, 2.0] and small["shape"] == [2] and small["norm"] == pytest.approx(5**0.5)
    big = contract.tensor_value(torch.arange(100.0))
    assert "values" not in big and big["sum"] == pytest.approx(4950.0)
    assert contract.object_value([1, 2]) != contract.object_value([1, 3])
    assert contract.object_value(object()) == {"type": "object"}


def test_a_snapshot_of_a_single_process_fit_records_the_documented_fields():
    """One in-process ``fit`` step of a small module: the recorder's first record is taken at ``setup``, its
    ``first_step`` record holds the gradients, and the fields of every kind of the schema are there."""
    import torch

    from ddpprobe._lightning import pl

    records = []

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.threshold = 0.5

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    data = torch.utils.data.TensorDataset(torch.ones(4, 2))
    trainer = pl.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[contract.state_recorder(records.append)],
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))

    boundaries = [r["boundary"] for r in records]
    assert boundaries[:2] == ["setup", "start"] and "first_step" in boundaries and boundaries[-1] == "end"
    start = records[1]["fields"]
    assert start["optimizer[0].group[0].lr"] == 0.1 and start["optimizer[0].group[0].momentum"] == 0.9
    assert start["optimizer[0].group[0].params"] == ["layer.weight", "layer.bias"]
    assert start["module.attr.threshold"] == 0.5 and "module.attr.training" not in start
    assert start["param.layer.weight"]["shape"] == [1, 2] and start["trainer.global_step"] == 0
    batch_end = next(r for r in records if r["boundary"] == "train_batch_end")["fields"]
    assert batch_end["loader.train[0].dataset"]["len"] == 4  # the loaders are built after on_fit_start
    first = next(r for r in records if r["boundary"] == "first_step")
    assert first["fields"]["grad.layer.bias"]["values"] == [2.0]


DOC = os.path.join(REPO, "docs", "audit.md")


def table() -> str:
    """docs/audit.md's table of the contract's rows (rewrite it with
    ``python -m tests.tooling.contract.test_contract --write``)."""
    lines = [
        "| row | fields | equal on every rank | what DDP and Lightning do | shown by |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in ROWS:
        patterns = (row.pattern,) if isinstance(row.pattern, str) else row.pattern
        where = "may differ" if row.rule == contract.MAY_DIFFER else ", ".join(row.boundaries)
        facts = "<br>".join(f"`{os.path.basename(f.partition('::')[0])}::{f.partition('::')[2]}`" for f in row.facts)
        lines.append(f"| {row.name} | {', '.join(f'`{p}`' for p in patterns)} | {where} | {row.keeps_it} | {facts} |")
    return "\n".join(lines)


def _upstream_markers(fact: str) -> list:
    """The ``tests.support.upstream`` markers the fact's test function wears (``FLOORED_COUNT_BUG`` ...), read from
    its source: a ``..._BUG`` marker is a strict xfail that asserts the correct value, which Lightning does not give."""
    path, _, name = fact.partition("::")
    tree = ast.parse(open(os.path.join(REPO, path), encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return [
                d.attr
                for d in node.decorator_list
                if isinstance(d, ast.Attribute) and isinstance(d.value, ast.Name) and d.value.id == "upstream"
            ]
    raise AssertionError(f"{fact}: no such test function")


@pytest.mark.parametrize("row", list(contract.CONTRACT.values()), ids=lambda r: r.name)
def test_no_row_rests_on_a_fact_that_asserts_what_lightning_does_not_do(row):
    """A row's facts show what it says: a fact wearing an upstream bug's strict xfail (``..._BUG``) asserts the
    correct value Lightning does not give today, so it cannot show a row's claim; a row may cite the bug's
    companion (``..._TODAY``, what Lightning gives) and then names the upstream issue it rests on."""
    for fact in row.facts:
        found = _upstream_markers(fact)
        assert not [m for m in found if m.endswith("_BUG")], (row.name, fact, found)
        if [m for m in found if m.endswith("_TODAY")]:
            assert "upstream issue" in row.keeps_it, (row.name, fact, "name the upstream issue the row rests on")


def test_the_table_of_the_contract_in_docs_audit_md_is_current():
    assert generated_docs.block(DOC, "contract") == table(), "docs/audit.md's contract table is stale: run --write"


if __name__ == "__main__":
    if "--write" in sys.argv:
        generated_docs.write_block(DOC, "contract", table())
    else:
        print(table())

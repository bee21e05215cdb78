"""The audit reads the files the module's own code wrote against the contract's row for files (a file the run
writes holds what one process writes there) and the registry's ``one_path_every_rank``: every rank writing its own
share to one path is that entry, with its fix; a file one rank wrote whose length is not one process's breaks the
row, with no proven fix; a file per rank, and what one process writes, are no problem. The reading is pure Python
on the traces' ``file`` events (tested here on made-up ones); two audits of modules written for it check the
report. The facts: tests/facts/test_what_ddp_keeps_equal.py."""

import pytest

from ddpprobe import contract, hazards
from ddpprobe.audit.causes._files import ONE_PATH, file_findings, file_hazards, file_lines, verdict
from ddpprobe.audit.evidence._files import EVERY_RANK, ONE_PER_RANK, SOME_RANKS, written_files
from tests.support.audit_runs import audited

pytestmark = pytest.mark.not_a_fact("tests the audit's reading of written files, not a fact about DDP")


def _write(key: str, lines: int, sha1: str, site: str = "m.py:9 in on_validation_epoch_end") -> dict:
    return {"key": key, "path": key, "mode": "w", "call_site": site, "hook": "on_validation_epoch_end",
            "size": 2 * lines, "lines": lines, "sha1": sha1}  # fmt: skip


def _traces(*per_rank: list) -> list:
    return [{"files": list(writes)} for writes in per_rank]


def test_every_rank_writing_its_own_share_to_one_path_is_the_registry_entry_with_its_fix():
    items = written_files(
        _traces([_write("./ids.txt", 8, "all")]), _traces([_write("./ids.txt", 4, "a")], [_write("./ids.txt", 4, "b")])
    )

    (item,) = items
    assert (item["pattern"], item["ranks"], item["same_as_single"]) == (EVERY_RANK, [0, 1], False)
    assert verdict(item) == ONE_PATH and file_hazards(items) == [ONE_PATH]
    (finding,) = file_findings(items)
    assert "./ids.txt" in finding["problem"] and "8 line(s)" in finding["problem"]
    assert any(text == hazards.fix_line(ONE_PATH) for _, text in file_lines(items))


def test_the_same_bytes_on_every_rank_or_other_bytes_of_one_processs_length_prove_nothing():
    """A run-info file holding the world size (the same bytes on every rank, not one process's) and a time stamp
    (other bytes on each rank, of one process's length) are no problem: the length is the evidence."""
    same = _traces([_write("./cfg.txt", 3, "x")], [_write("./cfg.txt", 3, "x")])
    stamps = _traces([_write("./t.txt", 1, "t1")], [_write("./t.txt", 1, "t2")])
    info = _traces([_write("./cfg.txt", 3, "y")])
    for single, world in ((info, same), (_traces([_write("./t.txt", 1, "t0")]), stamps)):
        (item,) = written_files(single, world)
        assert verdict(item) is None and file_findings([item]) == [], item
    assert "the same bytes on every rank" in file_lines(written_files(info, same))[0][1]


def _append(key: str, lines: int, sha1: str) -> dict:
    return dict(_write(key, lines, sha1), mode="a")


def test_appends_from_every_rank_are_compared_together_with_one_process_and_are_never_the_last_writers_share():
    """One ``open(p, "a")`` per batch on every rank: the file holds every rank's lines, so their total is compared
    with one process's, never as "the last writer's share"."""
    single = _traces([_append("./log.txt", 1, f"s{i}") for i in range(4)])
    even = [[_append("./log.txt", 1, f"r{r}{i}") for i in range(2)] for r in range(2)]
    (item,) = written_files(single, _traces(*even))
    assert item["appends"] and [c["lines"] for c in item["per_rank"]] == [2, 2]
    assert verdict(item) is None and "as many together as one process writes" in file_lines([item])[0][1]
    padded = [[_append("./log.txt", 1, f"r{r}{i}") for i in range(3)] for r in range(2)]
    (item,) = written_files(single, _traces(*padded))
    assert verdict(item) == "contract" and file_hazards([item]) == []
    assert "6 line(s) together" in file_findings([item])[0]["problem"]


def test_a_file_rank_0_alone_wrote_breaks_the_row_only_when_its_length_is_not_one_processs():
    """Other bytes of the same length (a time stamp, say) prove nothing; another number of lines does."""
    short = written_files(_traces([_write("./ids.txt", 8, "all")]), _traces([_write("./ids.txt", 4, "a")], []))
    stamped = written_files(_traces([_write("./ids.txt", 8, "t1")]), _traces([_write("./ids.txt", 8, "t2")], []))
    assert [(i["pattern"], verdict(i)) for i in short] == [(SOME_RANKS, "contract")]
    assert [(i["pattern"], verdict(i)) for i in stamped] == [(SOME_RANKS, None)]
    assert file_findings(stamped) == []


def test_a_file_per_rank_from_one_line_is_one_item_and_no_problem():
    items = written_files(
        _traces([_write("./ids_rank0.txt", 8, "all")]),
        _traces([_write("./ids_rank0.txt", 4, "a")], [_write("./ids_rank1.txt", 4, "b")]),
    )
    (item,) = items
    assert (item["pattern"], item["keys"], verdict(item)) == (
        ONE_PER_RANK,
        ["./ids_rank0.txt", "./ids_rank1.txt"],
        None,
    )
    assert file_findings(items) == [] and "no rank's write replaces another's" in file_lines(items)[0][1]


def test_files_per_rank_and_epoch_from_one_line_are_one_item_and_no_problem():
    """``val_epoch{e}_rank{r}.csv``: every rank writes at one line, no two ranks to one path."""
    per = [[_write(f"./e{e}_r{r}.csv", 4, f"{e}{r}") for e in range(2)] for r in range(2)]
    single = _traces([_write(f"./e{e}_r0.csv", 8, f"{e}") for e in range(2)])
    (item,) = written_files(single, _traces(*per))
    assert (item["pattern"], len(item["keys"]), verdict(item)) == (ONE_PER_RANK, 4, None)
    assert [c["lines"] for c in item["per_rank"]] == [8, 8] and item["single"]["lines"] == 16


def _audit(model: str):
    return audited(
        f"tests.support.audit_forms:{model}", "tests.support.audit_modules:make_ids_8", world_size=2, timeout=60.0
    )


def test_the_audit_of_rank_0_writing_its_own_ids_names_the_file_the_line_and_the_row_without_a_fix():
    """``IdFileModule("rank 0")``: rank 0 alone writes the 4 ids it validated where one process writes all 8."""
    result = _audit("make_rank_zero_file_model")

    (item,) = result.contract["files"]
    assert (item["key"], item["ranks"], item["pattern"]) == ("./val_ids.txt", [0], SOME_RANKS)
    assert [c["lines"] if c else None for c in item["per_rank"]] == [4, None] and item["single"]["lines"] == 8
    assert item["call_sites"][0].startswith("audit_forms.py:") and item["hooks"] == ["on_validation_epoch_end"]
    assert result.hazards == [] and result.exit_code == 1
    text = " ".join(result.format().split())
    assert contract.SINGLE_PROCESS_FILES.name in text and hazards.NO_FIX in text


def test_the_audit_of_one_file_per_rank_finds_no_problem():
    """``IdFileModule("per rank")``, the fix: each rank writes ``val_ids_rank<r>.txt``."""
    result = _audit("make_per_rank_file_model")

    (item,) = result.contract["files"]
    assert (item["pattern"], item["keys"]) == (ONE_PER_RANK, ["./val_ids_rank0.txt", "./val_ids_rank1.txt"])
    assert result.exit_code == 0, result.format()


def test_every_rank_writing_into_the_log_dir_rank_0_broadcast_is_one_path_every_rank():
    """``IdFileModule("log dir")``: ``trainer.log_dir`` is rank 0's folder on every rank (broadcast), which ranks
    launched together share: one path, each rank's own share, the registry's entry with its fix."""
    result = _audit("make_log_dir_file_model")

    (item,) = result.contract["files"]
    assert (item["key"], item["pattern"], item["ranks"]) == ("./val_ids.txt", EVERY_RANK, [0, 1])
    assert result.hazards == [ONE_PATH], result.format()
    assert hazards.fix_line(ONE_PATH) in " ".join(result.format().split())

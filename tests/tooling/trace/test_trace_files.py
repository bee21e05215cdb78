"""The files a rank's own code writes (ddpprobe/trace/_files.py): which path, from which line and hook, and what the
rank wrote through that file object, whatever another rank wrote to the same path. In-process, no world."""

import builtins
import hashlib
import io
import os
import sys

import pytest

from ddpprobe.trace._files import FileWrites, path_key

pytestmark = pytest.mark.not_a_fact("tests the trace's record of written files, not a fact about DDP")


def _notes(user=True, hook="on_test_epoch_end"):
    events = []
    notes = FileWrites(
        lambda event, **fields: events.append((event, fields)), lambda f: f if user else None, lambda: hook
    )
    return notes, events


def test_a_path_under_the_working_directory_is_keyed_as_every_rank_of_a_launch_names_it(tmp_path):
    """The audit gives each rank a working directory of its own; ranks launched together share one, so a path under
    it is keyed ``./<relative>`` and another path stays as it is."""
    cwd = str(tmp_path / "rank0")
    assert path_key(os.path.join(cwd, "out", "preds.csv"), cwd) == "./out/preds.csv"
    assert path_key("/data/preds.csv", cwd) == "/data/preds.csv"
    assert path_key(cwd + "-other/preds.csv", cwd) == cwd + "-other/preds.csv"


def test_a_write_records_the_path_the_line_the_hook_and_what_this_file_object_wrote(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    notes, events = _notes()
    notes.install()
    try:
        line = sys._getframe().f_lineno + 1
        with open("preds.csv", "w", encoding="utf-8") as fh:
            assert isinstance(fh, io.TextIOBase) and fh.name == "preds.csv"
            fh.write("id,pred\n")
            fh.writelines(["0,1\n", "1,0\n"])
    finally:
        notes.uninstall()

    ((event, fields),) = events
    data = b"id,pred\n0,1\n1,0\n"
    assert event == "file"
    assert fields["key"] == "./preds.csv" and fields["path"] == str(tmp_path / "preds.csv")
    assert fields["call_site"] == f"test_trace_files.py:{line} in {sys._getframe().f_code.co_name}"
    assert fields["hook"] == "on_test_epoch_end" and fields["mode"] == "w"
    assert (fields["size"], fields["lines"], fields["sha1"]) == (len(data), 3, hashlib.sha1(data).hexdigest())


def test_two_writers_of_one_path_each_record_their_own_bytes_not_the_file_on_disk(tmp_path):
    """Ranks writing one path at once: each records what it wrote, though the file on disk holds the other's too."""
    notes, events = _notes()
    notes.install()
    try:
        first, second = open(tmp_path / "ids.txt", "a"), open(tmp_path / "ids.txt", "a")
        first.write("0\n2\n")
        second.write("1\n3\n5\n")
        first.close()
        second.close()
    finally:
        notes.uninstall()

    assert [(f["size"], f["lines"]) for _, f in events] == [(4, 2), (6, 3)]
    assert (tmp_path / "ids.txt").stat().st_size == 10


def test_reads_library_opens_and_descriptors_are_not_recorded_and_open_is_restored(tmp_path):
    (tmp_path / "in.txt").write_text("x\n")
    notes, events = _notes(user=False)
    notes.install()
    try:
        with open(tmp_path / "out.txt", "w") as fh:  # no user frame: library code
            fh.write("y")
    finally:
        notes.uninstall()
    mine, mine_events = _notes()
    mine.install()
    try:
        with open(tmp_path / "in.txt") as fh:
            fh.read()
        with open(os.open(tmp_path / "fd.txt", os.O_WRONLY | os.O_CREAT), "w") as fh:
            fh.write("z")
    finally:
        mine.uninstall()
    assert events == [] and mine_events == []
    assert builtins.open is io.open and builtins.open.__module__ in ("io", "_io")


def test_a_file_the_code_never_closes_is_recorded_and_released_when_the_wrapper_goes(tmp_path):
    """``open(p, "w").write(s)`` without a close: the wrappers hold the file until the stage ends, then take themselves
    off, so the file is closed and flushed as soon as nothing else holds it; one the code still holds stays open."""
    notes, events = _notes()
    notes.install()
    try:
        open(tmp_path / "once.txt", "w").write("hello\n")
        kept = open(tmp_path / "kept.txt", "wb")
        kept.write(b"\x00\x01")
    finally:
        notes.uninstall()
    assert [(os.path.basename(f["path"]), f["size"]) for _, f in events] == [("once.txt", 6), ("kept.txt", 2)]
    assert (tmp_path / "once.txt").read_text() == "hello\n"
    assert not kept.closed and "write" not in vars(kept)
    kept.close()


def test_the_file_object_is_the_one_open_returned_so_type_checks_repr_and_copy_behave_as_without_the_audit(tmp_path):
    notes, events = _notes()
    notes.install()
    try:
        with open(tmp_path / "t.txt", "w") as text, open(tmp_path / "b.bin", "wb") as binary:
            assert type(text) is io.TextIOWrapper and type(binary) is io.BufferedWriter
            assert repr(text).startswith("<_io.TextIOWrapper name=")
            with open(tmp_path / "raw.bin", "wb", buffering=0) as raw:
                assert isinstance(raw, io.FileIO)
                raw.write(b"abc")
    finally:
        notes.uninstall()
    assert sorted(os.path.basename(f["path"]) for _, f in events) == ["b.bin", "raw.bin", "t.txt"]


def test_a_path_under_any_ranks_folder_of_the_world_is_keyed_as_under_the_shared_working_directory(tmp_path):
    """``trainer.log_dir`` is chosen on rank 0 and broadcast: rank 1 writes under rank 0's folder, which ranks
    launched together share as their working directory."""
    rank1 = str(tmp_path / "world" / "rank1")
    assert path_key(str(tmp_path / "world" / "rank0" / "lightning_logs" / "version_0" / "ids.txt"), rank1) == (
        "./lightning_logs/version_0/ids.txt"
    )
    assert path_key(str(tmp_path / "world" / "other" / "ids.txt"), rank1) == str(
        tmp_path / "world" / "other" / "ids.txt"
    )


def test_a_file_an_installed_package_opens_is_noted_at_the_users_line_that_called_it_and_not_without_one(tmp_path):
    """pandas' ``to_csv(path)`` or fsspec opens the file in site-packages: noted at the user's line that called it,
    and not at all when no user frame is above (Lightning's checkpoint through fsspec)."""
    library = {}
    source = "def save(p):\n    with open(p, 'w') as fh:\n        fh.write('x')\n"
    exec(compile(source, "/v/site-packages/lib/io.py", "exec"), library)
    notes, events = _notes()
    notes.install()
    try:
        line = sys._getframe().f_lineno + 1
        library["save"](tmp_path / "via_library.csv")
    finally:
        notes.uninstall()
    here = sys._getframe().f_code.co_name
    assert [f["call_site"] for _, f in events] == [f"test_trace_files.py:{line} in {here}"]

    def only_installed(frame):  # counts nothing but the installed package as "user": no user frame above it
        while frame is not None and "site-packages" not in frame.f_code.co_filename:
            frame = frame.f_back
        return frame

    events = []
    lone = FileWrites(lambda event, **fields: events.append(fields), only_installed, lambda: None)
    lone.install()
    try:
        library["save"](tmp_path / "checkpoint.ckpt")
    finally:
        lone.uninstall()
    assert events == [] and (tmp_path / "checkpoint.ckpt").read_text() == "x"
